//! Optimizers written into the training-step graph, with PyTorch's update rules.

use crate::emit::Emitter;
use edgefreeze_graph::{DataType, Tensor};

/// Name of the scalar learning-rate input.
pub const LEARNING_RATE: &str = "lr";
/// Name of the scalar int64 step input (1 for the first update), read by AdamW.
pub const STEP: &str = "step";

/// An optimizer and its fixed hyper-parameters (the learning rate is an input, so a
/// schedule needs no new graph).
#[derive(Debug, Clone, PartialEq)]
pub enum Optimizer {
    /// SGD as `torch.optim.SGD` (no dampening): momentum, Nesterov, L2 weight decay.
    Sgd {
        /// Momentum factor (0 disables the momentum buffer).
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
    /// AdamW as `torch.optim.AdamW`: decoupled weight decay.
    AdamW {
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator term.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

impl Optimizer {
    /// Names of the per-parameter state tensors (each shaped like the parameter), as
    /// prefixes: the state of parameter `p` is `"{prefix}.{p}"`.
    pub fn state_prefixes(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { momentum, .. } if *momentum > 0.0 => &["momentum"],
            Optimizer::Sgd { .. } => &[],
            Optimizer::AdamW { .. } => &["adam_m", "adam_v"],
        }
    }

    /// Whether the graph reads [`STEP`].
    pub fn uses_step(&self) -> bool {
        matches!(self, Optimizer::AdamW { .. })
    }
}

/// Emits one update of `param` with gradient `grad`; `state` holds the current state
/// values (in [`Optimizer::state_prefixes`] order). Returns the new parameter and new states.
pub fn emit_update(
    optimizer: &Optimizer,
    param: &str,
    grad: &str,
    state: &[String],
    e: &mut Emitter,
) -> (String, Vec<String>) {
    e.set_prefix(&format!("update/{param}"));
    let result = match optimizer {
        Optimizer::Sgd { momentum, nesterov, weight_decay } => {
            let g = if *weight_decay != 0.0 {
                let decay = e.scale(param, *weight_decay);
                e.add(grad, &decay)
            } else {
                grad.to_string()
            };
            let (step, states) = if *momentum > 0.0 {
                let kept = e.scale(&state[0], *momentum);
                let buffer = e.add(&kept, &g);
                let step = if *nesterov {
                    let ahead = e.scale(&buffer, *momentum);
                    e.add(&g, &ahead)
                } else {
                    buffer.clone()
                };
                (step, vec![buffer])
            } else {
                (g, vec![])
            };
            let scaled = e.mul(&step, LEARNING_RATE);
            (e.sub(param, &scaled), states)
        }
        Optimizer::AdamW { beta1, beta2, eps, weight_decay } => {
            // The scalars of the update as PyTorch computes them: in float64 from the
            // float64 hyper-parameters (Python floats), each rounded once to the tensors'
            // type where it meets them. In float32, 1 − β₂ᵗ from β₂ rounded to float32
            // (0.99900001) is 1.3·10⁻⁵ too small at t = 1, while v is scaled by
            // 1 − β₂ = 0.001 as in PyTorch: every step came out 6.5·10⁻⁶ too small.
            let float = e.float;
            let wide = DataType::Float64;
            let wide_scalar = |e: &mut Emitter, v: f64| {
                let t = Tensor::from_f64_as(wide, vec![], &[v]).expect("a scalar always fits");
                e.constant("const", t)
            };
            let lr = e.cast(LEARNING_RATE, wide);
            let decayed = if *weight_decay != 0.0 {
                let decay = wide_scalar(e, *weight_decay);
                let rate = e.mul(&lr, &decay);
                let one = wide_scalar(e, 1.0);
                let factor = e.sub(&one, &rate);
                let factor = e.cast(&factor, float);
                e.mul(param, &factor)
            } else {
                param.to_string()
            };
            let m_kept = e.scale(&state[0], *beta1);
            let m_new = e.scale(grad, 1.0 - beta1);
            let m = e.add(&m_kept, &m_new);
            let g2 = e.mul(grad, grad);
            let v_kept = e.scale(&state[1], *beta2);
            let v_new = e.scale(&g2, 1.0 - beta2);
            let v = e.add(&v_kept, &v_new);
            let t = e.cast(STEP, wide);
            let one = wide_scalar(e, 1.0);
            let mut corrections = Vec::new();
            for beta in [*beta1, *beta2] {
                let b = wide_scalar(e, beta);
                let power = e.op("Pow", &[&b, &t], vec![]);
                corrections.push(e.sub(&one, &power));
            }
            let step_size = e.div(&lr, &corrections[0]);
            let step_size = e.cast(&step_size, float);
            let root_c2 = e.op("Sqrt", &[&corrections[1]], vec![]);
            let root_c2 = e.cast(&root_c2, float);
            let root_v = e.op("Sqrt", &[&v], vec![]);
            let scaled_v = e.div(&root_v, &root_c2);
            let epsilon = e.scalar(*eps);
            let denom = e.add(&scaled_v, &epsilon);
            let ratio = e.div(&m, &denom);
            let delta = e.mul(&ratio, &step_size);
            (e.sub(&decayed, &delta), vec![m, v])
        }
    };
    e.set_prefix("");
    result
}
