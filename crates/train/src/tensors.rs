//! Conversions between graph tensors (initializers, converted state) and engine values.

use crate::error::{Result, TrainError};
use edgefreeze_engine::Value;
use edgefreeze_graph::{DataType, Tensor};
use ndarray::{ArrayD, IxDyn};

/// A graph tensor as an engine value (f32, f64, i64 or bool).
pub fn value_from_tensor(name: &str, t: &Tensor) -> Result<Value> {
    let shape = IxDyn(t.dims());
    let bad = |e: ndarray::ShapeError| TrainError::Config(format!("tensor {name:?}: {e}"));
    let unsupported = || TrainError::Config(format!("tensor {name:?} has unsupported type {}", t.dtype()));
    Ok(match t.dtype() {
        DataType::Float32 => {
            Value::F32(ArrayD::from_shape_vec(shape, t.to_f32_vec().ok_or_else(unsupported)?).map_err(bad)?)
        }
        DataType::Float64 => {
            Value::F64(ArrayD::from_shape_vec(shape, t.to_f64_vec().ok_or_else(unsupported)?).map_err(bad)?)
        }
        DataType::Int64 => {
            Value::I64(ArrayD::from_shape_vec(shape, t.to_i64_vec().ok_or_else(unsupported)?).map_err(bad)?)
        }
        _ => return Err(unsupported()),
    })
}

/// An engine value as a graph tensor.
pub fn tensor_from_value(name: &str, v: &Value) -> Result<Tensor> {
    let dims = v.shape().to_vec();
    let bad = |e: edgefreeze_graph::GraphError| TrainError::Config(format!("tensor {name:?}: {e}"));
    match v {
        Value::F32(a) => Tensor::from_f32(dims, &a.iter().copied().collect::<Vec<_>>()).map_err(bad),
        Value::F64(a) => {
            Tensor::from_f64_as(DataType::Float64, dims, &a.iter().copied().collect::<Vec<_>>()).map_err(bad)
        }
        Value::I64(a) => Tensor::from_i64(dims, &a.iter().copied().collect::<Vec<_>>()).map_err(bad),
        Value::Bool(_) => Err(TrainError::Config(format!("tensor {name:?}: boolean state is not supported"))),
    }
}

/// A scalar (a loss, a count) as f64, whatever its element type.
pub fn scalar(name: &str, v: &Value) -> Result<f64> {
    let bad = || TrainError::Config(format!("output {name:?} should be a scalar, got shape {:?}", v.shape()));
    if v.shape().iter().product::<usize>() != 1 {
        return Err(bad());
    }
    Ok(match v {
        Value::F32(a) => a.iter().next().copied().map(f64::from).ok_or_else(bad)?,
        Value::F64(a) => a.iter().next().copied().ok_or_else(bad)?,
        Value::I64(a) => a.iter().next().map(|&x| x as f64).ok_or_else(bad)?,
        Value::Bool(a) => a.iter().next().map(|&x| f64::from(u8::from(x))).ok_or_else(bad)?,
    })
}
