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
//! - **Buffers that are not parameters.** ONNX has no word for "not trainable": every
//!   float initializer looks like a weight. dynamo says which initializers were a
//!   module's buffers (`pkg.torch.export.graph_signature.InputSpec.kind` = `BUFFER` or
//!   `CONSTANT_TENSOR` on the value's metadata), such as Llama's rotary frequencies
//!   (`rotary_emb.inv_freq`), which PyTorch never trains. The load records them
//!   ([`EXPORTED_BUFFERS_KEY`]) and [`constant_buffers`] makes each a constant, so that
//!   they are neither trained nor counted as parameters; BatchNorm's running statistics,
//!   buffers too, stay the state the training step updates. (TorchScript writes such
//!   buffers as constants itself.)

use crate::batch;
use crate::ir::{Attribute, Model, Node, fresh_name};
use std::collections::HashSet;
use tract_onnx::pb;

/// Metadata key: the number of convolutions the exporter marked as holding a folded
/// BatchNorm (dynamo's optimizer), recorded at load, where node metadata is still there.
pub const FOLDED_BATCH_NORMS_KEY: &str = "edgefreeze.folded_batch_norms";

/// Metadata key: the initializers the exporter declared as buffers or constants rather
/// than parameters, one name per line, recorded at load where value metadata is still
/// there.
pub const EXPORTED_BUFFERS_KEY: &str = "edgefreeze.exported_buffers";

/// Metadata key: the float initializers of [`EXPORTED_BUFFERS_KEY`] that the import made
/// constants, one name per line (kept in files edgefreeze writes: it says what of the
/// model's constants were the exporter's initializers).
pub const CONSTANT_BUFFERS_KEY: &str = "edgefreeze.constant_buffers";

/// The value-metadata key dynamo writes for each graph input and initializer.
const INPUT_KIND: &str = "pkg.torch.export.graph_signature.InputSpec.kind";

// tract's ONNX messages predate metadata on nodes and values (`NodeProto.metadata_props`,
// field 9; `ValueInfoProto.metadata_props`, field 4), so the load reads those fields alone
// with messages of its own: a model (graph: 7), its graph (nodes: 1, inputs: 11,
// value_info: 13), a node's or a value's metadata; prost skips everything else by its
// length.
#[derive(Clone, PartialEq, prost::Message)]
struct ModelNodes {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphNodes>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GraphNodes {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeMetadata>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueMetadata>,
    #[prost(message, repeated, tag = "13")]
    value_info: Vec<ValueMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NodeMetadata {
    #[prost(message, repeated, tag = "9")]
    metadata_props: Vec<pb::StringStringEntryProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ValueMetadata {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "4")]
    metadata_props: Vec<pb::StringStringEntryProto>,
}

fn names<'a>(model: &'a Model, key: &str) -> Vec<&'a str> {
    model.metadata_value(key).map(|v| v.lines().filter(|l| !l.is_empty()).collect()).unwrap_or_default()
}

/// The initializers recorded as the exporter's buffers ([`EXPORTED_BUFFERS_KEY`]).
pub fn exported_buffers(model: &Model) -> Vec<&str> {
    names(model, EXPORTED_BUFFERS_KEY)
}

/// The exporter's buffers the import made constants ([`CONSTANT_BUFFERS_KEY`]).
pub fn constant_buffer_names(model: &Model) -> Vec<&str> {
    names(model, CONSTANT_BUFFERS_KEY)
}

/// Makes each floating-point initializer the exporter declared a buffer a `Constant` node,
/// but BatchNorm's running statistics (module doc). Returns their names.
pub fn constant_buffers(model: &mut Model) -> Vec<String> {
    let declared: Vec<String> = exported_buffers(model).into_iter().map(String::from).collect();
    let statistics: HashSet<String> =
        crate::analysis::buffer_names(&model.graph).into_iter().map(String::from).collect();
    let graph = &mut model.graph;
    let mut node_names: HashSet<String> = graph.nodes.iter().map(|n| n.name.clone()).collect();
    let mut made = Vec::new();
    for name in declared {
        let is_float = graph.initializers.get(&name).is_some_and(|t| t.dtype().is_float());
        if !is_float || statistics.contains(&name) {
            continue;
        }
        let Some(value) = graph.initializers.shift_remove(&name) else { continue };
        graph.initializer_inputs.retain(|v| v.name != name);
        let node_name = fresh_name(&mut node_names, &format!("{name}.constant"));
        graph
            .nodes
            .insert(0, Node::new(node_name, "Constant", &[], &[&name]).with_attr("value", Attribute::Tensor(value)));
        made.push(name);
    }
    // An import of a file edgefreeze wrote finds none left and keeps the file's record.
    if !made.is_empty() {
        model.metadata.retain(|(k, _)| k != CONSTANT_BUFFERS_KEY);
        model.metadata.push((CONSTANT_BUFFERS_KEY.into(), made.join("\n")));
    }
    made
}

/// What an exporter marked in an ONNX file's metadata that the IR does not keep.
#[derive(Debug, Default)]
pub(crate) struct ExporterMarks {
    /// Nodes dynamo's optimizer marks as holding a folded BatchNorm.
    pub folds: usize,
    /// Values dynamo declares a buffer or a constant tensor of the module, in file order.
    pub buffers: Vec<String>,
}

/// Reads the marks from an ONNX file's bytes in one decode (none if the bytes do not
/// decode: the real decode reports that).
pub(crate) fn exporter_marks(bytes: &[u8]) -> ExporterMarks {
    use prost::Message;
    let Ok(ModelNodes { graph: Some(graph) }) = ModelNodes::decode(bytes) else { return ExporterMarks::default() };
    let folds = graph
        .node
        .iter()
        .filter(|n| {
            n.metadata_props
                .iter()
                .any(|p| p.key == "pkg.onnxscript.rewriter.rule_name" && p.value.contains("BatchNorm"))
        })
        .count();
    let mut seen = HashSet::new();
    let buffers = graph
        .input
        .into_iter()
        .chain(graph.value_info)
        .filter(|v| {
            v.metadata_props
                .iter()
                .any(|p| p.key == INPUT_KIND && (p.value == "BUFFER" || p.value == "CONSTANT_TENSOR"))
        })
        .filter(|v| seen.insert(v.name.clone()))
        .map(|v| v.name)
        .collect();
    ExporterMarks { folds, buffers }
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
    let constants = constant_buffer_names(model);
    if !constants.is_empty() {
        notes.push(format!(
            "{} initializer{} the exporter declared a module buffer, not a parameter: kept constant and not trained, \
             as in PyTorch ({})",
            constants.len(),
            if constants.len() == 1 { "" } else { "s" },
            constants.join(", ")
        ));
    }
    notes.extend(crate::text_inputs::notes(model));
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
