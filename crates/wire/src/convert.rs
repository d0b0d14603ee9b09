//! Loss and optimizer descriptions between the wire and the autodiff crate.

use crate::WireError;
use crate::pb;
use edgefreeze_autodiff::{Loss, Optimizer};

/// The wire form of a loss.
pub fn loss_to_wire(loss: &Loss) -> Result<pb::Loss, WireError> {
    use pb::loss::Kind;
    let kind = match loss {
        Loss::CrossEntropy { label_smoothing, ignore_index } => {
            Kind::CrossEntropy(pb::CrossEntropy { label_smoothing: *label_smoothing, ignore_index: *ignore_index })
        }
        Loss::MeanSquaredError => Kind::MeanSquaredError(pb::MeanSquaredError {}),
        Loss::Output => {
            return Err(WireError::message(
                "a model whose output is its loss cannot be split (the edge computes the loss)",
            ));
        }
    };
    Ok(pb::Loss { kind: Some(kind) })
}

/// The loss a wire message describes.
pub fn loss_from_wire(loss: Option<&pb::Loss>) -> Result<Loss, WireError> {
    use pb::loss::Kind;
    match loss.and_then(|l| l.kind.as_ref()) {
        Some(Kind::CrossEntropy(c)) => {
            if !(0.0..1.0).contains(&c.label_smoothing) {
                return Err(WireError::message(format!("label smoothing {} is not in [0, 1)", c.label_smoothing)));
            }
            Ok(Loss::CrossEntropy { label_smoothing: c.label_smoothing, ignore_index: c.ignore_index })
        }
        Some(Kind::MeanSquaredError(_)) => Ok(Loss::MeanSquaredError),
        None => Err(WireError::message("the split request names no loss")),
    }
}

/// The labels of a micro-batch that its mean loss averages over: those not ignored (all
/// of them, of every element, without an ignored label). Each side weights a micro-batch's
/// loss and gradients by this count, so that the step's are the whole batch's mean over
/// its labels: with samples as the weights a micro-batch with many ignored labels would
/// weigh as much as one with none, and the split would not train as the unsplit step.
#[cfg(feature = "engine")]
pub fn counted_labels(loss: &Loss, labels: &edgefreeze_engine::Value) -> f64 {
    match (loss, labels) {
        (Loss::CrossEntropy { ignore_index: Some(ignored), .. }, edgefreeze_engine::Value::I64(a)) => {
            a.iter().filter(|&&l| l != *ignored).count() as f64
        }
        _ => labels.shape().iter().product::<usize>() as f64,
    }
}

/// The wire form of an optimizer.
pub fn optimizer_to_wire(optimizer: &Optimizer) -> pb::Optimizer {
    use pb::optimizer::Kind;
    let kind = match *optimizer {
        Optimizer::Sgd { momentum, nesterov, weight_decay } => Kind::Sgd(pb::Sgd { momentum, nesterov, weight_decay }),
        Optimizer::AdamW { beta1, beta2, eps, weight_decay } => {
            Kind::Adamw(pb::AdamW { beta1, beta2, eps, weight_decay })
        }
    };
    pb::Optimizer { kind: Some(kind) }
}

/// The optimizer a wire message describes.
pub fn optimizer_from_wire(optimizer: Option<&pb::Optimizer>) -> Result<Optimizer, WireError> {
    use pb::optimizer::Kind;
    let finite = |name: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(WireError::message(format!("optimizer {name} {v} is not a finite number ≥ 0")))
        }
    };
    match optimizer.and_then(|o| o.kind.as_ref()) {
        Some(Kind::Sgd(s)) => {
            if s.nesterov && s.momentum <= 0.0 {
                return Err(WireError::message("Nesterov momentum needs momentum > 0"));
            }
            Ok(Optimizer::Sgd {
                momentum: finite("momentum", s.momentum)?,
                nesterov: s.nesterov,
                weight_decay: finite("weight decay", s.weight_decay)?,
            })
        }
        Some(Kind::Adamw(a)) => Ok(Optimizer::AdamW {
            beta1: finite("beta1", a.beta1)?,
            beta2: finite("beta2", a.beta2)?,
            eps: finite("eps", a.eps)?,
            weight_decay: finite("weight decay", a.weight_decay)?,
        }),
        None => Err(WireError::message("the split request names no optimizer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_and_optimizers_round_trip() {
        for loss in [
            Loss::CrossEntropy { label_smoothing: 0.1, ignore_index: None },
            Loss::CrossEntropy { label_smoothing: 0.0, ignore_index: Some(255) },
            Loss::MeanSquaredError,
        ] {
            assert_eq!(loss_from_wire(Some(&loss_to_wire(&loss).unwrap())).unwrap(), loss);
        }
        assert!(loss_to_wire(&Loss::Output).is_err());
        for opt in [
            Optimizer::Sgd { momentum: 0.9, nesterov: true, weight_decay: 5e-4 },
            Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 },
        ] {
            assert_eq!(optimizer_from_wire(Some(&optimizer_to_wire(&opt))).unwrap(), opt);
        }
        assert!(optimizer_from_wire(None).unwrap_err().to_string().contains("no optimizer"));
        let bad = pb::Optimizer {
            kind: Some(pb::optimizer::Kind::Sgd(pb::Sgd { momentum: f64::NAN, ..Default::default() })),
        };
        assert!(optimizer_from_wire(Some(&bad)).is_err());
    }
}
