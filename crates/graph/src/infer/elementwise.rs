//! Shape rules of element-wise ops.

use super::{Cx, Outputs, broadcast_shapes};
use crate::dtype::DataType;
use crate::error::Result;

/// One output of the input's element type and shape (activations, `Identity`...).
pub(crate) fn same_as_input(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, shape) = cx.input(0)?;
    Ok(vec![(dtype, shape)])
}

pub(crate) fn cast(cx: &Cx<'_>) -> Result<Outputs> {
    let (_, shape) = cx.input(0)?;
    let to =
        DataType::from_onnx(cx.node.attr_int("to", 0)? as i32).map_err(|e| cx.err(format!("attribute \"to\": {e}")))?;
    Ok(vec![(to, shape)])
}

pub(crate) fn cast_like(cx: &Cx<'_>) -> Result<Outputs> {
    Ok(vec![(cx.input(1)?.0, cx.input(0)?.1)])
}

/// The output and its boolean mask.
pub(crate) fn dropout(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, shape) = cx.input(0)?;
    Ok(vec![(dtype, shape.clone()), (DataType::Bool, shape)])
}

/// `Softmax` and `LogSoftmax`: the input's type, with a valid `axis`.
pub(crate) fn softmax(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, shape) = cx.input(0)?;
    cx.axis(cx.node.attr_int("axis", -1)?, shape.len())?;
    Ok(vec![(dtype, shape)])
}

pub(crate) fn not(cx: &Cx<'_>) -> Result<Outputs> {
    Ok(vec![(DataType::Bool, cx.input(0)?.1)])
}

/// `IsNaN`: a boolean of the input's shape, for a floating-point input.
pub(crate) fn is_nan(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, shape) = cx.input(0)?;
    if !dtype.is_float() {
        return Err(cx.err(format!("IsNaN takes a floating-point input, got {dtype}")));
    }
    Ok(vec![(DataType::Bool, shape)])
}

/// Comparisons and logical ops: a boolean of the broadcast shape.
pub(crate) fn comparison(cx: &Cx<'_>) -> Result<Outputs> {
    Ok(vec![(DataType::Bool, broadcast(cx, 0..2)?)])
}

pub(crate) fn where_(cx: &Cx<'_>) -> Result<Outputs> {
    let dtype = cx.input(1)?.0;
    Ok(vec![(dtype, broadcast(cx, 0..3)?)])
}

/// Arithmetic on inputs of one element type, broadcast (`Add`, `Mul`, `Max`, `Mod`...).
pub(crate) fn arithmetic(cx: &Cx<'_>) -> Result<Outputs> {
    let dtype = cx.input(0)?.0;
    for i in 1..cx.node.inputs.len() {
        let other = cx.input(i)?.0;
        if other != dtype {
            return Err(cx.err(format!("inputs have different element types ({dtype} and {other})")));
        }
    }
    Ok(vec![(dtype, broadcast(cx, 0..cx.node.inputs.len())?)])
}

/// `Pow`: the base's element type (the exponent's may differ), broadcast.
pub(crate) fn pow(cx: &Cx<'_>) -> Result<Outputs> {
    let dtype = cx.input(0)?.0;
    Ok(vec![(dtype, broadcast(cx, 0..cx.node.inputs.len())?)])
}

fn broadcast(cx: &Cx<'_>, inputs: std::ops::Range<usize>) -> Result<crate::ir::Shape> {
    let shapes = inputs.map(|i| cx.input(i).map(|t| t.1)).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&[crate::ir::Dim]> = shapes.iter().map(|s| s.as_slice()).collect();
    broadcast_shapes(&refs).ok_or_else(|| {
        let text: Vec<String> = shapes.iter().map(|s| crate::ir::format_shape(s)).collect();
        cx.err(format!("input shapes {} do not broadcast", text.join(" and ")))
    })
}
