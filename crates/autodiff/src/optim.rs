//! Optimizers written into the training-step graph, with PyTorch's update rules.

use crate::emit::Emitter;

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
            let decayed = if *weight_decay != 0.0 {
                let rate = e.scale(LEARNING_RATE, *weight_decay);
                let one = e.scalar(1.0);
                let factor = e.sub(&one, &rate);
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
            let float = e.float;
            let t = e.cast(STEP, float);
            let one = e.scalar(1.0);
            let mut corrections = Vec::new();
            for beta in [*beta1, *beta2] {
                let b = e.scalar(beta);
                let power = e.op("Pow", &[&b, &t], vec![]);
                corrections.push(e.sub(&one, &power));
            }
            let step_size = e.div(LEARNING_RATE, &corrections[0]);
            let root_v = e.op("Sqrt", &[&v], vec![]);
            let root_c2 = e.op("Sqrt", &[&corrections[1]], vec![]);
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
