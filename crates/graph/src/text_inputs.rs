//! The inputs a Hugging Face text model takes beside its token ids, computed in the graph
//! from the ids.
//!
//! A classifier exported the usual way (`torch.onnx.export(model, (input_ids,
//! attention_mask))`, or optimum) takes `attention_mask` and often `token_type_ids` (and
//! sometimes `position_ids`) beside `input_ids`. All three are functions of the ids when
//! texts are padded at the end with a known padding id, as edgefreeze's text datasets
//! are: the mask is 1 where a token is not padding, the token types are 0 (one segment),
//! the positions count from 0 along the sequence. [`derive_from_token_ids`] replaces
//! those inputs with nodes that compute them, so the model takes the token ids alone and
//! trains as any one-input model; the values behind a cut are then input-only values that
//! the part behind recomputes from the ids ([`crate::analysis::Cut::side_inputs`]).

use crate::dtype::DataType;
use crate::error::{GraphError, Result};
use crate::ir::{Attribute, Model, Node};
use crate::tensor::Tensor;

/// Metadata key listing the inputs [`derive_from_token_ids`] computed, comma-separated.
pub const DERIVED_INPUTS_KEY: &str = "edgefreeze.derived_inputs";

/// Metadata key holding the padding id the derived mask compares with.
pub const PADDING_ID_KEY: &str = "edgefreeze.padding_id";

/// Name of the token-ids input.
pub const TOKEN_IDS: &str = "input_ids";

/// How each derivable input is computed from the token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Derived {
    /// 1 where the token is not padding, 0 where it is.
    AttentionMask,
    /// 0 everywhere (one segment).
    TokenTypes,
    /// 0, 1, 2... along the sequence.
    Positions,
}

impl Derived {
    fn of(name: &str) -> Option<Derived> {
        match name {
            "attention_mask" => Some(Derived::AttentionMask),
            "token_type_ids" => Some(Derived::TokenTypes),
            "position_ids" => Some(Derived::Positions),
            _ => None,
        }
    }

    fn describe(self, pad: i64) -> String {
        match self {
            Derived::AttentionMask => format!("1 where the token is not padding (id {pad})"),
            Derived::TokenTypes => "0 (one segment)".into(),
            Derived::Positions => "0, 1, 2... along the sequence".into(),
        }
    }
}

/// What [`derive_from_token_ids`] did to a model, one note per input it computes (from
/// the model's metadata, so a converted model says it too).
pub fn notes(model: &Model) -> Vec<String> {
    let Some(names) = model.metadata_value(DERIVED_INPUTS_KEY) else { return Vec::new() };
    let pad = model.metadata_value(PADDING_ID_KEY).and_then(|p| p.parse().ok()).unwrap_or(0);
    names
        .split(',')
        .filter_map(|name| Derived::of(name).map(|d| (name, d)))
        .map(|(name, d)| format!("input {name:?} is computed from the token ids: {}", d.describe(pad)))
        .collect()
}

/// The model with its `attention_mask`, `token_type_ids` and `position_ids` inputs
/// computed from `input_ids` (texts padded at the end with `pad`), and a note for each;
/// `None` when the model has no such input beside its token ids. An input of the wrong
/// element type or shape is an error naming it; inputs of other names are left as they
/// are.
pub fn derive_from_token_ids(model: &Model, pad: i64) -> Result<Option<(Model, Vec<String>)>> {
    let graph = &model.graph;
    let Some(ids) = graph.inputs.iter().find(|v| v.name == TOKEN_IDS) else { return Ok(None) };
    let derived: Vec<(usize, Derived)> =
        graph.inputs.iter().enumerate().filter_map(|(k, v)| Derived::of(&v.name).map(|d| (k, d))).collect();
    if derived.is_empty() {
        return Ok(None);
    }
    if ids.shape.as_ref().is_none_or(|s| s.len() != 2) {
        return Err(GraphError::Invalid(format!(
            "input {TOKEN_IDS:?} is shaped {:?}, not [batch, sequence]: the inputs beside it cannot be computed from it",
            ids.shape
        )));
    }
    let id_type = ids.dtype;
    if !matches!(id_type, Some(DataType::Int64 | DataType::Int32)) {
        return Err(GraphError::Invalid(format!(
            "input {TOKEN_IDS:?} holds {id_type:?}, not integer token ids: its mask and token types cannot be \
             computed from it"
        )));
    }
    let mut out = model.clone();
    let mut nodes = Vec::new();
    let int = |name: &str, value: i64| {
        Node::new(name, "Constant", &[], &[name]).with_attr(
            "value",
            Attribute::Tensor(Tensor::from_i64_as(id_type.expect("checked"), vec![], &[value]).expect("a scalar")),
        )
    };
    let prefix = "edgefreeze/derived";
    for &(k, kind) in &derived {
        let input = &graph.inputs[k];
        let Some(to) = input.dtype else {
            return Err(GraphError::Invalid(format!("input {:?} has no element type", input.name)));
        };
        if input.shape != ids.shape {
            return Err(GraphError::Invalid(format!(
                "input {:?} is shaped {:?}, the token ids {:?}: it cannot be computed from them",
                input.name, input.shape, ids.shape
            )));
        }
        let n = |what: &str| format!("{prefix}/{}/{what}", input.name);
        let cast = |from: String| {
            Node::new(n("cast"), "Cast", &[&from], &[&input.name])
                .with_attr("to", Attribute::Int(i64::from(to.to_onnx())))
        };
        match kind {
            Derived::AttentionMask => nodes.extend([
                int(&n("pad"), pad),
                Node::new(n("is_pad"), "Equal", &[TOKEN_IDS, &n("pad")], &[&n("is_pad")]),
                Node::new(n("keep"), "Not", &[&n("is_pad")], &[&n("keep")]),
                cast(n("keep")),
            ]),
            Derived::TokenTypes => {
                nodes.extend([Node::new(n("zeros"), "Sub", &[TOKEN_IDS, TOKEN_IDS], &[&n("zeros")]), cast(n("zeros"))])
            }
            Derived::Positions => nodes.extend([
                Node::new(n("zeros"), "Sub", &[TOKEN_IDS, TOKEN_IDS], &[&n("zeros")]),
                int(&n("one"), 1),
                Node::new(n("ones"), "Add", &[&n("zeros"), &n("one")], &[&n("ones")]),
                int(&n("axis"), 1),
                Node::new(n("count"), "CumSum", &[&n("ones"), &n("axis")], &[&n("count")]),
                Node::new(n("from_zero"), "Sub", &[&n("count"), &n("one")], &[&n("from_zero")]),
                cast(n("from_zero")),
            ]),
        }
    }
    let names: Vec<String> = derived.iter().map(|&(k, _)| graph.inputs[k].name.clone()).collect();
    out.graph.inputs.retain(|v| !names.contains(&v.name));
    nodes.append(&mut out.graph.nodes);
    out.graph.nodes = nodes;
    out.metadata.retain(|(k, _)| k != DERIVED_INPUTS_KEY);
    out.metadata.retain(|(k, _)| k != PADDING_ID_KEY);
    out.metadata.push((DERIVED_INPUTS_KEY.into(), names.join(",")));
    out.metadata.push((PADDING_ID_KEY.into(), pad.to_string()));
    let notes = notes(&out);
    crate::sort::sort_topologically(&mut out.graph)?;
    crate::record_types(&mut out)?;
    Ok(Some((out, notes)))
}
