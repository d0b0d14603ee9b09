//! A model cut in two at a valid cut: the front part (inputs → the activation) and the
//! back part (the activation → the model's output), each an ordinary model.

use crate::error::{Result, RewriteError};
use crate::subgraph::{extract, value_names};
use edgefreeze_graph::Tensor;
use edgefreeze_graph::analysis::{Analysis, Cut, analyse, is_metadata_input};
use edgefreeze_graph::infer::{Inference, infer};
use edgefreeze_graph::ir::{Attribute, Dim, Model, Node};
use std::collections::{HashMap, HashSet};

/// Name of the activation at the cut: the front part's output and the back part's input.
pub fn activation_name() -> &'static str {
    ACTIVATION
}

/// See [`activation_name`].
pub const ACTIVATION: &str = "activation";

/// The valid cut `cut` (the boundary after layer `cut`) of an analysis, or an error that
/// lists the valid cuts.
pub fn find_cut(analysis: &Analysis, cut: usize) -> Result<&Cut> {
    analysis
        .cuts
        .iter()
        .find(|c| c.after_layer == cut)
        .ok_or_else(|| RewriteError::Cut { cut, valid: analysis.cuts.iter().map(|c| c.after_layer).collect() })
}

/// A model cut in two.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The layer analysis of the whole model.
    pub analysis: Analysis,
    /// The cut.
    pub cut: Cut,
    /// The model's data inputs → [`ACTIVATION`], with the front layers' initializers.
    pub front: Model,
    /// [`ACTIVATION`] → the model's first output, with the back layers' initializers.
    pub back: Model,
}

/// Cuts `model` after layer `cut`. The back part must read nothing of the front part
/// but the activation (a data input, or a value computed from one, is an error naming
/// the node that reads it).
pub fn cut_model(model: &Model, cut: usize) -> Result<Parts> {
    let analysis = analyse(model)?;
    let c = find_cut(&analysis, cut)?.clone();
    let output = model
        .graph
        .outputs
        .first()
        .map(|v| v.name.clone())
        .ok_or_else(|| RewriteError::NoValue("the model's output".into()))?;
    let front = extract(model, "front", &[], &[(c.tensor.clone(), ACTIVATION.to_string())])?;
    let source = read_metadata_from_activation(model, &c)?;
    let back = extract(&source, "back", &[(c.tensor.clone(), ACTIVATION.to_string())], &[(output.clone(), output)])?;
    let data: Vec<&str> = model.graph.inputs.iter().map(|v| v.name.as_str()).collect();
    if let Some(input) = back.graph.inputs.iter().find(|v| data.contains(&v.name.as_str())) {
        let node = back.graph.nodes.iter().find(|n| n.inputs.contains(&input.name)).map(|n| n.name.clone());
        return Err(RewriteError::CrossesCut { cut, node: node.unwrap_or_default(), value: input.name.clone() });
    }
    Ok(Parts { analysis, cut: c, front, back })
}

/// The model with every read of only the shape or element type of a front value (by
/// `Shape` or `CastLike`: exporters compute batch sizes so) rewritten for the back part
/// to read the activation instead, so the back needs nothing else from the front: a
/// `Shape` is rebuilt from the activation's runtime shape and fixed dimensions, a
/// `CastLike` becomes a `Cast`. Front nodes computing on such shapes that the back also
/// reads are copied for the back, so the front's own nodes stay as they are. A
/// dimension that is neither fixed nor one of the activation's is an error.
fn read_metadata_from_activation(model: &Model, cut: &Cut) -> Result<Model> {
    let graph = &model.graph;
    let types = infer(graph, model.opset())?;
    let front = front_nodes(model, &cut.tensor);
    // Values that depend on the data through more than its shape and type.
    let mut data: HashSet<String> = graph.inputs.iter().map(|v| v.name.clone()).collect();
    for node in &graph.nodes {
        let reads = node.inputs.iter().enumerate().any(|(k, v)| data.contains(v) && !is_metadata_input(node, k));
        if reads {
            data.extend(node.outputs.iter().filter(|o| !o.is_empty()).cloned());
        }
    }
    let front_data: HashSet<&str> = graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| front.contains(i))
        .flat_map(|(_, n)| n.outputs.iter())
        .chain(graph.inputs.iter().map(|v| &v.name))
        .filter(|v| data.contains(*v) && **v != cut.tensor)
        .map(String::as_str)
        .collect();
    let reads_front_metadata = |node: &Node| {
        node.inputs.iter().enumerate().any(|(k, v)| is_metadata_input(node, k) && front_data.contains(v.as_str()))
    };
    let mut taken: HashSet<String> = value_names(graph).into_iter().map(String::from).collect();
    taken.extend(graph.nodes.iter().map(|n| n.name.clone()));
    let mut fresh = |hint: String| {
        let mut name = hint.clone();
        let mut k = 1;
        while taken.contains(&name) {
            name = format!("{hint}_{k}");
            k += 1;
        }
        taken.insert(name.clone());
        name
    };
    // Front values computed from front shapes, and their copies for the back.
    let mut copies: HashMap<String, String> = HashMap::new();
    let mut out = model.clone();
    out.graph.nodes.clear();
    for (i, node) in graph.nodes.iter().enumerate() {
        let produces_data = node.outputs.iter().any(|o| data.contains(o));
        if front.contains(&i) {
            out.graph.nodes.push(node.clone());
            if produces_data || !(reads_front_metadata(node) || node.inputs.iter().any(|v| copies.contains_key(v))) {
                continue;
            }
            let mut copy = node.clone();
            copy.name = fresh(format!("{}/back", node.name));
            for o in copy.outputs.iter_mut().filter(|o| !o.is_empty()) {
                let name = fresh(format!("{o}/back"));
                copies.insert(o.clone(), name.clone());
                *o = name;
            }
            rename_inputs(&mut copy, &copies);
            out.graph.nodes.extend(read_activation_metadata(copy, &front_data, &types, cut, &mut fresh)?);
        } else {
            let mut node = node.clone();
            rename_inputs(&mut node, &copies);
            out.graph.nodes.extend(read_activation_metadata(node, &front_data, &types, cut, &mut fresh)?);
        }
    }
    // A rebuilt Shape reads the activation, which may come after it in the model's order.
    edgefreeze_graph::sort::sort_topologically(&mut out.graph)?;
    Ok(out)
}

fn rename_inputs(node: &mut Node, renames: &HashMap<String, String>) {
    for v in node.inputs.iter_mut() {
        if let Some(r) = renames.get(v) {
            *v = r.clone();
        }
    }
}

/// Indices of the nodes the value `value` depends on.
fn front_nodes(model: &Model, value: &str) -> HashSet<usize> {
    let mut needed: HashSet<&str> = HashSet::from([value]);
    let mut nodes = HashSet::new();
    for (i, node) in model.graph.nodes.iter().enumerate().rev() {
        if node.outputs.iter().any(|o| needed.contains(o.as_str())) {
            nodes.insert(i);
            needed.extend(node.inputs.iter().map(String::as_str).filter(|s| !s.is_empty()));
        }
    }
    nodes
}

/// `node`, or, where it reads the shape or type of a front value, its rewrite that reads
/// the activation's.
fn read_activation_metadata(
    node: Node,
    front: &HashSet<&str>,
    types: &Inference,
    cut: &Cut,
    fresh: &mut impl FnMut(String) -> String,
) -> Result<Vec<Node>> {
    match node.op_type.as_str() {
        "Shape" if node.input(0).is_some_and(|v| front.contains(v)) => shape_from_activation(&node, types, cut, fresh),
        "CastLike" if node.input(1).is_some_and(|v| front.contains(v)) => {
            let like = node.input(1).unwrap_or_default();
            let dtype = types.typed(like).map(|(d, _)| d).ok_or_else(|| crosses(cut, &node, like))?;
            let mut cast = Node::new(node.name.clone(), "Cast", &[node.input(0).unwrap_or_default()], &[]);
            cast.outputs = node.outputs.clone();
            cast.attributes.insert("to".into(), Attribute::Int(dtype.to_onnx() as i64));
            Ok(vec![cast])
        }
        _ => Ok(vec![node]),
    }
}

fn crosses(cut: &Cut, node: &Node, value: &str) -> RewriteError {
    RewriteError::CrossesCut { cut: cut.after_layer, node: node.name.clone(), value: value.to_string() }
}

/// `Shape(v)` for a front value `v`, computed from the activation's runtime shape.
fn shape_from_activation(
    node: &Node,
    types: &Inference,
    cut: &Cut,
    fresh: &mut impl FnMut(String) -> String,
) -> Result<Vec<Node>> {
    let value = node.input(0).unwrap_or_default();
    let shape = types.typed(value).map(|(_, s)| s.clone()).ok_or_else(|| crosses(cut, node, value))?;
    let rank = shape.len() as i64;
    let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
    let start = clamp(node.attr_int("start", 0)?);
    let end = clamp(node.attr_int("end", rank)?);
    let mut nodes = Vec::new();
    let activation_shape = fresh(format!("{}/activation_shape", node.name));
    nodes.push(Node::new(fresh(format!("{}/Shape", node.name)), "Shape", &[&cut.tensor], &[&activation_shape]));
    let mut parts = Vec::new();
    for dim in shape.get(start..end.max(start)).unwrap_or_default() {
        let part = fresh(format!("{}/dim", node.name));
        match dim {
            Dim::Fixed(n) => {
                let t = Tensor::from_i64(vec![1], &[*n as i64])?;
                nodes.push(
                    Node::new(fresh(format!("{}/Constant", node.name)), "Constant", &[], &[&part])
                        .with_attr("value", Attribute::Tensor(t)),
                );
            }
            Dim::Symbol(_) => {
                let axis = cut.shape.iter().position(|d| d == dim).ok_or_else(|| crosses(cut, node, value))? as i64;
                let index = fresh(format!("{}/axis", node.name));
                nodes.push(
                    Node::new(fresh(format!("{}/Constant", node.name)), "Constant", &[], &[&index])
                        .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![1], &[axis])?)),
                );
                nodes.push(
                    Node::new(fresh(format!("{}/Gather", node.name)), "Gather", &[&activation_shape, &index], &[&part])
                        .with_attr("axis", Attribute::Int(0)),
                );
            }
            Dim::Unknown => return Err(crosses(cut, node, value)),
        }
        parts.push(part);
    }
    let output = node.output(0).unwrap_or_default();
    if parts.is_empty() {
        // The shape of a scalar.
        let empty = Tensor::from_i64(vec![0], &[])?;
        nodes.push(
            Node::new(node.name.clone(), "Constant", &[], &[output]).with_attr("value", Attribute::Tensor(empty)),
        );
        return Ok(nodes);
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    nodes.push(Node::new(node.name.clone(), "Concat", &refs, &[output]).with_attr("axis", Attribute::Int(0)));
    Ok(nodes)
}
