//! The tract engine: pure Rust, no native library.

use crate::profile::{NodeTime, OpTypes, Profile};
use crate::workspace::{
    GraphId, StateUpdates, Workspace, check_updates, loaded, missing_input, missing_state, not_profiled, unload,
};
use crate::{EngineError, EngineOptions, Session, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use tract_linalg::multithread::{Executor, multithread_tract_scope};
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::OpState;
use tract_onnx::tract_core::plan::EvalContext;

type Plan = std::sync::Arc<TypedSimplePlan>;

/// A graph optimised and compiled by tract.
pub struct TractSession {
    graph: Compiled,
    executor: Executor,
}

/// A compiled plan with its input and output names.
struct Compiled {
    plan: Plan,
    inputs: Vec<String>,
    outputs: Vec<String>,
    /// The typed model before code generation, with its symbolic dimensions, and the
    /// symbol behind each input dimension that is one (input, axis, symbol).
    typed: std::sync::Arc<TypedModel>,
    symbolic_dims: Vec<(usize, usize, Symbol)>,
    /// Fully optimised plans (decluttered, then code-generated) per binding of the
    /// symbols, in `symbolic_dims` order; `None` where optimising failed.
    concrete: Mutex<HashMap<Vec<i64>, Option<Plan>>>,
    /// Run the generic plan only ([`EngineOptions::tract_generic_plan`]).
    generic_only: bool,
    /// Where the node times of each run go, when profiling.
    profile: Option<Recorder>,
}

/// Node times of the runs so far, named after the ONNX nodes they came from.
struct Recorder {
    op_types: OpTypes,
    runs: Mutex<Vec<Vec<NodeTime>>>,
}

impl Recorder {
    fn node_time(&self, node: &TypedNode, micros: f64) -> NodeTime {
        let op_type = match self.op_types.of_node(&node.name) {
            Some(op) => op.to_string(),
            None => format!("tract:{}", node.op.name()),
        };
        NodeTime { node: node.name.clone(), op_type, micros }
    }
}

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Tract(format!("{e:#}"))
}

/// tract's executor for the configured thread count (default: the machine's cores).
fn executor(options: &EngineOptions) -> Executor {
    match options.threads.unwrap_or_else(crate::default_threads) {
        0 | 1 => Executor::SingleThread,
        n => Executor::multithread_with_name(n, "edgefreeze-tract"),
    }
}

/// Loads and optimises a model. Symbolic dimensions (the batch) stay symbolic and are
/// bound at each run.
fn compile(model: &[u8], options: &EngineOptions) -> Result<Compiled, EngineError> {
    let onnx = tract_onnx::onnx();
    let proto = onnx.proto_model_for_read(&mut &*model).map_err(err)?;
    let inference = onnx.model_for_proto_model(&proto).map_err(err)?;
    let profile =
        options.profile.then(|| Recorder { op_types: OpTypes::of_model(&proto), runs: Mutex::new(Vec::new()) });
    let inputs = inference.input_outlets().map_err(err)?.iter().map(|o| inference.node(o.node).name.clone()).collect();
    let outputs = inference
        .output_outlets()
        .map_err(err)?
        .iter()
        .map(|o| inference.outlet_label(*o).map(String::from).unwrap_or_else(|| inference.node(o.node).name.clone()))
        .collect();
    // tract's decluttering passes propagate "regions of interest" whose symbolic
    // expressions grow exponentially on deep training graphs (a residual block per
    // union), so the generic plan, which keeps the batch symbolic, is typed and
    // code-generated without them; the plans run in practice bind the batch first and
    // are fully optimised (`optimise_concrete`).
    let mut typed = inference.into_typed().map_err(err)?;
    integer_cumulative_sums(&mut typed).map_err(err)?;
    let mut symbolic_dims = Vec::new();
    for (ix, outlet) in typed.input_outlets().map_err(err)?.iter().enumerate() {
        let fact = typed.outlet_fact(*outlet).map_err(err)?;
        for (axis, d) in fact.shape.iter().enumerate() {
            if let TDim::Sym(s) = d {
                symbolic_dims.push((ix, axis, s.clone()));
            }
        }
    }
    let mut generic = typed.clone();
    tract_onnx::tract_core::optim::Optimizer::codegen().optimize(&mut generic).map_err(err)?;
    let plan = runnable(generic).map_err(err)?;
    let compiled = Compiled {
        plan,
        inputs,
        outputs,
        typed: std::sync::Arc::new(typed),
        symbolic_dims,
        concrete: Default::default(),
        generic_only: options.tract_generic_plan,
        profile,
    };
    // A graph without symbols (an update graph) has one optimised plan: make it now, so
    // that its first run costs what every later one does. An edge's first update is what
    // the device-edge probe times as the edge's update.
    if compiled.symbolic_dims.is_empty() {
        compiled.plan_for(&TVec::new());
    }
    Ok(compiled)
}

/// tract reads an ONNX `Cast` to int64 as a cast to its symbolic-dimension type, so that
/// shape arithmetic stays symbolic; its `CumSum` has kernels for numbers only, and fails
/// at run time on such a value ("TDim is not a number"). RoBERTa's position ids, as dynamo
/// exports them, are the cumulative sum of a mask cast to int64. Each such `CumSum` gets a
/// cast to int64 before it and back after it: the same integers, summed by its kernel.
fn integer_cumulative_sums(model: &mut TypedModel) -> TractResult<usize> {
    use tract_onnx::tract_core::ops::array::CumSum;
    use tract_onnx::tract_core::ops::cast::cast;
    let mut changed = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(op) = node.op_as::<CumSum>().cloned() else { continue };
        let input = node.inputs[0];
        if model.outlet_fact(input)?.datum_type != TDim::datum_type() {
            continue;
        }
        let name = node.name.clone();
        let mut patch = TypedModelPatch::default();
        let tap = patch.tap_model(model, input)?;
        let ints = patch.wire_node(format!("{name}.to_i64"), cast(i64::datum_type()), &[tap])?;
        let sums = patch.wire_node(format!("{name}.i64"), op, &ints)?;
        let out = patch.wire_node(format!("{name}.to_dim"), cast(TDim::datum_type()), &sums)?;
        patch.shunt_outside(model, id.into(), out[0])?;
        patch.apply(model)?;
        changed += 1;
    }
    Ok(changed)
}

/// The model with its symbols bound, decluttered and code-generated. With every
/// dimension a number, the decluttering passes that blow up on symbolic training graphs
/// (above) have only integers to propagate, and they finish in seconds (1.4 s for
/// ResNet-20's training step, 5.1 s for MobileNetV2 x0.5's, debug build); the optimised
/// plan runs MobileNetV2's step 1.8x faster than the generic one (docs/results.md).
/// Between decluttering and code generation, [`crate::tract_lower`] steers the
/// element-wise ops onto tract's vectorised kernels, fuses comparison masks, lays a
/// batch of short rows along the width, pads the other convolutions' inputs explicitly,
/// scatters by offsets into rows and lets matrix products read transposed operands as
/// they are.
fn optimise_concrete(typed: &TypedModel, bindings: &HashMap<Symbol, TDim>) -> TractResult<Plan> {
    let mut model = typed.set_symbols(bindings)?;
    model.declutter()?;
    crate::tract_lower::fuse_comparison_masks(&mut model)?;
    crate::tract_lower::widen_per_channel_operands(&mut model)?;
    crate::tract_lower::lay_batch_along_width(&mut model)?;
    crate::tract_lower::scatter_by_rows(&mut model)?;
    crate::tract_lower::fold_transposes_into_products(&mut model)?;
    crate::tract_lower::pad_convolutions_explicitly(&mut model)?;
    model.optimize()?;
    runnable(model)
}

/// The plan of a model, its nodes in tract's plain order: depth first from the outputs,
/// each node's inputs in order. tract's default order, the "memory friendly" one, counts
/// live values, not their bytes, and on a training graph it runs the backward nodes that
/// read only forward values (the per-offset windows of a layer's input for its weight
/// gradient, masks) as soon as it can, during the forward pass, so that their results
/// stay alive until the backward needs them: ResNet-20's step (batch 64) peaked at 384 MiB
/// that way, against 142 MiB in the plain order, at the same speed (docs/results.md).
fn runnable(model: TypedModel) -> TractResult<Plan> {
    let options = tract_onnx::tract_core::runtime::RunOptions { skip_order_opt_ram: true, ..Default::default() };
    model.into_runnable_with_options(&options)
}

impl Compiled {
    /// The plan for these inputs: the optimised one for their symbol values, made on the
    /// first run with them (a run with another batch size, such as an epoch's last
    /// batch, makes its own); the generic plan where optimising failed or an input's
    /// shape does not bind its symbols consistently (tract then reports the mismatch).
    fn plan_for(&self, inputs: &TVec<TValue>) -> Plan {
        if self.generic_only {
            return self.plan.clone();
        }
        let mut key = Vec::with_capacity(self.symbolic_dims.len());
        let mut bindings = HashMap::new();
        for (ix, axis, sym) in &self.symbolic_dims {
            let Some(v) = inputs.get(*ix).and_then(|t| t.shape().get(*axis)) else {
                return self.plan.clone();
            };
            match bindings.get(sym) {
                Some(TDim::Val(b)) if *b != *v as i64 => return self.plan.clone(),
                _ => {}
            }
            bindings.insert(sym.clone(), TDim::Val(*v as i64));
            key.push(*v as i64);
        }
        let mut cache = self.concrete.lock().unwrap_or_else(|p| p.into_inner());
        let entry = cache.entry(key).or_insert_with(|| match optimise_concrete(&self.typed, &bindings) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("tract: optimising failed, running the generic plan: {e:#}");
                None
            }
        });
        entry.clone().unwrap_or_else(|| self.plan.clone())
    }

    fn run(&self, executor: &Executor, inputs: TVec<TValue>) -> Result<TVec<TValue>, EngineError> {
        let plan = self.plan_for(&inputs);
        let step = || {
            multithread_tract_scope(executor.clone(), || {
                // `SimplePlan::run` forgets the batch it bound before returning; the steps
                // of a run, done here, keep it for `bind_symbols`.
                let mut state = plan.spawn()?;
                state.set_inputs(inputs)?;
                match &self.profile {
                    None => state.exec()?,
                    Some(recorder) => {
                        let mut nodes = Vec::new();
                        state.exec_plan_with_eval(
                            |ctx: &EvalContext,
                             op_state: Option<&mut (dyn OpState + 'static)>,
                             node: &TypedNode,
                             input| {
                                let started = Instant::now();
                                let outputs = tract_onnx::tract_core::plan::eval(ctx, op_state, node, input);
                                if !node.op_is::<tract_onnx::tract_core::ops::source::TypedSource>() {
                                    nodes.push(recorder.node_time(node, started.elapsed().as_secs_f64() * 1e6));
                                }
                                outputs
                            },
                        )?;
                        recorder.runs.lock().unwrap_or_else(|p| p.into_inner()).push(nodes);
                    }
                }
                let outputs = state.outputs()?;
                let symbols = &state.turn_state.resolved_symbols;
                outputs.into_iter().map(|t| bind_symbols(t, symbols)).collect::<TractResult<TVec<TValue>>>()
            })
        };
        // The whole run on a thread of the pool: run from the caller's thread, the pool's
        // n threads and the caller's make n + 1, and the pool's threads, spinning between
        // the parallel kernels, take the caller's core. With 2 threads on 2 cores every
        // model's step was slower than with 1 (docs/results.md).
        // tract panics on some bad input where it could have failed (a Gather index past
        // its table: a token id the model's vocabulary does not have); a run is an error
        // then, never the end of the process.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match executor {
            Executor::MultiThread(pool) => pool.install(step),
            _ => step(),
        }));
        match outcome {
            Ok(result) => result.map_err(err),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("no message");
                Err(EngineError::Tract(format!("tract failed during the run: {what}")))
            }
        }
    }
}

/// tract folds integers computed from shapes into symbolic dimensions (`2*batch`),
/// which stay symbolic in an output that is one (a stashed shape vector): they are
/// bound to the run's symbol values here.
fn bind_symbols(t: TValue, symbols: &SymbolValues) -> TractResult<TValue> {
    if t.datum_type() != DatumType::TDim {
        return Ok(t);
    }
    let dims = t.to_plain_array_view::<TDim>()?;
    let ints = dims.iter().map(|d| d.eval(symbols).to_i64()).collect::<Result<Vec<i64>, _>>()?;
    Ok(Tensor::from_shape(t.shape(), &ints)?.into_tvalue())
}

impl TractSession {
    /// Loads and optimises a model; runs use `options.threads` threads.
    pub fn load(model: &[u8], options: &EngineOptions) -> Result<TractSession, EngineError> {
        Ok(TractSession { graph: compile(model, options)?, executor: executor(options) })
    }
}

/// A [`Workspace`] on tract: state tensors are shared tract values, moved from one
/// run's outputs to the next run's inputs without a copy.
pub struct TractWorkspace {
    /// Indexed by [`GraphId`]; an unloaded graph leaves an empty slot.
    graphs: Vec<Option<(Compiled, StateUpdates)>>,
    store: HashMap<String, TValue>,
    executor: Executor,
    options: EngineOptions,
}

impl TractWorkspace {
    /// An empty workspace.
    pub fn new(options: &EngineOptions) -> TractWorkspace {
        TractWorkspace {
            graphs: Vec::new(),
            store: HashMap::new(),
            executor: executor(options),
            options: options.clone(),
        }
    }
}

impl Workspace for TractWorkspace {
    fn load_graph(&mut self, model: &[u8], updates: StateUpdates) -> Result<GraphId, EngineError> {
        let compiled = compile(model, &self.options)?;
        check_updates(&updates, &compiled.outputs)?;
        self.graphs.push(Some((compiled, updates)));
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn inputs(&self, graph: GraphId) -> &[String] {
        loaded(&self.graphs, graph).map_or(&[], |g| &g.0.inputs)
    }

    fn outputs(&self, graph: GraphId) -> &[String] {
        loaded(&self.graphs, graph).map_or(&[], |g| &g.0.outputs)
    }

    fn unload_graph(&mut self, graph: GraphId) -> Result<(), EngineError> {
        unload(&mut self.graphs, graph)
    }

    fn loaded_graphs(&self) -> usize {
        self.graphs.iter().flatten().count()
    }

    fn take_profile(&mut self, graph: GraphId) -> Result<Profile, EngineError> {
        let recorder = loaded(&self.graphs, graph)?.0.profile.as_ref().ok_or_else(not_profiled)?;
        let runs = std::mem::take(&mut *recorder.runs.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(Profile { runs })
    }

    fn set_state(&mut self, name: &str, value: Value) -> Result<(), EngineError> {
        self.store.insert(name.to_string(), into_tract(value));
        Ok(())
    }

    fn state(&self, name: &str) -> Result<Value, EngineError> {
        from_tract(name, self.store.get(name).ok_or_else(|| missing_state(name))?)
    }

    fn state_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.store.keys().cloned().collect();
        names.sort();
        names
    }

    fn run(&mut self, graph: GraphId, inputs: &[(&str, &Value)]) -> Result<Vec<(String, Value)>, EngineError> {
        let (compiled, updates) = loaded(&self.graphs, graph)?;
        let mut ordered = TVec::new();
        for name in &compiled.inputs {
            let value = match self.store.get(name) {
                Some(v) => v.clone(),
                None => {
                    let (_, v) = inputs.iter().find(|(n, _)| n == name).ok_or_else(|| missing_input(name))?;
                    to_tract(v)
                }
            };
            ordered.push(value);
        }
        let outputs = compiled.run(&self.executor, ordered)?;
        let mut host = Vec::new();
        for (value, name) in outputs.into_iter().zip(&compiled.outputs) {
            match updates.state_of(name) {
                Some(state) => {
                    self.store.insert(state.to_string(), value);
                }
                None => host.push((name.clone(), from_tract(name, &value)?)),
            }
        }
        Ok(host)
    }
}

/// A host tensor as a tract value (one copy).
fn to_tract(v: &Value) -> TValue {
    into_tract(v.clone())
}

/// A host tensor as a tract value, taking its buffer.
fn into_tract(v: Value) -> TValue {
    let t: Tensor = match v {
        Value::F32(a) => a.into(),
        Value::F64(a) => a.into(),
        Value::I64(a) => a.into(),
        Value::Bool(a) => a.into(),
    };
    t.into_tvalue()
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
        &self.graph.inputs
    }

    fn output_names(&self) -> &[String] {
        &self.graph.outputs
    }

    fn run(&mut self, inputs: &[(&str, &Value)]) -> Result<Vec<Value>, EngineError> {
        let mut ordered = TVec::new();
        for name in &self.graph.inputs {
            let (_, v) = inputs
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| EngineError::Value { name: name.clone(), message: "input not given".into() })?;
            ordered.push(to_tract(v));
        }
        let outputs = self.graph.run(&self.executor, ordered)?;
        outputs.iter().zip(&self.graph.outputs).map(|(t, name)| from_tract(name, t)).collect()
    }
}
