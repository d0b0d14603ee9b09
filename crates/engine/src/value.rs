//! Host tensors passed to and from engines.

use ndarray::ArrayD;

/// A host tensor of one of the element types training graphs use.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// 32-bit floats (activations, parameters, gradients).
    F32(ArrayD<f32>),
    /// 64-bit floats (finite-difference checks).
    F64(ArrayD<f64>),
    /// 64-bit integers (labels, token ids, step counters).
    I64(ArrayD<i64>),
    /// Booleans (masks).
    Bool(ArrayD<bool>),
}

impl Value {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            Value::F32(a) => a.shape(),
            Value::F64(a) => a.shape(),
            Value::I64(a) => a.shape(),
            Value::Bool(a) => a.shape(),
        }
    }

    /// The f32 array, if this is one.
    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        match self {
            Value::F32(a) => Some(a),
            _ => None,
        }
    }

    /// The f64 array, if this is one.
    pub fn as_f64(&self) -> Option<&ArrayD<f64>> {
        match self {
            Value::F64(a) => Some(a),
            _ => None,
        }
    }

    /// The i64 array, if this is one.
    pub fn as_i64(&self) -> Option<&ArrayD<i64>> {
        match self {
            Value::I64(a) => Some(a),
            _ => None,
        }
    }

    /// A scalar f32.
    pub fn scalar_f32(v: f32) -> Value {
        Value::F32(ArrayD::from_elem(ndarray::IxDyn(&[]), v))
    }

    /// A scalar i64.
    pub fn scalar_i64(v: i64) -> Value {
        Value::I64(ArrayD::from_elem(ndarray::IxDyn(&[]), v))
    }
}
