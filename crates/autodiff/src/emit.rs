//! The [`Emitter`]: appends standard-ONNX nodes to a graph under fresh, readable names.

use edgefreeze_graph::ir::{Attribute, Node};
use edgefreeze_graph::{DataType, Tensor};
use std::collections::HashSet;

/// Appends nodes to a list with unique node and value names, and builds the common
/// small patterns backward rules need. Every value it makes is in the default domain.
pub struct Emitter {
    /// The nodes emitted so far, in order.
    pub nodes: Vec<Node>,
    taken: HashSet<String>,
    /// Element type of the floating-point values (constants are made in this type).
    pub float: DataType,
    /// Default-domain opset of the graph (some ops take attributes or inputs by opset).
    pub opset: i64,
    prefix: String,
}

impl Emitter {
    /// An emitter whose names avoid those in `taken`.
    pub fn new(taken: HashSet<String>, float: DataType, opset: i64) -> Emitter {
        Emitter { nodes: Vec::new(), taken, float, opset, prefix: String::new() }
    }

    /// Sets the prefix of the names made next (usually the forward node being differentiated).
    pub fn set_prefix(&mut self, prefix: &str) {
        self.prefix = prefix.to_string();
    }

    /// A fresh name from a hint.
    pub fn fresh(&mut self, hint: &str) -> String {
        let base = if self.prefix.is_empty() { hint.to_string() } else { format!("{}/{hint}", self.prefix) };
        let mut name = base.clone();
        let mut k = 1;
        while self.taken.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    /// Reserves a name so it is never made fresh (graph inputs and outputs).
    pub fn reserve(&mut self, name: &str) {
        self.taken.insert(name.to_string());
    }

    /// Emits `op(inputs) -> one output` with attributes; returns the output name.
    pub fn op(&mut self, op: &str, inputs: &[&str], attributes: Vec<(&str, Attribute)>) -> String {
        let out = self.fresh(&op.to_ascii_lowercase());
        self.op_into(op, inputs, &[&out], attributes);
        out
    }

    /// Emits a node whose output names are given.
    pub fn op_into(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attributes: Vec<(&str, Attribute)>) {
        let name = self.fresh(op);
        let mut node = Node::new(name, op, inputs, outputs);
        for (k, v) in attributes {
            node.attributes.insert(k.to_string(), v);
        }
        for o in outputs {
            self.taken.insert(o.to_string());
        }
        self.nodes.push(node);
    }

    /// A constant tensor.
    pub fn constant(&mut self, hint: &str, value: Tensor) -> String {
        let out = self.fresh(hint);
        self.op_into("Constant", &[], &[&out], vec![("value", Attribute::Tensor(value))]);
        out
    }

    /// A floating-point scalar constant in the graph's float type.
    pub fn scalar(&mut self, v: f64) -> String {
        let t = Tensor::from_f64_as(self.float, vec![], &[v]).expect("a scalar always fits");
        self.constant("const", t)
    }

    /// A floating-point constant tensor in the graph's float type.
    pub fn floats(&mut self, dims: Vec<usize>, values: &[f64]) -> String {
        let t = Tensor::from_f64_as(self.float, dims, values).expect("dims match values");
        self.constant("const", t)
    }

    /// An i64 vector constant (axes, shapes, pads).
    pub fn ints(&mut self, values: &[i64]) -> String {
        self.constant("ints", Tensor::from_i64(vec![values.len()], values).expect("a vector"))
    }

    /// An i64 scalar constant.
    pub fn int_scalar(&mut self, value: i64) -> String {
        self.constant("int", Tensor::from_i64(vec![], &[value]).expect("a scalar"))
    }

    /// `a + b`.
    pub fn add(&mut self, a: &str, b: &str) -> String {
        self.op("Add", &[a, b], vec![])
    }

    /// `a - b`.
    pub fn sub(&mut self, a: &str, b: &str) -> String {
        self.op("Sub", &[a, b], vec![])
    }

    /// `a * b`.
    pub fn mul(&mut self, a: &str, b: &str) -> String {
        self.op("Mul", &[a, b], vec![])
    }

    /// `a / b`.
    pub fn div(&mut self, a: &str, b: &str) -> String {
        self.op("Div", &[a, b], vec![])
    }

    /// `-a`.
    pub fn neg(&mut self, a: &str) -> String {
        self.op("Neg", &[a], vec![])
    }

    /// `a * c` for a float constant `c`.
    pub fn scale(&mut self, a: &str, c: f64) -> String {
        let k = self.scalar(c);
        self.mul(a, &k)
    }

    /// `a / c` for a float constant `c`. For a count (an integer) this is exact in float64
    /// and correctly rounded in float32, where `a * (1 / c)` would round the reciprocal too:
    /// the graph rewritten to float64 then computes float64 gradients, not float32 ones.
    pub fn divide(&mut self, a: &str, c: f64) -> String {
        let k = self.scalar(c);
        self.div(a, &k)
    }

    /// Sum over `axes` (which may be empty: then `x` itself).
    pub fn reduce_sum(&mut self, x: &str, axes: &[i64], keepdims: bool) -> String {
        if axes.is_empty() {
            return x.to_string();
        }
        let axes = self.ints(axes);
        self.op("ReduceSum", &[x, &axes], vec![("keepdims", Attribute::Int(keepdims as i64))])
    }

    /// Mean over `axes`, written for the graph's opset (attribute before 18, input from 18).
    pub fn reduce_mean(&mut self, x: &str, axes: &[i64], keepdims: bool) -> String {
        self.reduce_since_18("ReduceMean", x, axes, keepdims)
    }

    /// Maximum over `axes`, written for the graph's opset (attribute before 18, input from 18).
    pub fn reduce_max(&mut self, x: &str, axes: &[i64], keepdims: bool) -> String {
        self.reduce_since_18("ReduceMax", x, axes, keepdims)
    }

    /// A reduction whose axes are an attribute before opset 18 and an input from 18.
    fn reduce_since_18(&mut self, op: &str, x: &str, axes: &[i64], keepdims: bool) -> String {
        let keep = ("keepdims", Attribute::Int(keepdims as i64));
        if self.opset >= 18 {
            let axes = self.ints(axes);
            self.op(op, &[x, &axes], vec![keep])
        } else {
            self.op(op, &[x], vec![keep, ("axes", Attribute::Ints(axes.to_vec()))])
        }
    }

    /// `Shape(x)`: a 1-D i64 tensor of x's (runtime) dimensions.
    pub fn shape_of(&mut self, x: &str) -> String {
        self.op("Shape", &[x], vec![])
    }

    /// Reshapes `x` to the runtime shape of `like`.
    pub fn reshape_like(&mut self, x: &str, like: &str) -> String {
        let shape = self.shape_of(like);
        self.op("Reshape", &[x, &shape], vec![])
    }

    /// Reshapes `x` to a constant shape (0 copies a dimension, -1 is inferred).
    pub fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let shape = self.ints(shape);
        self.op("Reshape", &[x, &shape], vec![])
    }

    /// Broadcasts `x` to the runtime shape of `like`.
    pub fn expand_like(&mut self, x: &str, like: &str) -> String {
        let shape = self.shape_of(like);
        self.op("Expand", &[x, &shape], vec![])
    }

    /// Transposes with a permutation.
    pub fn transpose(&mut self, x: &str, perm: &[i64]) -> String {
        self.op("Transpose", &[x], vec![("perm", Attribute::Ints(perm.to_vec()))])
    }

    /// Inserts size-1 axes.
    pub fn unsqueeze(&mut self, x: &str, axes: &[i64]) -> String {
        let axes = self.ints(axes);
        self.op("Unsqueeze", &[x, &axes], vec![])
    }

    /// Casts to an element type.
    pub fn cast(&mut self, x: &str, to: DataType) -> String {
        self.op("Cast", &[x], vec![("to", Attribute::Int(to.to_onnx() as i64))])
    }

    /// The number of elements of `x` as a float scalar.
    pub fn numel(&mut self, x: &str) -> String {
        let size = self.op("Size", &[x], vec![]);
        let float = self.float;
        self.cast(&size, float)
    }

    /// The size of axis `axis` of `x` as a float scalar.
    pub fn dim_size(&mut self, x: &str, axis: i64) -> String {
        let shape = self.shape_of(x);
        let index = self.int_scalar(axis);
        let n = self.op("Gather", &[&shape, &index], vec![("axis", Attribute::Int(0))]);
        let float = self.float;
        self.cast(&n, float)
    }
}
