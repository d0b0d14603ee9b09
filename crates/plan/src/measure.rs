//! What the cost model predicts from: the device's per-layer compute times, each edge
//! server's link and its step time at each cut, and the bytes each cut sends. All times
//! are seconds, all rates bytes per second, all sizes bytes.

use crate::error::{PlanError, Result, at_least_one, non_negative, positive};
use serde::{Deserialize, Serialize};

/// The time of one call over `n` samples: a fixed cost per call (launching a graph,
/// framing a message) plus a cost per sample.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Affine {
    /// Seconds per call, whatever its size.
    pub fixed_s: f64,
    /// Seconds per sample.
    pub per_sample_s: f64,
}

impl Affine {
    /// The time of a call over `samples` samples.
    pub fn at(self, samples: f64) -> f64 {
        self.fixed_s + self.per_sample_s * samples
    }

    /// The least-squares line through `(samples, seconds)` points, constrained to
    /// non-negative coefficients (a negative fitted slope or intercept is measurement
    /// noise, not a property of the machine: the constrained fit puts it to 0 and refits
    /// the other). Points of a single size give a line through the origin, exact at
    /// that size. `None` without points or with a non-finite or negative one.
    pub fn fit(points: &[(f64, f64)]) -> Option<Affine> {
        if points.is_empty() || points.iter().any(|&(n, t)| !(n.is_finite() && t.is_finite() && n >= 0.0 && t >= 0.0)) {
            return None;
        }
        let k = points.len() as f64;
        let mean_n = points.iter().map(|p| p.0).sum::<f64>() / k;
        let mean_t = points.iter().map(|p| p.1).sum::<f64>() / k;
        let var_n: f64 = points.iter().map(|p| (p.0 - mean_n).powi(2)).sum();
        let through_origin = || {
            let nn: f64 = points.iter().map(|p| p.0 * p.0).sum();
            let nt: f64 = points.iter().map(|p| p.0 * p.1).sum();
            if nn > 0.0 {
                Affine { fixed_s: 0.0, per_sample_s: nt / nn }
            } else {
                Affine { fixed_s: mean_t, per_sample_s: 0.0 }
            }
        };
        // Sizes within a relative 1e-9 of each other are one size.
        if var_n <= 1e-18 * mean_n.max(1.0).powi(2) * k {
            return Some(through_origin());
        }
        let slope = points.iter().map(|p| (p.0 - mean_n) * (p.1 - mean_t)).sum::<f64>() / var_n;
        let intercept = mean_t - slope * mean_n;
        Some(if slope < 0.0 {
            Affine { fixed_s: mean_t, per_sample_s: 0.0 }
        } else if intercept < 0.0 {
            through_origin()
        } else {
            Affine { fixed_s: intercept, per_sample_s: slope }
        })
    }

    fn check(self, field: &dyn Fn() -> String) -> Result<()> {
        non_negative(|| format!("{}: seconds per call", field()), self.fixed_s)?;
        non_negative(|| format!("{}: seconds per sample", field()), self.per_sample_s)?;
        Ok(())
    }
}

/// The device's times for one layer (in the model's layer order, as
/// `edgefreeze inspect` numbers them).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LayerTimes {
    /// Forward seconds per sample.
    pub forward_s: f64,
    /// Backward seconds per sample (parameter and input gradients).
    pub backward_s: f64,
    /// Seconds of the optimizer update of the layer's parameters, once per step.
    pub apply_s: f64,
    /// Seconds this layer adds to every forward run whatever its size (its nodes' fixed
    /// cost per run: a deeper cut's forward graph runs more of them), beyond
    /// [`DeviceTimes::forward_call_s`].
    #[serde(default)]
    pub forward_call_s: f64,
    /// The same for the backward.
    #[serde(default)]
    pub backward_call_s: f64,
}

/// The device's own compute.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceTimes {
    /// Every layer of the model.
    pub layers: Vec<LayerTimes>,
    /// Fixed seconds of one forward graph run, whatever the cut (each layer's own adds to
    /// it: [`LayerTimes::forward_call_s`]).
    pub forward_call_s: f64,
    /// Fixed seconds of one backward graph run.
    pub backward_call_s: f64,
    /// Fixed seconds of one apply-update graph run.
    pub apply_call_s: f64,
}

/// What crosses a cut, per sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CutBytes {
    /// The cut: the boundary after this layer.
    pub cut: usize,
    /// The activation (up; its gradient has the same size, down).
    pub activation: u64,
    /// The label, which goes up with the activation.
    pub label: u64,
}

/// The link to one edge server.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkTimes {
    /// Round-trip time of a small message.
    pub rtt_s: f64,
    /// Device → edge bandwidth.
    pub up_bytes_per_s: f64,
    /// Edge → device bandwidth.
    pub down_bytes_per_s: f64,
}

/// One edge server's times at one cut.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EdgeCutTimes {
    /// The cut.
    pub cut: usize,
    /// The edge step (forward, loss and backward of the edge side) of one micro-batch,
    /// from its arrival to its reply being ready (the edge's own clock).
    pub step: Affine,
    /// The edge's optimizer update, once per step, on the edge's own clock (the cost
    /// model adds the link's round trip of the call).
    pub apply_s: f64,
    /// How much slower each side computed at this cut while the other computed too
    /// (the concurrent probe); a side not measured takes the cost model's default.
    #[serde(default)]
    pub overlap: Overlap,
}

/// Overlap factors as measured: a side's compute time while the other side computes
/// too, over its time alone (1: separate hardware; about 2: one shared core), and the
/// device's while its link carries a micro-batch, and the device's link while it
/// computes ([`crate::overlap`]). `None`: not measured.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Overlap {
    /// The device's forward and backward while the edge steps.
    pub device: Option<f64>,
    /// The edge's step while the device computes.
    pub edge: Option<f64>,
    /// The device's forward and backward while an activation goes up or a gradient
    /// comes down.
    #[serde(default)]
    pub device_link: Option<f64>,
    /// The device's transfers while the device computes.
    #[serde(default)]
    pub link: Option<f64>,
}

/// One edge server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerTimes {
    /// How the user named it (its address).
    pub name: String,
    /// The link to it.
    pub link: LinkTimes,
    /// Its times at the cuts it was probed at.
    pub cuts: Vec<EdgeCutTimes>,
}

impl ServerTimes {
    /// Its times at `cut`, if probed there.
    pub fn at(&self, cut: usize) -> Option<&EdgeCutTimes> {
        self.cuts.iter().find(|c| c.cut == cut)
    }
}

/// Everything the cost model reads.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Measurements {
    /// The device.
    pub device: DeviceTimes,
    /// The candidate cuts and their bytes.
    pub cuts: Vec<CutBytes>,
    /// The candidate edge servers.
    pub servers: Vec<ServerTimes>,
}

impl Measurements {
    /// What crosses `cut`.
    pub fn cut(&self, cut: usize) -> Option<&CutBytes> {
        self.cuts.iter().find(|c| c.cut == cut)
    }

    /// Checks every number and that the parts agree; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let d = &self.device;
        non_negative(|| "device forward seconds per call".into(), d.forward_call_s)?;
        non_negative(|| "device backward seconds per call".into(), d.backward_call_s)?;
        non_negative(|| "device apply seconds per call".into(), d.apply_call_s)?;
        for (i, l) in d.layers.iter().enumerate() {
            non_negative(|| format!("device layer {i}: forward seconds per sample"), l.forward_s)?;
            non_negative(|| format!("device layer {i}: backward seconds per sample"), l.backward_s)?;
            non_negative(|| format!("device layer {i}: apply seconds"), l.apply_s)?;
            non_negative(|| format!("device layer {i}: forward seconds per call"), l.forward_call_s)?;
            non_negative(|| format!("device layer {i}: backward seconds per call"), l.backward_call_s)?;
        }
        for c in &self.cuts {
            // A cut after the last layer would leave the edge nothing to train.
            if c.cut + 1 >= d.layers.len() {
                return Err(PlanError::Inconsistent(format!(
                    "cut {} is not in front of a layer: the device times cover {} layers",
                    c.cut,
                    d.layers.len()
                )));
            }
        }
        for (k, s) in self.servers.iter().enumerate() {
            let field = |what: &str| format!("server {k} ({}): {what}", s.name);
            non_negative(|| field("round-trip seconds"), s.link.rtt_s)?;
            positive(|| field("uplink bytes per second"), s.link.up_bytes_per_s)?;
            positive(|| field("downlink bytes per second"), s.link.down_bytes_per_s)?;
            for c in &s.cuts {
                if self.cut(c.cut).is_none() {
                    return Err(PlanError::Inconsistent(format!(
                        "server {k} ({}) has times at cut {}, which is not a candidate cut",
                        s.name, c.cut
                    )));
                }
                c.step.check(&|| field(&format!("edge step at cut {}", c.cut)))?;
                non_negative(|| field(&format!("edge apply seconds at cut {}", c.cut)), c.apply_s)?;
                let factors = [
                    ("device", c.overlap.device),
                    ("edge", c.overlap.edge),
                    ("device link", c.overlap.device_link),
                    ("link", c.overlap.link),
                ];
                for (side, factor) in factors {
                    if let Some(k) = factor {
                        at_least_one(|| field(&format!("{side} overlap factor at cut {}", c.cut)), k)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_fit_recovers_an_exact_line_and_clamps_noise() {
        let line = Affine::fit(&[(2.0, 0.5 + 2.0 * 0.25), (8.0, 0.5 + 8.0 * 0.25), (4.0, 0.5 + 4.0 * 0.25)]).unwrap();
        assert!((line.fixed_s - 0.5).abs() < 1e-12 && (line.per_sample_s - 0.25).abs() < 1e-12, "{line:?}");
        // One size: through the origin, exact there.
        let one = Affine::fit(&[(4.0, 1.0), (4.0, 3.0)]).unwrap();
        assert_eq!(one, Affine { fixed_s: 0.0, per_sample_s: 0.5 });
        // Time falling with size is noise: a constant.
        let flat = Affine::fit(&[(1.0, 3.0), (2.0, 1.0)]).unwrap();
        assert_eq!(flat, Affine { fixed_s: 2.0, per_sample_s: 0.0 });
        // A negative intercept: refit through the origin (Σnt/Σn² = (1·0.5 + 3·3)/(1 + 9)).
        let origin = Affine::fit(&[(1.0, 0.5), (3.0, 3.0)]).unwrap();
        assert_eq!(origin, Affine { fixed_s: 0.0, per_sample_s: 0.95 });
        assert!(Affine::fit(&[]).is_none());
        assert!(Affine::fit(&[(1.0, f64::NAN)]).is_none());
    }
}
