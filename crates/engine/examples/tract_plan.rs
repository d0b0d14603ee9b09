//! Compares tract's optimisation pipelines on one ONNX graph: compile time and run time.
//!
//! `cargo run --release -p edgefreeze-engine --example tract_plan -- GRAPH.onnx BATCH MODE...`
//! MODE: `codegen` (what the engine does), `noroi` (declutter without region-of-interest
//! propagation, then codegen), `full` (tract's `into_optimized`); prefix `fixed-` to bind
//! the batch symbol to BATCH before optimising.
use std::time::Instant;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::optim::Optimizer;

fn fill(fact: &TypedFact, batch: usize, seed: &mut u64) -> TractResult<Tensor> {
    let shape: Vec<usize> = fact.shape.iter().map(|d| d.as_i64().map_or(batch, |v| v as usize)).collect();
    let n: usize = shape.iter().product();
    let t = match fact.datum_type {
        DatumType::F32 => {
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
                })
                .collect();
            tract_ndarray::ArrayD::from_shape_vec(shape, v)?.into_tensor()
        }
        DatumType::I64 => tract_ndarray::ArrayD::<i64>::zeros(shape).into_tensor(),
        other => return Err(TractError::msg(format!("input type {other:?} not handled"))),
    };
    Ok(t)
}

fn main() -> TractResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, batch) = (&args[1], args[2].parse::<usize>()?);
    for mode in &args[3..] {
        let t0 = Instant::now();
        let mut typed = tract_onnx::onnx().model_for_path(path)?.into_typed()?;
        let (fixed, kind) = match mode.strip_prefix("fixed-") {
            Some(k) => (true, k),
            None => (false, mode.as_str()),
        };
        if fixed {
            let sym = typed.symbols.sym("batch");
            typed = typed.set_symbols(&std::collections::HashMap::from([(sym, TDim::from(batch as i64))]))?;
        }
        match kind {
            "codegen" => Optimizer::codegen().optimize(&mut typed)?,
            "noroi" => {
                let mut declutter = Optimizer::declutter();
                declutter.passes.retain(|p| !format!("{p:?}").starts_with("PropagateRoi"));
                declutter.optimize(&mut typed)?;
                Optimizer::codegen().optimize(&mut typed)?;
            }
            "full" => typed = typed.into_optimized()?,
            "mine" => {
                typed.declutter()?;
                let f = edgefreeze_engine::tract_lower::fuse_comparison_masks(&mut typed)?;
                let n = edgefreeze_engine::tract_lower::widen_per_channel_operands(&mut typed)?;
                let w = if std::env::var_os("NOWIDE").is_none() {
                    edgefreeze_engine::tract_lower::lay_batch_along_width(&mut typed)?
                } else {
                    0
                };
                let p = edgefreeze_engine::tract_lower::pad_convolutions_explicitly(&mut typed)?;
                let r = edgefreeze_engine::tract_lower::scatter_by_rows(&mut typed)?;
                eprintln!(
                    "fused {f} masks, widened {n} broadcasts, padded {p} convolutions, {w} along the width, {r} scatters"
                );
                typed.optimize()?;
                if std::env::var_os("SHAPES").is_some() {
                    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
                    for n in &typed.nodes {
                        let name = n.op.name();
                        if ["Mul", "Sub", "Add", "Iff", "GT", "LT", "Downsample", "Slice", "MoveAxis"].contains(&&*name)
                        {
                            let f = typed.node_input_facts(n.id)?;
                            let k =
                                format!("{name} {:?}", f.iter().map(|f| format!("{:?}", f.shape)).collect::<Vec<_>>());
                            *seen.entry(k).or_default() += 1;
                        }
                    }
                    for (k, v) in seen {
                        println!("{v:4} {k}");
                    }
                }
            }
            other => return Err(TractError::msg(format!("unknown mode {other}"))),
        }
        let nodes = typed.nodes.len();
        let plan = typed.into_runnable()?;
        let compile = t0.elapsed();
        let mut seed = 1u64;
        let inputs: TVec<TValue> = plan
            .model()
            .input_outlets()?
            .iter()
            .map(|o| fill(plan.model().outlet_fact(*o).unwrap(), batch, &mut seed).map(|t| t.into_tvalue()))
            .collect::<TractResult<_>>()?;
        plan.run(inputs.clone())?;
        let (t1, c1) = (Instant::now(), cpu_seconds());
        let runs = 5;
        for _ in 0..runs {
            plan.run(inputs.clone())?;
        }
        let step = t1.elapsed().as_secs_f64() / runs as f64;
        let cpu = (cpu_seconds() - c1) / runs as f64;
        println!(
            "{mode:>14}: {nodes:5} nodes, compile {:7.2} s, step {:8.1} ms wall, {:8.1} ms CPU",
            compile.as_secs_f64(),
            step * 1e3,
            cpu * 1e3
        );
        if std::env::var_os("PROFILE").is_some() {
            profile(&plan, inputs)?;
        }
    }
    Ok(())
}

/// This process's CPU time (user + system) from /proc/self/stat, in seconds: on a loaded
/// machine it measures a single-threaded run better than the wall clock does.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<f64> = rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse().ok()).collect();
    fields.iter().sum::<f64>() / 100.0
}

/// Time per op type over one run of the plan, largest first.
fn profile(plan: &std::sync::Arc<TypedSimplePlan>, inputs: TVec<TValue>) -> TractResult<()> {
    let mut times: std::collections::HashMap<String, (std::time::Duration, usize)> = Default::default();
    let mut state = tract_onnx::tract_core::plan::SimpleState::new(plan)?;
    state.run_plan_with_eval(inputs, |ctx, op_state, node, input| {
        let shapes: Vec<String> = input.iter().map(|t| format!("{:?}", t.shape())).collect();
        let t = Instant::now();
        let out = tract_onnx::tract_core::plan::eval(ctx, op_state, node, input);
        if std::env::var_os("NODES").is_some() {
            eprintln!(
                "NODE {:.1} {} {} {}",
                t.elapsed().as_secs_f64() * 1e6,
                node.op().name(),
                node.name,
                shapes.join(" ")
            );
        }
        let e = times.entry(node.op().name().to_string()).or_default();
        e.0 += t.elapsed();
        e.1 += 1;
        out
    })?;
    let total: f64 = times.values().map(|v| v.0.as_secs_f64()).sum();
    let mut rows: Vec<_> = times.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.0));
    for (name, (d, n)) in rows.iter().take(25) {
        println!("    {name:>24} {n:5}x {:8.1} ms {:5.1}%", d.as_secs_f64() * 1e3, 100.0 * d.as_secs_f64() / total);
    }
    Ok(())
}
