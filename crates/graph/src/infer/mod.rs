//! Shape and dtype inference for every supported op, with constant evaluation and
//! symbolic propagation of shape values (`Shape → Gather → Concat → Reshape` chains).

mod broadcast;
pub(crate) mod elementwise;
pub(crate) mod eval;
pub(crate) mod layout;
pub(crate) use resize::constant_scales_for_symbolic_sizes;
pub use resize::{ResizeAxis, resize_axes, resize_axes_of};
pub(crate) mod linear;
mod resize;
pub(crate) mod spatial;

pub use broadcast::{broadcast_dims, broadcast_index_map, broadcast_shapes, merge_dims};
pub use layout::slice_bounds;
pub use spatial::Window;

use crate::dtype::DataType;
use crate::error::{GraphError, Result};
use crate::ir::{Dim, Graph, Node, Shape, ValueInfo, fixed_shape};
use crate::ops::spec;
use crate::tensor::Tensor;
use std::collections::HashMap;

/// Largest tensor (in elements) that inference evaluates as a constant.
pub const MAX_FOLDED_ELEMENTS: usize = 1 << 16;

/// An integer whose value may be known, a named symbol, or unknown: the elements of a
/// shape tensor whose dimensions are partly symbolic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymInt {
    /// A known value.
    Known(i64),
    /// A named symbol (a symbolic dimension such as the batch).
    Symbol(String),
    /// Unknown.
    Unknown,
}

impl SymInt {
    fn from_dim(d: &Dim) -> SymInt {
        match d {
            Dim::Fixed(n) => SymInt::Known(*n as i64),
            Dim::Symbol(s) => SymInt::Symbol(s.clone()),
            Dim::Unknown => SymInt::Unknown,
        }
    }
}

/// What inference learned about a graph.
#[derive(Debug, Default, Clone)]
pub struct Inference {
    /// Type and shape of every value, by name.
    pub types: HashMap<String, ValueInfo>,
    /// Values known at import time: constants and what can be computed from them.
    pub constants: HashMap<String, Tensor>,
    /// Rank-0/1 integer values known element by element, possibly symbolically.
    pub symbolic: HashMap<String, Vec<SymInt>>,
}

impl Inference {
    /// The dtype and shape of a value, when both are known.
    pub fn typed(&self, name: &str) -> Option<(DataType, &Shape)> {
        let v = self.types.get(name)?;
        Some((v.dtype?, v.shape.as_ref()?))
    }
}

/// Infers the type and shape of every value of a sorted graph.
///
/// Constants seeded into evaluation are `Constant` nodes and non-float initializers;
/// float initializers are parameters and are never folded into other values.
pub fn infer(graph: &Graph, opset: i64) -> Result<Inference> {
    infer_prefix(graph, graph.nodes.len(), opset)
}

/// [`infer`] over the first `count` nodes only (what an import phase that rewrites node
/// `count` needs to know about its inputs).
pub fn infer_prefix(graph: &Graph, count: usize, opset: i64) -> Result<Inference> {
    let mut inf = seeded(graph);
    for node in &graph.nodes[..count.min(graph.nodes.len())] {
        infer_node(node, &mut inf, opset)?;
    }
    Ok(inf)
}

/// What is known before the first node: the graph's inputs and its initializers (the
/// start of an import phase that infers node by node while it rewrites).
pub(crate) fn seeded(graph: &Graph) -> Inference {
    let mut inf = Inference::default();
    for v in graph.inputs.iter().chain(graph.initializer_inputs.iter()) {
        inf.types.insert(v.name.clone(), v.clone());
    }
    for (name, t) in &graph.initializers {
        inf.types.insert(name.clone(), ValueInfo::new(name, t.dtype(), fixed_shape(t.dims())));
        if !t.dtype().is_float() && t.numel() <= MAX_FOLDED_ELEMENTS {
            inf.constants.insert(name.clone(), t.clone());
        }
    }
    inf
}

/// Infers one node's outputs into `inf`, its inputs already there.
pub(crate) fn infer_node(node: &Node, inf: &mut Inference, opset: i64) -> Result<()> {
    let spec = spec(&node.domain, &node.op_type)
        .ok_or_else(|| GraphError::node(node, "no shape rule for this op (unsupported)"))?;
    let cx = Cx { node, inf, opset };
    let outputs = (spec.shape)(&cx)?;
    let symbolic = match spec.value {
        Some(rule) => rule(&cx)?,
        None => None,
    };
    let constant = eval::evaluate(&cx, &outputs, &spec.fold)?;
    for (i, out) in outputs.into_iter().enumerate() {
        let Some(name) = node.output(i) else { continue };
        let (dtype, shape) = out;
        inf.types.insert(
            name.to_string(),
            ValueInfo { name: name.into(), dtype: Some(dtype), shape: Some(shape), doc_string: String::new() },
        );
    }
    if let Some(values) = symbolic
        && let Some(out) = node.output(0)
    {
        if values.iter().all(|v| matches!(v, SymInt::Known(_))) && !inf.constants.contains_key(out) {
            let ints: Vec<i64> = values.iter().map(|v| if let SymInt::Known(n) = v { *n } else { 0 }).collect();
            let (dtype, shape) = inf.typed(out).map(|(d, s)| (d, s.clone())).unwrap_or((DataType::Int64, vec![]));
            let dims: Vec<usize> = shape.iter().map(|d| d.fixed().unwrap_or(ints.len())).collect();
            if let Ok(t) = Tensor::from_i64_as(dtype, dims, &ints) {
                inf.constants.insert(out.to_string(), t);
            }
        }
        inf.symbolic.insert(out.to_string(), values);
    }
    if let Some(values) = constant {
        for (i, t) in values.into_iter().enumerate() {
            if let Some(name) = node.output(i) {
                if t.dtype().is_integer() && t.dims().len() <= 1 {
                    let ints = t.to_i64_vec().unwrap_or_default();
                    inf.symbolic.insert(name.to_string(), ints.into_iter().map(SymInt::Known).collect());
                }
                inf.constants.insert(name.to_string(), t);
            }
        }
    }
    Ok(())
}

/// Inferred (dtype, shape) of each output of a node, in order.
pub(crate) type Outputs = Vec<(DataType, Shape)>;

/// What an op's rule can see: the node and what is known of its inputs.
pub(crate) struct Cx<'a> {
    pub node: &'a Node,
    pub inf: &'a Inference,
    pub opset: i64,
}

impl Cx<'_> {
    pub fn err(&self, message: impl Into<String>) -> GraphError {
        GraphError::node(self.node, message)
    }

    pub fn has_input(&self, i: usize) -> bool {
        self.node.input(i).is_some()
    }

    /// Dtype and shape of input `i`, which must be present with a known shape.
    pub fn input(&self, i: usize) -> Result<(DataType, Shape)> {
        let name = self.node.input(i).ok_or_else(|| self.err(format!("input {i} is missing")))?;
        let info = self.inf.types.get(name).ok_or_else(|| self.err(format!("input {name:?} has no known type")))?;
        let dtype = info.dtype.ok_or_else(|| self.err(format!("input {name:?} has no known element type")))?;
        let shape = info.shape.clone().ok_or_else(|| {
            self.err(format!(
                "input {name:?} has no known shape; give the graph input a shape (a symbolic batch dimension is fine)"
            ))
        })?;
        Ok((dtype, shape))
    }

    pub fn rank(&self, i: usize) -> Result<usize> {
        Ok(self.input(i)?.1.len())
    }

    /// The constant value of input `i`, if present and known.
    pub fn constant(&self, i: usize) -> Option<&Tensor> {
        self.node.input(i).and_then(|n| self.inf.constants.get(n))
    }

    /// Integer values of an optional constant input: `None` if omitted, an error if present
    /// but not known at import time.
    pub fn const_ints(&self, i: usize) -> Result<Option<Vec<i64>>> {
        let Some(name) = self.node.input(i) else { return Ok(None) };
        let t = self
            .inf
            .constants
            .get(name)
            .ok_or_else(|| self.err(format!("input {name:?} must be a constant known when the model is loaded")))?;
        t.to_i64_vec().map(Some).ok_or_else(|| self.err(format!("input {name:?} must hold integers")))
    }

    /// Integer values of a rank-0/1 input `i`, if known element by element (symbolically or
    /// as a constant).
    pub fn symbolic(&self, i: usize) -> Option<Vec<SymInt>> {
        let name = self.node.input(i)?;
        if let Some(v) = self.inf.symbolic.get(name) {
            return Some(v.clone());
        }
        let t = self.inf.constants.get(name)?;
        if t.dims().len() > 1 {
            return None;
        }
        Some(t.to_i64_vec()?.into_iter().map(SymInt::Known).collect())
    }

    /// Axes given as an input (from `input_since` on) or as the `axes` attribute before.
    pub fn axes(&self, input: usize, input_since: i64) -> Result<Option<Vec<i64>>> {
        if self.opset >= input_since {
            self.const_ints(input)
        } else {
            Ok(self.node.attr_ints("axes")?.map(|a| a.to_vec()))
        }
    }

    /// Normalises a possibly negative axis against a rank.
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize> {
        let r = rank as i64;
        if rank == 0 || axis < -r || axis >= r {
            return Err(self.err(format!("axis {axis} is out of range for rank {rank}")));
        }
        Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
    }
}

/// The product of dimensions, symbolic when exactly one factor is a symbol and the
/// rest multiply to one.
pub(crate) fn dims_product(dims: &[Dim]) -> Dim {
    let mut fixed = 1usize;
    let mut symbols = Vec::new();
    for d in dims {
        match d {
            Dim::Fixed(n) => match fixed.checked_mul(*n) {
                Some(f) => fixed = f,
                None => return Dim::Unknown,
            },
            Dim::Symbol(s) => symbols.push(s),
            Dim::Unknown => return Dim::Unknown,
        }
    }
    match symbols.as_slice() {
        [] => Dim::Fixed(fixed),
        [s] if fixed == 1 => Dim::Symbol((*s).clone()),
        _ => Dim::Unknown,
    }
}
