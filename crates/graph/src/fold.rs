//! Constant folding: replaces computations whose result is known at import time (such as
//! the `Shape → Gather → Unsqueeze → Concat` chains exporters emit) by `Constant` nodes.

use crate::error::Result;
use crate::infer::infer;
use crate::ir::{Attribute, Model, Node};

/// Most folding rounds before giving up on reaching a fixed point.
const MAX_ROUNDS: usize = 8;

/// What folding did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoldReport {
    /// Nodes replaced by constants.
    pub folded: usize,
    /// Nodes removed because nothing used their outputs any more.
    pub removed: usize,
}

/// Folds constant subgraphs to a fixed point (at most a few rounds). Parameters (float
/// initializers) are never folded into other values, so they stay trainable.
pub fn fold_constants(model: &mut Model) -> Result<FoldReport> {
    let opset = model.opset();
    let mut report = FoldReport::default();
    for _ in 0..MAX_ROUNDS {
        let inference = infer(&model.graph, opset)?;
        let mut changed = 0;
        for node in &mut model.graph.nodes {
            if node.op_type == "Constant" || node.outputs.len() != 1 {
                continue;
            }
            let Some(value) = inference.constants.get(&node.outputs[0]) else { continue };
            let mut constant = Node::new(node.name.clone(), "Constant", &[], &[&node.outputs[0]]);
            constant.attributes.insert("value".into(), Attribute::Tensor(value.clone()));
            *node = constant;
            changed += 1;
        }
        let removed = model.graph.remove_dead_nodes();
        report.folded += changed;
        report.removed += removed;
        if changed == 0 && removed == 0 {
            break;
        }
    }
    Ok(report)
}
