//! A model cut in two at a valid cut: the front part (inputs → the activation) and the
//! back part (the activation → the model's output), each an ordinary model.

use crate::batch::BatchForms;
use crate::error::{CrossingRead, Result, RewriteError};
use crate::subgraph::{extract, needed_nodes, value_names};
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
    /// [`ACTIVATION`] and the cut's side inputs → the model's first output, with the back
    /// layers' initializers.
    pub back: Model,
}

/// Cuts `model` after layer `cut`. The back part must read nothing of the front part
/// but the activation and the cut's side inputs, which become graph inputs of the back
/// beside the activation (another data input, or a value computed from the front, is an
/// error naming the node that reads it).
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
    let (source, unresolved) = read_metadata_from_activation(model, &c)?;
    let back = extract(&source, "back", &[(c.tensor.clone(), ACTIVATION.to_string())], &[(output.clone(), output)])?;
    // A shape read the rewrite could not rebuild matters only where the back needs it.
    let in_back: HashSet<&str> = back.graph.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut reads: Vec<CrossingRead> = unresolved.into_iter().filter(|r| in_back.contains(r.node.as_str())).collect();
    // The back is given the cut's side inputs; any other data input it reads crosses.
    let data: Vec<&str> =
        model.graph.inputs.iter().map(|v| v.name.as_str()).filter(|v| !c.side_inputs.iter().any(|s| s == v)).collect();
    if reads.is_empty() {
        for input in back.graph.inputs.iter().filter(|v| data.contains(&v.name.as_str())) {
            for node in back.graph.nodes.iter().filter(|n| n.inputs.contains(&input.name)) {
                reads.push(CrossingRead { node: node.name.clone(), value: input.name.clone() });
            }
        }
    }
    if !reads.is_empty() {
        return Err(RewriteError::CrossesCut { cut, reads });
    }
    let (mut front, mut back) = (front, back);
    // An activation dimension inference lost (`[?, 1, 1, 16]` after a `view`) is named by
    // its batch form, so the activation's gradient, typed like it, has a shape too.
    if let Some(forms) = BatchForms::of(model) {
        let ports = front.graph.outputs.iter_mut().chain(back.graph.inputs.iter_mut());
        for port in ports.filter(|v| v.name == ACTIVATION) {
            for (k, d) in port.shape.iter_mut().flatten().enumerate() {
                if *d == Dim::Unknown
                    && let Some(named) = forms.named(&c.tensor, k)
                {
                    *d = named;
                }
            }
        }
    }
    Ok(Parts { analysis, cut: c, front, back })
}

/// The model with every read of only the shape or element type of a front value (by
/// `Shape` or `CastLike`: exporters compute batch sizes so) rewritten for the back part
/// to read the activation instead, so the back needs nothing else from the front: a
/// `Shape` is rebuilt from the activation's runtime shape and fixed dimensions, a
/// `CastLike` becomes a `Cast`. Front nodes computing on such shapes that the back also
/// reads are copied for the back, so the front's own nodes stay as they are.
///
/// A dimension is rebuilt as a constant when it is fixed, from the activation's shape
/// when it is one of the activation's symbols, and otherwise from its [`BatchForms`]
/// (`a·B + c` of the batch, which the activation's shape gives): exporters reshape
/// attention heads to `B·heads` and windows to `B·windows`, which symbolic inference
/// cannot name. A `Shape` it cannot rebuild is left reading the front value and
/// returned, so the caller reports it where the back needs it.
fn read_metadata_from_activation(model: &Model, cut: &Cut) -> Result<(Model, Vec<CrossingRead>)> {
    let graph = &model.graph;
    let types = infer(graph, model.opset())?;
    let forms = BatchForms::of(model);
    let mut unresolved = Vec::new();
    let (front, _) = needed_nodes(graph, [cut.tensor.as_str()], &HashSet::new());
    // Values that depend on the data through more than its shape and type.
    let mut data: HashSet<String> = graph.inputs.iter().map(|v| v.name.clone()).collect();
    for node in &graph.nodes {
        let reads = node.inputs.iter().enumerate().any(|(k, v)| data.contains(v) && !is_metadata_input(node, k));
        if reads {
            data.extend(node.outputs.iter().filter(|o| !o.is_empty()).cloned());
        }
    }
    // The back recomputes what it needs of the side inputs and values computed from them
    // alone, so reading their shapes is no read of the front.
    let input_only = edgefreeze_graph::analysis::input_only_values(graph);
    let recomputed = |v: &str| input_only.get(v).is_some_and(|roots| roots.iter().all(|r| cut.side_inputs.contains(r)));
    let front_data: HashSet<&str> = graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| front[*i])
        .flat_map(|(_, n)| n.outputs.iter())
        .chain(graph.inputs.iter().map(|v| &v.name))
        .filter(|v| data.contains(*v) && **v != cut.tensor && !recomputed(v))
        .map(String::as_str)
        .collect();
    let reads_front_metadata = |node: &Node| {
        node.inputs.iter().enumerate().any(|(k, v)| is_metadata_input(node, k) && front_data.contains(v.as_str()))
    };
    let mut taken: HashSet<String> = value_names(graph).into_iter().map(String::from).collect();
    taken.extend(graph.nodes.iter().map(|n| n.name.clone()));
    let mut fresh = |hint: String| edgefreeze_graph::ir::fresh_name(&mut taken, &hint);
    // Front values computed from front shapes, and their copies for the back.
    let mut copies: HashMap<String, String> = HashMap::new();
    let mut out = model.clone();
    out.graph.nodes.clear();
    for (i, node) in graph.nodes.iter().enumerate() {
        let produces_data = node.outputs.iter().any(|o| data.contains(o));
        if front[i] {
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
            let known = Known { front: &front_data, types: &types, forms: forms.as_ref(), cut };
            out.graph.nodes.extend(read_activation_metadata(copy, &known, &mut fresh, &mut unresolved)?);
        } else {
            let mut node = node.clone();
            rename_inputs(&mut node, &copies);
            let known = Known { front: &front_data, types: &types, forms: forms.as_ref(), cut };
            out.graph.nodes.extend(read_activation_metadata(node, &known, &mut fresh, &mut unresolved)?);
        }
    }
    // A rebuilt Shape reads the activation, which may come after it in the model's order.
    edgefreeze_graph::sort::sort_topologically(&mut out.graph)?;
    Ok((out, unresolved))
}

/// What the rewrite of a metadata read knows: the front's data values, the model's
/// inferred types, the batch forms (when the model has them) and the cut.
struct Known<'a> {
    front: &'a HashSet<&'a str>,
    types: &'a Inference,
    forms: Option<&'a BatchForms>,
    cut: &'a Cut,
}

fn rename_inputs(node: &mut Node, renames: &HashMap<String, String>) {
    for v in node.inputs.iter_mut() {
        if let Some(r) = renames.get(v) {
            *v = r.clone();
        }
    }
}

/// `node`, or, where it reads the shape or type of a front value, its rewrite that reads
/// the activation's.
///
/// A read it cannot rewrite stays as it is and is added to `unresolved`.
fn read_activation_metadata(
    node: Node,
    known: &Known,
    fresh: &mut impl FnMut(String) -> String,
    unresolved: &mut Vec<CrossingRead>,
) -> Result<Vec<Node>> {
    let front = known.front;
    match node.op_type.as_str() {
        "Shape" if node.input(0).is_some_and(|v| front.contains(v)) => {
            match shape_from_activation(&node, known, fresh)? {
                Some(nodes) => Ok(nodes),
                None => {
                    let value = node.input(0).unwrap_or_default().to_string();
                    unresolved.push(CrossingRead { node: node.name.clone(), value });
                    Ok(vec![node])
                }
            }
        }
        "CastLike" if node.input(1).is_some_and(|v| front.contains(v)) => {
            let like = node.input(1).unwrap_or_default();
            let Some(dtype) = known.types.typed(like).map(|(d, _)| d) else {
                unresolved.push(CrossingRead { node: node.name.clone(), value: like.to_string() });
                return Ok(vec![node]);
            };
            let mut cast = Node::new(node.name.clone(), "Cast", &[node.input(0).unwrap_or_default()], &[]);
            cast.outputs = node.outputs.clone();
            cast.attributes.insert("to".into(), Attribute::Int(dtype.to_onnx() as i64));
            Ok(vec![cast])
        }
        _ => Ok(vec![node]),
    }
}

/// `Shape(v)` for a front value `v`, computed from the activation's runtime shape, or
/// `None` when a dimension of `v` is neither fixed, nor one of the activation's symbols,
/// nor affine in the batch with the batch readable from the activation.
fn shape_from_activation(
    node: &Node,
    known: &Known,
    fresh: &mut impl FnMut(String) -> String,
) -> Result<Option<Vec<Node>>> {
    let cut = known.cut;
    let value = node.input(0).unwrap_or_default();
    let Some(shape) = known.types.typed(value).map(|(_, s)| s.clone()) else { return Ok(None) };
    let rank = shape.len() as i64;
    let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
    let start = clamp(node.attr_int("start", 0)?);
    let end = clamp(node.attr_int("end", rank)?);
    let mut nodes = Vec::new();
    let activation_shape = fresh(format!("{}/activation_shape", node.name));
    nodes.push(Node::new(fresh(format!("{}/Shape", node.name)), "Shape", &[&cut.tensor], &[&activation_shape]));
    // The batch, read from the activation once, on first need.
    let mut batch: Option<String> = None;
    let mut parts = Vec::new();
    for (axis, dim) in shape.iter().enumerate().take(end.max(start)).skip(start) {
        let symbol_axis = match dim {
            Dim::Symbol(_) => cut.shape.iter().position(|d| d == dim),
            Dim::Fixed(_) | Dim::Unknown => None,
        };
        let part = match (dim, symbol_axis) {
            (Dim::Fixed(n), _) => int_constant(node, &mut nodes, fresh, *n as i64)?,
            (_, Some(k)) => gather(node, &mut nodes, fresh, &activation_shape, k)?,
            (Dim::Symbol(_) | Dim::Unknown, None) => {
                let Some((a, c)) = known.forms.and_then(|f| f.dim(value, axis)) else { return Ok(None) };
                if a == 0 {
                    int_constant(node, &mut nodes, fresh, c)?
                } else {
                    let b = match &batch {
                        Some(b) => b.clone(),
                        None => {
                            let Some(b) = batch_from_activation(node, known, &mut nodes, fresh, &activation_shape)?
                            else {
                                return Ok(None);
                            };
                            batch = Some(b.clone());
                            b
                        }
                    };
                    int_chain(node, &mut nodes, fresh, &b, &[("Mul", a), ("Add", c)])?
                }
            }
        };
        parts.push(part);
    }
    let output = node.output(0).unwrap_or_default();
    if parts.is_empty() {
        // The shape of a scalar.
        let empty = Tensor::from_i64(vec![0], &[])?;
        nodes.push(
            Node::new(node.name.clone(), "Constant", &[], &[output]).with_attr("value", Attribute::Tensor(empty)),
        );
        return Ok(Some(nodes));
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    nodes.push(Node::new(node.name.clone(), "Concat", &refs, &[output]).with_attr("axis", Attribute::Int(0)));
    Ok(Some(nodes))
}

/// The batch as a 1-element int64 tensor, from the activation dimension `a·B + c` with
/// the smallest `a` (the batch itself where the activation has it), or `None` when no
/// dimension of the activation depends on the batch.
fn batch_from_activation(
    node: &Node,
    known: &Known,
    nodes: &mut Vec<Node>,
    fresh: &mut dyn FnMut(String) -> String,
    activation_shape: &str,
) -> Result<Option<String>> {
    let Some(forms) = known.forms else { return Ok(None) };
    let best = (0..known.cut.shape.len())
        .filter_map(|k| forms.dim(&known.cut.tensor, k).map(|f| (k, f)))
        .filter(|(_, (a, _))| *a > 0)
        .min_by_key(|(_, (a, c))| (*a, c.abs()));
    let Some((k, (a, c))) = best else { return Ok(None) };
    let dim = gather(node, nodes, fresh, activation_shape, k)?;
    // B = (dim − c) / a, exact: the dimension is a·B + c.
    Ok(Some(int_chain(node, nodes, fresh, &dim, &[("Sub", c), ("Div", a)])?))
}

/// Element `axis` of the shape vector `shape`, as a 1-element tensor.
fn gather(
    node: &Node,
    nodes: &mut Vec<Node>,
    fresh: &mut dyn FnMut(String) -> String,
    shape: &str,
    axis: usize,
) -> Result<String> {
    let index = int_constant(node, nodes, fresh, axis as i64)?;
    let part = fresh(format!("{}/dim", node.name));
    nodes.push(
        Node::new(fresh(format!("{}/Gather", node.name)), "Gather", &[shape, &index], &[&part])
            .with_attr("axis", Attribute::Int(0)),
    );
    Ok(part)
}

/// A 1-element int64 constant.
fn int_constant(node: &Node, nodes: &mut Vec<Node>, fresh: &mut dyn FnMut(String) -> String, v: i64) -> Result<String> {
    let name = fresh(format!("{}/k", node.name));
    nodes.push(
        Node::new(fresh(format!("{}/Constant", node.name)), "Constant", &[], &[&name])
            .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![1], &[v])?)),
    );
    Ok(name)
}

/// `op(x, k)` for a 1-element int64 constant `k`.
fn binary(
    node: &Node,
    nodes: &mut Vec<Node>,
    fresh: &mut dyn FnMut(String) -> String,
    op: &str,
    x: &str,
    k: i64,
) -> Result<String> {
    let k = int_constant(node, nodes, fresh, k)?;
    let out = fresh(format!("{}/{op}_output", node.name));
    nodes.push(Node::new(fresh(format!("{}/{op}", node.name)), op, &[x, &k], &[&out]));
    Ok(out)
}

/// `x` through `ops` in order, each `(op, k)` an `op(·, k)` of a 1-element int64
/// constant `k`; identities (`Mul`/`Div` by 1, `Add`/`Sub` of 0) are left out.
fn int_chain(
    node: &Node,
    nodes: &mut Vec<Node>,
    fresh: &mut dyn FnMut(String) -> String,
    x: &str,
    ops: &[(&str, i64)],
) -> Result<String> {
    let mut v = x.to_string();
    for &(op, k) in ops {
        let identity = if matches!(op, "Mul" | "Div") { k == 1 } else { k == 0 };
        if !identity {
            v = binary(node, nodes, fresh, op, &v, k)?;
        }
    }
    Ok(v)
}
