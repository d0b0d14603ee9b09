//! Undoing exporter deduplication of parameters.
//!
//! PyTorch's TorchScript exporter stores two initializers with equal values once and
//! feeds the second through an `Identity` node (a fresh BatchNorm's bias and running
//! mean are both zeros, say). For inference that is harmless; for training it would tie
//! parameters that are distinct. This pass gives each such value its own initializer.

use crate::ir::Graph;

/// Replaces every `Identity` of a floating-point initializer that other nodes also read
/// directly (the exporter's pattern) by an initializer of its own, named after the
/// Identity's output. Returns how many were untied.
pub fn untie_identity_initializers(graph: &mut Graph) -> usize {
    let outputs: std::collections::HashSet<String> = graph.outputs.iter().map(|v| v.name.clone()).collect();
    let read_directly: std::collections::HashSet<String> =
        graph.nodes.iter().filter(|n| n.op_type != "Identity").flat_map(|n| n.inputs.iter().cloned()).collect();
    let mut untied = Vec::new();
    graph.nodes.retain(|node| {
        let source = match (node.op_type.as_str(), node.domain.as_str(), node.input(0), node.output(0)) {
            ("Identity", "", Some(input), Some(output)) if !outputs.contains(output) => {
                (input.to_string(), output.to_string())
            }
            _ => return true,
        };
        match graph.initializers.get(&source.0) {
            Some(t) if t.dtype().is_float() && read_directly.contains(&source.0) => {
                untied.push((source.1, t.clone()));
                false
            }
            _ => true,
        }
    });
    let count = untied.len();
    for (name, tensor) in untied {
        graph.value_info.shift_remove(&name);
        graph.initializers.insert(name, tensor);
    }
    count
}
