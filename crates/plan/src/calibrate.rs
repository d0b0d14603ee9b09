//! Calibration from training: the compute the probe measured, scaled by what the run's
//! own steps measure.
//!
//! The concurrent probe measures how much slower each side computes while the other
//! does ([`crate::overlap`]), but the machine's load can change after the probe (the
//! benchmark's two cores are shared with other work). So the compute is re-scaled by the
//! ratio of measured to predicted stage time (the prediction's stages as the step runs
//! them, overlap included), one factor for the device and one for the server it trains
//! with; the links are not (a re-probe measures them again).

use crate::cost::Stages;
use crate::error::{PlanError, Result};
use crate::measure::Measurements;
use serde::{Deserialize, Serialize};

/// Factors by which a run's compute took longer than the prediction said (1: as
/// predicted).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The device's forward, backward and update.
    pub device: f64,
    /// The edge step and update of one server.
    pub edge: f64,
}

impl Calibration {
    /// No correction.
    pub const NONE: Calibration = Calibration { device: 1.0, edge: 1.0 };

    /// From a micro-batch's predicted and measured stages: measured over predicted for
    /// the device's forward and backward together, and for the edge step. A stage
    /// predicted at 0 (a frozen device side has no backward) carries no information and
    /// leaves its factor at 1.
    pub fn from_stages(predicted: &Stages, measured: &Stages) -> Result<Calibration> {
        let ratio = |what: &str, p: f64, m: f64| -> Result<f64> {
            if !(p.is_finite() && m.is_finite() && p >= 0.0 && m >= 0.0) {
                return Err(PlanError::Inconsistent(format!(
                    "calibrating {what}: predicted {p} s and measured {m} s must be finite and non-negative"
                )));
            }
            Ok(if p > 0.0 && m > 0.0 { m / p } else { 1.0 })
        };
        Ok(Calibration {
            device: ratio(
                "the device",
                predicted.device_forward_s + predicted.device_backward_s,
                measured.device_forward_s + measured.device_backward_s,
            )?,
            edge: ratio("the edge", predicted.edge_s, measured.edge_s)?,
        })
    }

    /// `m` with the device's compute times and `server`'s edge times multiplied by the
    /// factors.
    pub fn apply(&self, m: &Measurements, server: usize) -> Result<Measurements> {
        let mut out = m.clone();
        let d = &mut out.device;
        d.forward_call_s *= self.device;
        d.backward_call_s *= self.device;
        d.apply_call_s *= self.device;
        for l in &mut d.layers {
            l.forward_s *= self.device;
            l.backward_s *= self.device;
            l.apply_s *= self.device;
            l.forward_call_s *= self.device;
            l.backward_call_s *= self.device;
        }
        let s = out.servers.get_mut(server).ok_or_else(|| PlanError::Unmeasured(format!("server {server}")))?;
        for c in &mut s.cuts {
            c.step.fixed_s *= self.edge;
            c.step.per_sample_s *= self.edge;
            c.apply_s *= self.edge;
        }
        Ok(out)
    }
}
