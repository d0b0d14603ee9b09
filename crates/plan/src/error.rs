//! Typed errors of the cost model and the planner.

/// Measurements or settings the cost model cannot use; each names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A time, rate or size is negative, zero where it divides, or not finite.
    #[error("{field} is {value}: {requirement}")]
    Value {
        /// Which measurement or setting (e.g. `server 1 (edge-b): uplink bytes per second`).
        field: String,
        /// Its value.
        value: f64,
        /// What it must be.
        requirement: &'static str,
    },
    /// Two measurements disagree (per-layer vectors of different lengths, a cut beyond
    /// the layers...).
    #[error("{0}")]
    Inconsistent(String),
    /// A candidate names a server or cut that has no measurement.
    #[error("no measurement for {0}")]
    Unmeasured(String),
    /// Nothing to choose from.
    #[error("no candidate to plan with: {0}")]
    NoCandidate(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, PlanError>;

/// `value` as a checked non-negative finite number.
pub(crate) fn non_negative(field: impl FnOnce() -> String, value: f64) -> Result<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(PlanError::Value { field: field(), value, requirement: "it must be a finite number of at least 0" })
    }
}

/// `value` as a checked positive finite number.
pub(crate) fn positive(field: impl FnOnce() -> String, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(PlanError::Value { field: field(), value, requirement: "it must be a finite number above 0" })
    }
}

/// `value` as a checked overlap factor: finite and at least 1 (a side does not compute
/// faster because the other computes too).
pub(crate) fn at_least_one(field: impl FnOnce() -> String, value: f64) -> Result<f64> {
    if value.is_finite() && value >= 1.0 {
        Ok(value)
    } else {
        Err(PlanError::Value { field: field(), value, requirement: "it must be a finite factor of at least 1" })
    }
}
