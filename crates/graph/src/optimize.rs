//! Graph clean-up passes: merging common subexpressions and removing dead nodes.

use crate::ir::{Attribute, Graph};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// Merges nodes that compute the same op on the same inputs with the same attributes
/// (constants with equal values included), repeatedly through the sorted graph. Nodes
/// producing graph outputs are kept. Returns how many nodes were merged away.
pub fn merge_common_subexpressions(graph: &mut Graph) -> usize {
    let outputs: HashSet<String> = graph.outputs.iter().map(|v| v.name.clone()).collect();
    let mut rename: HashMap<String, String> = HashMap::new();
    let mut seen: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut keep = vec![true; graph.nodes.len()];
    #[allow(clippy::needless_range_loop)] // nodes are read and rewritten by index
    for i in 0..graph.nodes.len() {
        for input in graph.nodes[i].inputs.iter_mut() {
            if let Some(r) = rename.get(input) {
                *input = r.clone();
            }
        }
        let node = &graph.nodes[i];
        if node.outputs.iter().any(|o| outputs.contains(o)) || node.outputs.iter().any(String::is_empty) {
            continue;
        }
        let key = node_key(node);
        let candidates = seen.entry(key).or_default();
        let twin = candidates.iter().copied().find(|&j| {
            let other = &graph.nodes[j];
            other.op_type == node.op_type
                && other.domain == node.domain
                && other.inputs == node.inputs
                && other.attributes == node.attributes
                && other.outputs.len() == node.outputs.len()
        });
        match twin {
            Some(j) => {
                for (mine, theirs) in graph.nodes[i].outputs.iter().zip(&graph.nodes[j].outputs) {
                    rename.insert(mine.clone(), theirs.clone());
                }
                keep[i] = false;
            }
            None => candidates.push(i),
        }
    }
    let merged = keep.iter().filter(|k| !**k).count();
    let mut index = 0;
    graph.nodes.retain(|_| {
        index += 1;
        keep[index - 1]
    });
    for v in graph.value_info.keys().cloned().collect::<Vec<_>>() {
        if rename.contains_key(&v) {
            graph.value_info.shift_remove(&v);
        }
    }
    merged
}

fn node_key(node: &crate::ir::Node) -> u64 {
    let mut h = DefaultHasher::new();
    node.op_type.hash(&mut h);
    node.domain.hash(&mut h);
    node.inputs.hash(&mut h);
    for (name, value) in &node.attributes {
        name.hash(&mut h);
        match value {
            Attribute::Float(f) => f.to_bits().hash(&mut h),
            Attribute::Int(i) => i.hash(&mut h),
            Attribute::String(s) => s.hash(&mut h),
            Attribute::Tensor(t) => {
                t.dtype().to_onnx().hash(&mut h);
                t.dims().hash(&mut h);
                t.raw_bytes().hash(&mut h);
            }
            Attribute::Floats(v) => v.iter().for_each(|f| f.to_bits().hash(&mut h)),
            Attribute::Ints(v) => v.hash(&mut h),
            Attribute::Strings(v) => v.hash(&mut h),
            Attribute::Other(_) => "other".hash(&mut h),
        }
    }
    h.finish()
}
