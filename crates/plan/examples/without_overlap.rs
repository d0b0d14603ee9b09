//! The chosen candidate of an `edgefreeze plan --json` output predicted again with the
//! overlap factors the probe measured and with every factor 1 (the apart probe's
//! prediction), to show what the factors change.
//!
//! usage: cargo run --example without_overlap -p edgefreeze-plan -- PLAN.json

use edgefreeze_plan::{Candidate, CostModel, Measurements, Overlap, Workload};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: without_overlap PLAN.json")?;
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let measured: Measurements = serde_json::from_value(json["probe"]["measurements"].clone())?;
    let model: CostModel = serde_json::from_value(json["cost_model"].clone())?;
    let workload: Workload = serde_json::from_value(json["workload"].clone())?;
    let candidate: Candidate = serde_json::from_value(json["choice"]["candidate"].clone())?;
    let mut apart = measured.clone();
    for s in &mut apart.servers {
        for c in &mut s.cuts {
            c.overlap = Overlap::default();
        }
    }
    let with = model.predict(&measured, &workload, &candidate)?;
    let without = model.predict(&apart, &workload, &candidate)?;
    let factors = |o: &edgefreeze_plan::OverlapFactors| {
        format!("{:.2}/{:.2}/{:.2}/{:.2}", o.device, o.edge, o.device_link, o.link)
    };
    println!(
        "cut {}, M = {}: {:.0} ms with the measured overlap factors (device/edge/device link) {}, {:.0} ms with {}",
        candidate.cut,
        candidate.micro_batches,
        with.step_s * 1e3,
        factors(&with.overlap),
        without.step_s * 1e3,
        factors(&without.overlap)
    );
    Ok(())
}
