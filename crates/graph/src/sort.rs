//! Topological sorting: an unsorted graph is sorted on load instead of being rejected.

use crate::error::{GraphError, Result};
use crate::ir::Graph;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

/// Sorts the nodes so that every node comes after the producers of its inputs.
///
/// Among nodes that are ready at the same time the original order is kept, so an already
/// sorted graph is left unchanged. Fails on a cycle, naming its nodes, and on an input that
/// nothing produces, naming the node that reads it.
pub fn sort_topologically(graph: &mut Graph) -> Result<()> {
    let available: HashSet<&str> = graph
        .inputs
        .iter()
        .chain(graph.initializer_inputs.iter())
        .map(|v| v.name.as_str())
        .chain(graph.initializers.keys().map(String::as_str))
        .collect();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        for out in node.outputs.iter().filter(|o| !o.is_empty()) {
            if producer.insert(out.as_str(), i).is_some() {
                return Err(GraphError::node(node, format!("output {out:?} is produced by more than one node")));
            }
            if available.contains(out.as_str()) {
                return Err(GraphError::node(
                    node,
                    format!("output {out:?} has the name of a graph input or initializer"),
                ));
            }
        }
    }
    let n = graph.nodes.len();
    let mut waiting = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut seen = HashSet::new();
        for input in node.inputs.iter().filter(|s| !s.is_empty()) {
            if available.contains(input.as_str()) {
                continue;
            }
            match producer.get(input.as_str()) {
                Some(&p) => {
                    if seen.insert(p) {
                        waiting[i] += 1;
                        dependents[p].push(i);
                    }
                }
                None => {
                    return Err(GraphError::MissingValue {
                        node: node.name.clone(),
                        op_type: node.op_type.clone(),
                        value: input.clone(),
                    });
                }
            }
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n).filter(|&i| waiting[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &d in &dependents[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push(Reverse(d));
            }
        }
    }
    if order.len() < n {
        let placed: HashSet<usize> = order.iter().copied().collect();
        let stuck = (0..n).filter(|i| !placed.contains(i)).map(|i| graph.nodes[i].name.clone()).collect();
        return Err(GraphError::Cycle(stuck));
    }
    if order.iter().enumerate().any(|(pos, &i)| pos != i) {
        let mut slots: Vec<Option<crate::ir::Node>> = std::mem::take(&mut graph.nodes).into_iter().map(Some).collect();
        graph.nodes = order.into_iter().map(|i| slots[i].take().expect("each node is placed once")).collect();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::ir::{Dim, Node, ValueInfo};

    fn graph(nodes: Vec<Node>) -> Graph {
        Graph {
            nodes,
            inputs: vec![ValueInfo::new("x", DataType::Float32, vec![Dim::Fixed(2)])],
            outputs: vec![ValueInfo::new("z", DataType::Float32, vec![Dim::Fixed(2)])],
            ..Default::default()
        }
    }

    #[test]
    fn reversed_graph_is_sorted() {
        let mut g = graph(vec![Node::new("b", "Relu", &["y"], &["z"]), Node::new("a", "Relu", &["x"], &["y"])]);
        sort_topologically(&mut g).unwrap();
        let names: Vec<_> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn cycle_is_reported_with_its_nodes() {
        let mut g = graph(vec![Node::new("a", "Add", &["x", "z"], &["y"]), Node::new("b", "Relu", &["y"], &["z"])]);
        let err = sort_topologically(&mut g).unwrap_err().to_string();
        assert!(err.contains("cycle") && err.contains("\"a\"") && err.contains("\"b\""), "{err}");
    }

    #[test]
    fn missing_input_names_the_node() {
        let mut g = graph(vec![Node::new("a", "Add", &["x", "nowhere"], &["z"])]);
        let err = sort_topologically(&mut g).unwrap_err().to_string();
        assert!(err.contains("\"a\"") && err.contains("nowhere"), "{err}");
    }
}
