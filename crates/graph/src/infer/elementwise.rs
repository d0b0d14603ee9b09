//! Shape rules of element-wise ops.

use super::{Cx, Outputs, broadcast_shapes};
use crate::dtype::DataType;
use crate::error::Result;

pub(super) fn infer(cx: &Cx<'_>) -> Result<Outputs> {
    let node = cx.node;
    match node.op_type.as_str() {
        "Cast" => {
            let (_, shape) = cx.input(0)?;
            let to = DataType::from_onnx(node.attr_int("to", 0)? as i32)
                .map_err(|e| cx.err(format!("attribute \"to\": {e}")))?;
            Ok(vec![(to, shape)])
        }
        "CastLike" => Ok(vec![(cx.input(1)?.0, cx.input(0)?.1)]),
        "Dropout" => {
            let (dtype, shape) = cx.input(0)?;
            Ok(vec![(dtype, shape.clone()), (DataType::Bool, shape)])
        }
        "Softmax" | "LogSoftmax" => {
            let (dtype, shape) = cx.input(0)?;
            cx.axis(node.attr_int("axis", -1)?, shape.len())?;
            Ok(vec![(dtype, shape)])
        }
        "Not" => Ok(vec![(DataType::Bool, cx.input(0)?.1)]),
        "Equal" | "Greater" | "Less" | "And" | "Or" => Ok(vec![(DataType::Bool, broadcast(cx, 0..2)?)]),
        "Where" => {
            let dtype = cx.input(1)?.0;
            Ok(vec![(dtype, broadcast(cx, 0..3)?)])
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" => {
            let dtype = cx.input(0)?.0;
            if node.op_type != "Pow" {
                for i in 1..node.inputs.len() {
                    let other = cx.input(i)?.0;
                    if other != dtype {
                        return Err(cx.err(format!("inputs have different element types ({dtype} and {other})")));
                    }
                }
            }
            Ok(vec![(dtype, broadcast(cx, 0..node.inputs.len())?)])
        }
        _ => {
            let (dtype, shape) = cx.input(0)?;
            Ok(vec![(dtype, shape)])
        }
    }
}

fn broadcast(cx: &Cx<'_>, inputs: std::ops::Range<usize>) -> Result<crate::ir::Shape> {
    let shapes = inputs.map(|i| cx.input(i).map(|t| t.1)).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&[crate::ir::Dim]> = shapes.iter().map(|s| s.as_slice()).collect();
    broadcast_shapes(&refs).ok_or_else(|| {
        let text: Vec<String> = shapes.iter().map(|s| crate::ir::format_shape(s)).collect();
        cx.err(format!("input shapes {} do not broadcast", text.join(" and ")))
    })
}
