//! What an exporter did to a model that changes what training it means, found at import
//! and told to the user (`inspect`, `convert` and `train` print these notes):
//!
//! - **BatchNorm folded into convolutions.** Both PyTorch exporters do it by default:
//!   TorchScript's constant folding in eval mode (its default mode) writes each
//!   convolution followed by a BatchNorm as one convolution with new weights, named
//!   `onnx::Conv_<n>`; dynamo's optimizer (`optimize=True`, its default) does the same
//!   even to a model in training mode, and marks the convolution with the rewrite rule's
//!   name (`pkg.onnxscript.rewriter.rule_name` = `FuseBatchNormIntoConv`). The file then
//!   holds a network without normalisation; edgefreeze trains it as it is, which is not
//!   the training PyTorch would do, so the user is told how to export the BatchNorms.
//! - **A batch of 1 fixed in the file** ([`crate::batch`]): made variable, or not and why.

use crate::batch;
use crate::ir::Model;
use tract_onnx::pb;

/// Metadata key: the number of convolutions the exporter marked as holding a folded
/// BatchNorm (dynamo's optimizer), recorded at load, where node metadata is still there.
pub const FOLDED_BATCH_NORMS_KEY: &str = "edgefreeze.folded_batch_norms";

// tract's ONNX messages predate node metadata (`NodeProto.metadata_props`, field 9), so
// the load reads that field alone with messages of its own: a model (graph: 7), its graph
// (nodes: 1), a node's metadata; prost skips everything else by its length.
#[derive(Clone, PartialEq, prost::Message)]
struct ModelNodes {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphNodes>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GraphNodes {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NodeMetadata {
    #[prost(message, repeated, tag = "9")]
    metadata_props: Vec<pb::StringStringEntryProto>,
}

/// Counts the nodes of an ONNX file's bytes that dynamo's optimizer marks as holding a
/// folded BatchNorm (0 if the bytes do not decode: the real decode reports that).
pub(crate) fn marked_folds(bytes: &[u8]) -> usize {
    use prost::Message;
    let Ok(model) = ModelNodes::decode(bytes) else { return 0 };
    model
        .graph
        .map(|g| {
            g.node
                .iter()
                .filter(|n| {
                    n.metadata_props
                        .iter()
                        .any(|p| p.key == "pkg.onnxscript.rewriter.rule_name" && p.value.contains("BatchNorm"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// How many BatchNorms the exporter folded into convolutions, and which exporter's way of
/// doing it shows it; `None` when nothing shows a fold.
pub fn folded_batch_norms(model: &Model) -> Option<(usize, &'static str)> {
    let marked: usize = model.metadata_value(FOLDED_BATCH_NORMS_KEY).and_then(|v| v.parse().ok()).unwrap_or(0);
    if marked > 0 {
        return Some((marked, "dynamo"));
    }
    if model.producer_name != "pytorch" {
        return None;
    }
    let renamed = model
        .graph
        .nodes
        .iter()
        .filter(|n| n.op_type == "Conv" && n.input(1).is_some_and(|w| w.starts_with("onnx::Conv_")))
        .count();
    (renamed > 0).then_some((renamed, "TorchScript"))
}

/// The notes on how the model was exported that bear on training it, one sentence each.
pub fn notes(model: &Model) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some((n, exporter)) = folded_batch_norms(model) {
        let (how, fix) = match exporter {
            "dynamo" => (
                "dynamo's optimizer (optimize=True, its default)",
                "torch.onnx.export(model.train(), ..., dynamo=True, optimize=False)",
            ),
            _ => (
                "TorchScript's constant folding in eval mode, its default",
                "torch.onnx.export(model, ..., dynamo=False, training=torch.onnx.TrainingMode.TRAINING, \
                 do_constant_folding=False)",
            ),
        };
        notes.push(format!(
            "{n} convolution{} hold{} a BatchNorm folded into {} at export by {how}: training this file trains the \
             network without those BatchNorms, not as PyTorch trains it. To train them, export with {fix}",
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" },
            if n == 1 { "it" } else { "them" },
        ));
    }
    if batch::exported_batch(model).is_some() {
        notes.push(match batch::batch_fixed_by(model) {
            None => "the file fixes the batch at 1 (exported without a dynamic batch axis); the import made it \
                     variable"
                .to_string(),
            Some(why) => format!(
                "the file fixes the batch at 1 (exported without a dynamic batch axis) and it stays fixed: {why}. \
                 Training needs a re-export with a dynamic batch axis (dynamic_axes for TorchScript, \
                 dynamic_shapes for dynamo)"
            ),
        });
    }
    notes
}
