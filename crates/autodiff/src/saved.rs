//! Which forward values a training graph keeps for its backward pass.
//!
//! An engine frees a value after its last reader runs, so every forward value that a
//! backward node reads stays alive from the forward pass to that node: these values are
//! the step's activation memory. A rule should read only what it needs, and never a whole
//! activation for its shape alone (a `Shape` or `Size` node in the backward keeps its
//! input alive just as a product does); [`saved_for_backward`] lists what a graph keeps,
//! so that tests can hold the rules to that.

use crate::training::LOSS;
use edgefreeze_graph::ir::Graph;
use std::collections::{HashMap, HashSet};

/// A forward value that the backward pass reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedValue {
    /// The value's name.
    pub value: String,
    /// The op type of the forward node that computes it.
    pub producer: String,
    /// The backward nodes that read it, in graph order.
    pub readers: Vec<Reader>,
}

/// A backward node reading a forward value.
#[derive(Debug, Clone, PartialEq)]
pub struct Reader {
    /// Its op type.
    pub op_type: String,
    /// Its name (named after the forward node whose rule emitted it).
    pub node: String,
}

impl SavedValue {
    /// Whether the backward reads this value for its shape or size only.
    pub fn shape_only(&self) -> bool {
        self.readers.iter().all(|r| r.op_type == "Shape" || r.op_type == "Size")
    }
}

/// The forward values of a training graph (those computed by the nodes the `loss`
/// output depends on) that its other nodes (backward, update) read, in graph order.
/// `None` when the graph has no `loss` output.
pub fn saved_for_backward(graph: &Graph) -> Option<Vec<SavedValue>> {
    graph.outputs.iter().find(|o| o.name == LOSS)?;
    let producer: HashMap<&str, usize> =
        graph.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i))).collect();
    // The forward pass: every node the loss depends on.
    let mut forward = HashSet::new();
    let mut stack = vec![LOSS];
    while let Some(value) = stack.pop() {
        if let Some(&i) = producer.get(value)
            && forward.insert(i)
        {
            stack.extend(graph.nodes[i].inputs.iter().map(String::as_str).filter(|s| !s.is_empty()));
        }
    }
    let mut readers: HashMap<&str, Vec<Reader>> = HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if forward.contains(&i) {
            continue;
        }
        for input in &node.inputs {
            if producer.get(input.as_str()).is_some_and(|p| forward.contains(p)) {
                readers
                    .entry(input.as_str())
                    .or_default()
                    .push(Reader { op_type: node.op_type.clone(), node: node.name.clone() });
            }
        }
    }
    let mut saved = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        // Constants are not activations: their memory does not grow with the batch.
        if !forward.contains(&i) || node.op_type == "Constant" {
            continue;
        }
        for output in &node.outputs {
            if let Some(readers) = readers.remove(output.as_str()) {
                saved.push(SavedValue { value: output.clone(), producer: node.op_type.clone(), readers });
            }
        }
    }
    Some(saved)
}
