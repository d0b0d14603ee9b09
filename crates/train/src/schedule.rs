//! Learning-rate schedules, as a pure function of the update index, so that a resumed
//! run follows exactly the same curve.

use crate::error::{Result, TrainError};

/// How the learning rate decays after the warm-up.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Decay {
    /// The base rate throughout.
    Constant,
    /// Half a cosine from the base rate to zero over the updates after the warm-up.
    Cosine,
    /// The base rate times `gamma` every `every` epochs.
    Step {
        /// Epochs between decays.
        every: usize,
        /// Factor applied at each decay.
        gamma: f64,
    },
}

/// A learning-rate schedule: optional linear warm-up, then a decay.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    /// The base learning rate.
    pub base: f64,
    /// Updates of linear warm-up (the rate of update `t < warmup` is `base * (t+1) / warmup`).
    pub warmup: u64,
    /// The decay after the warm-up.
    pub decay: Decay,
}

impl Schedule {
    /// Parses `constant`, `cosine` or `step[:every=E,gamma=G]` (defaults: every 30 epochs, ×0.1).
    pub fn parse(text: &str, base: f64, warmup: u64) -> Result<Schedule> {
        let (kind, options) = text.split_once(':').unwrap_or((text, ""));
        let mut every = 30usize;
        let mut gamma = 0.1f64;
        for pair in options.split(',').filter(|s| !s.trim().is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| TrainError::Config(format!("schedule option {pair:?}: expected key=value")))?;
            let bad = || TrainError::Config(format!("schedule option {key}={value}: not a valid number"));
            match (kind, key.trim()) {
                ("step", "every") => every = value.trim().parse().map_err(|_| bad())?,
                ("step", "gamma") => gamma = value.trim().parse().map_err(|_| bad())?,
                _ => return Err(TrainError::Config(format!("schedule {kind:?} has no option {key:?}"))),
            }
        }
        let decay = match kind {
            "constant" => Decay::Constant,
            "cosine" => Decay::Cosine,
            "step" => {
                if every == 0 {
                    return Err(TrainError::Config("schedule step: every must be at least 1 epoch".into()));
                }
                Decay::Step { every, gamma }
            }
            other => {
                return Err(TrainError::Config(format!(
                    "unknown schedule {other:?}: use constant, cosine or step:every=E,gamma=G"
                )));
            }
        };
        if !(base.is_finite() && base > 0.0) {
            return Err(TrainError::Config(format!("learning rate {base} must be a positive number")));
        }
        Ok(Schedule { base, warmup, decay })
    }

    /// The rate of update `t` (0-based) of `total`, in epoch `epoch` (0-based).
    pub fn rate(&self, t: u64, total: u64, epoch: usize) -> f64 {
        if t < self.warmup {
            return self.base * (t + 1) as f64 / self.warmup as f64;
        }
        match &self.decay {
            Decay::Constant => self.base,
            Decay::Cosine => {
                let span = total.saturating_sub(self.warmup).max(1) as f64;
                let progress = ((t - self.warmup) as f64 / span).min(1.0);
                self.base * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            Decay::Step { every, gamma } => self.base * gamma.powi((epoch / every) as i32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_starts_at_base_and_ends_near_zero() {
        let s = Schedule::parse("cosine", 0.1, 0).unwrap();
        assert_eq!(s.rate(0, 100, 0), 0.1);
        assert!((s.rate(50, 100, 0) - 0.05).abs() < 1e-12);
        assert!(s.rate(99, 100, 0) < 1e-3);
    }

    #[test]
    fn warmup_is_linear_then_decays() {
        let s = Schedule::parse("cosine", 1.0, 10).unwrap();
        assert!((s.rate(0, 110, 0) - 0.1).abs() < 1e-12);
        assert!((s.rate(9, 110, 0) - 1.0).abs() < 1e-12);
        assert_eq!(s.rate(10, 110, 0), 1.0);
        assert!((s.rate(60, 110, 0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn step_decay_follows_epochs() {
        let s = Schedule::parse("step:every=2,gamma=0.5", 0.4, 0).unwrap();
        assert_eq!(s.rate(0, 10, 0), 0.4);
        assert_eq!(s.rate(5, 10, 1), 0.4);
        assert_eq!(s.rate(6, 10, 2), 0.2);
        assert_eq!(s.rate(9, 10, 4), 0.1);
    }

    #[test]
    fn bad_schedules_are_refused_with_their_text() {
        assert!(Schedule::parse("linear", 0.1, 0).unwrap_err().to_string().contains("\"linear\""));
        assert!(Schedule::parse("step:every=0", 0.1, 0).unwrap_err().to_string().contains("every"));
        assert!(Schedule::parse("cosine:gamma=2", 0.1, 0).unwrap_err().to_string().contains("gamma"));
        assert!(Schedule::parse("constant", -1.0, 0).is_err());
    }
}
