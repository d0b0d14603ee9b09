//! The tract engine: pure Rust, no native library.

use crate::{EngineError, EngineOptions, Session, Value};
use tract_onnx::prelude::*;

type Plan = std::sync::Arc<TypedSimplePlan>;

/// A graph optimised and compiled by tract.
pub struct TractSession {
    plan: Plan,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Tract(format!("{e:#}"))
}

impl TractSession {
    /// Loads and optimises a model. Symbolic dimensions (the batch) stay symbolic and are
    /// bound at each run.
    pub fn load(model: &[u8], _options: &EngineOptions) -> Result<TractSession, EngineError> {
        let inference = tract_onnx::onnx().model_for_read(&mut &*model).map_err(err)?;
        let inputs =
            inference.input_outlets().map_err(err)?.iter().map(|o| inference.node(o.node).name.clone()).collect();
        let outputs = inference
            .output_outlets()
            .map_err(err)?
            .iter()
            .map(|o| {
                inference.outlet_label(*o).map(String::from).unwrap_or_else(|| inference.node(o.node).name.clone())
            })
            .collect();
        // tract's decluttering passes propagate "regions of interest" whose symbolic
        // expressions grow exponentially on deep training graphs (a residual block per
        // union), so training graphs are typed and code-generated without them.
        let mut typed = inference.into_typed().map_err(err)?;
        tract_onnx::tract_core::optim::Optimizer::codegen().optimize(&mut typed).map_err(err)?;
        let plan = typed.into_runnable().map_err(err)?;
        Ok(TractSession { plan, inputs, outputs })
    }
}

fn to_tract(name: &str, v: &Value) -> Result<TValue, EngineError> {
    let t: Tensor = match v {
        Value::F32(a) => a.clone().into(),
        Value::F64(a) => a.clone().into(),
        Value::I64(a) => a.clone().into(),
        Value::Bool(a) => a.clone().into(),
    };
    let _ = name;
    Ok(t.into_tvalue())
}

fn from_tract(name: &str, t: &Tensor) -> Result<Value, EngineError> {
    let bad = |e: TractError| EngineError::Value { name: name.to_string(), message: e.to_string() };
    Ok(match t.datum_type() {
        DatumType::F32 => Value::F32(t.to_plain_array_view::<f32>().map_err(bad)?.to_owned()),
        DatumType::F64 => Value::F64(t.to_plain_array_view::<f64>().map_err(bad)?.to_owned()),
        DatumType::I64 => Value::I64(t.to_plain_array_view::<i64>().map_err(bad)?.to_owned()),
        DatumType::Bool => Value::Bool(t.to_plain_array_view::<bool>().map_err(bad)?.to_owned()),
        // tract keeps integers computed from shapes as symbolic dimensions.
        DatumType::TDim | DatumType::I32 | DatumType::U8 | DatumType::I8 | DatumType::U32 => {
            let ints = t.cast_to::<i64>().map_err(bad)?;
            Value::I64(ints.to_plain_array_view::<i64>().map_err(bad)?.to_owned())
        }
        other => {
            return Err(EngineError::Value {
                name: name.into(),
                message: format!("unsupported output type {other:?}"),
            });
        }
    })
}

impl Session for TractSession {
    fn input_names(&self) -> &[String] {
        &self.inputs
    }

    fn output_names(&self) -> &[String] {
        &self.outputs
    }

    fn run(&mut self, inputs: &[(&str, &Value)]) -> Result<Vec<Value>, EngineError> {
        let mut ordered = TVec::new();
        for name in &self.inputs {
            let (_, v) = inputs
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| EngineError::Value { name: name.clone(), message: "input not given".into() })?;
            ordered.push(to_tract(name, v)?);
        }
        let outputs = self.plan.run(ordered).map_err(err)?;
        outputs.iter().zip(&self.outputs).map(|(t, name)| from_tract(name, t)).collect()
    }
}
