//! Re-planning while training: the device trainer's [`Adapter`] built on the probe and
//! the planner.
//!
//! After every update it records the measured step time. Every `check_every` updates it
//! compares the median of the last `window` steps with the prediction the run trains
//! under ([`edgefreeze_plan::decide`]): within the policy's drift it stays; beyond it, it
//! re-probes the links of every server (their round trip and bandwidth change when the
//! device moves; the device's and the edges' compute times are kept from the first
//! probe), plans again and moves when a candidate saves more over the remaining steps
//! than the move costs (moving the edge state through the device, or the layers that
//! change sides). A re-probe that finds nothing better re-bases the prediction on the
//! fresh measurements. With `reprobe_every` it also re-probes on a period, drift or not:
//! the step it trains at cannot show that *another* server's link got better (the device
//! came near it), only a fresh measurement of that link can.

use crate::device::median;
use crate::{ProbeSettings, Target, probe_links};
use edgefreeze_device::trainer::{Adapter, Move, StepSeen};
use edgefreeze_plan::{
    Calibration, Candidate, CostModel, Decision, Measurements, Mode, Plan, Prediction, ReplanPolicy, Space, Workload,
    decide, migration_s, recut_s,
};
use edgefreeze_train::metrics::StageTimes;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// When and how to re-plan.
#[derive(Debug, Clone)]
pub struct AdaptSettings {
    /// The rule's constants.
    pub policy: ReplanPolicy,
    /// Updates between checks.
    pub check_every: u64,
    /// Updates between re-probes made whatever the drift (None: only on drift). Checked
    /// at the checks, so a period shorter than `check_every` re-probes at every check.
    pub reprobe_every: Option<u64>,
    /// Steps whose median is the measured step time (at most `check_every`).
    pub window: usize,
    /// Time budget of one link re-probe.
    pub reprobe_budget: Duration,
    /// Seconds a move costs besides moving its bytes (opening the session, building the
    /// edge side).
    pub setup_s: f64,
}

impl Default for AdaptSettings {
    fn default() -> AdaptSettings {
        AdaptSettings {
            policy: ReplanPolicy::default(),
            check_every: 10,
            reprobe_every: None,
            window: 5,
            reprobe_budget: Duration::from_secs(10),
            setup_s: 0.5,
        }
    }
}

/// The planner behind a training run.
pub struct Replanner {
    settings: AdaptSettings,
    probe: ProbeSettings,
    targets: Vec<Target>,
    model: CostModel,
    measurements: Measurements,
    workload: Workload,
    space: Space,
    /// Bytes of edge state at each cut (moving it costs), and of each cut's device state.
    state_bytes: Box<dyn Fn(usize) -> (u64, u64) + Send>,
    current: Candidate,
    predicted_s: f64,
    predicted_stages: Option<StageTimes>,
    /// The last `window` steps: (step seconds, the device's measured forward + backward
    /// per micro-batch).
    steps: VecDeque<(f64, f64)>,
    last_check: u64,
    /// The update of the last re-probe (0: the first probe, before training).
    last_reprobe: u64,
    notes: Vec<String>,
}

impl Replanner {
    /// A re-planner for a run that trains `current` under `plan` (made from
    /// `measurements` of `targets`, in the order the run lists its servers).
    /// `state_bytes(cut)` is (edge state, device state) at that cut.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: AdaptSettings,
        probe: ProbeSettings,
        targets: Vec<Target>,
        model: CostModel,
        measurements: Measurements,
        workload: Workload,
        space: Space,
        plan: &Plan,
        current: Candidate,
        state_bytes: Box<dyn Fn(usize) -> (u64, u64) + Send>,
    ) -> Replanner {
        let now = plan.candidates.iter().find(|p| p.candidate == current);
        let predicted_s = now.map_or(plan.chosen().step_s, |p| p.step_s);
        let predicted_stages = now.map(stage_times);
        Replanner {
            settings,
            probe,
            targets,
            model,
            measurements,
            workload,
            space,
            state_bytes,
            current,
            predicted_s,
            predicted_stages,
            steps: VecDeque::new(),
            last_check: 0,
            last_reprobe: 0,
            notes: Vec::new(),
        }
    }

    /// The step time the run is predicted to take now.
    pub fn predicted_s(&self) -> f64 {
        self.predicted_s
    }

    /// The links measured again; servers that do not answer keep their old times.
    fn reprobe(&mut self) -> Plan {
        let sizes: Vec<usize> = self.probe.sizes().unwrap_or_else(|_| vec![self.workload.batch]);
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for c in &self.measurements.cuts {
            for &n in &sizes {
                up.push((n as u64 * (c.activation + c.label)).min(self.probe.max_payload_bytes));
                down.push((n as u64 * c.activation).min(self.probe.max_payload_bytes));
            }
        }
        up.sort_unstable();
        up.dedup();
        down.sort_unstable();
        down.dedup();
        let started = Instant::now();
        let deadline = started + self.settings.reprobe_budget;
        match probe_links(&self.targets, &up, &down, &self.probe, deadline) {
            Ok(links) => {
                for (server, link) in self.measurements.servers.iter_mut().zip(links) {
                    match link {
                        Ok(probe) => server.link = probe.times,
                        Err(e) => self.notes.push(format!("re-probe: {}: {e}", server.name)),
                    }
                }
            }
            Err(e) => self.notes.push(format!("re-probe: {e}")),
        }
        self.notes.push(format!("re-probed the links in {:.2} s", started.elapsed().as_secs_f64()));
        // The device's compute calibrated from the run's own steps: it is the same whichever
        // server or cut is chosen, so every candidate is corrected alike. The edge's is
        // not: correcting only the server trained with would favour the others.
        let measurements = match self.device_calibration() {
            Some(c) => {
                self.notes.push(format!("the device's compute calibrated by {:.2}x from the run's steps", c.device));
                c.apply(&self.measurements, self.current.server).unwrap_or_else(|_| self.measurements.clone())
            }
            None => self.measurements.clone(),
        };
        match edgefreeze_plan::plan(&self.model, &measurements, &self.workload, &self.space) {
            Ok(plan) => plan,
            Err(e) => {
                self.notes.push(format!("re-plan failed: {e}"));
                Plan { candidates: Vec::new(), choice: 0 }
            }
        }
    }

    /// The device's factor: its median measured forward + backward over the window
    /// against the probe's prediction for the current candidate (None without either).
    fn device_calibration(&self) -> Option<Calibration> {
        if self.steps.is_empty() {
            return None;
        }
        let predicted = self.model.predict(&self.measurements, &self.workload, &self.current).ok()?;
        let measured = median(self.steps.iter().map(|s| s.1).collect());
        let p = predicted.stages.device_forward_s + predicted.stages.device_backward_s;
        (measured > 0.0 && p > 0.0).then(|| Calibration { device: measured / p, edge: 1.0 })
    }

    /// Seconds moving from the current candidate to `to` costs.
    fn move_cost(&self, to: &Candidate) -> f64 {
        let (from, target) = (self.current.server, to.server);
        let links = |i: usize| self.measurements.servers.get(i).map(|s| s.link);
        let (Some(from_link), Some(to_link)) = (links(from), links(target)) else { return f64::INFINITY };
        let (edge_now, device_now) = (self.state_bytes)(self.current.cut);
        let (_, device_then) = (self.state_bytes)(to.cut);
        let mut cost = 0.0;
        if from != target || to.micro_batches != self.current.micro_batches {
            cost += migration_s(edge_now, &from_link, &to_link, self.settings.setup_s);
        }
        if to.cut != self.current.cut {
            let moved = device_now.abs_diff(device_then);
            cost += recut_s(moved, device_then < device_now, &to_link, self.settings.setup_s);
        }
        cost
    }
}

impl Adapter for Replanner {
    fn after_step(&mut self, seen: &StepSeen) -> Option<Move> {
        // The run's own view of where it is (a fail-over may have moved it).
        let server = seen.server?;
        self.current = Candidate { server, cut: seen.cut, micro_batches: seen.micro_batches, ..self.current };
        let stages = edgefreeze_device::stages::measured(seen.times, seen.seconds);
        self.steps.push_back((seen.seconds, stages.device_forward_s + stages.device_backward_s));
        let window = self.settings.window.clamp(1, self.settings.check_every.max(1) as usize);
        while self.steps.len() > window {
            self.steps.pop_front();
        }
        if self.steps.len() < window || seen.step < self.last_check + self.settings.check_every.max(1) {
            return None;
        }
        self.last_check = seen.step;
        let current = edgefreeze_plan::Current {
            candidate: self.current,
            predicted_s: self.predicted_s,
            measured_s: median(self.steps.iter().map(|s| s.0).collect()),
            remaining_steps: seen.total_steps.saturating_sub(seen.step),
        };
        let period = self.settings.reprobe_every.filter(|&e| seen.step >= self.last_reprobe + e.max(1));
        let drifted = match decide(&self.settings.policy, &current, None, |_| 0.0) {
            Ok(Decision::Reprobe { .. }) => true,
            Ok(_) => false,
            Err(e) => {
                self.notes.push(format!("re-planning: {e}"));
                return None;
            }
        };
        if !drifted && period.is_none() {
            return None;
        }
        let drift = (current.measured_s - current.predicted_s) / current.predicted_s;
        // Why it re-probes, for the log and the reason of a move.
        let why = match period {
            Some(every) if !drifted => format!(
                "a periodic re-probe (every {every} updates; the measured step is {:+.0}% off its prediction)",
                drift * 100.0
            ),
            _ => format!("the measured step drifted {:+.0}% from its prediction", drift * 100.0),
        };
        self.notes.push(format!(
            "update {}: measured step {:.1} ms, predicted {:.1} ms: re-probing for {why}",
            seen.step,
            current.measured_s * 1e3,
            current.predicted_s * 1e3
        ));
        self.last_reprobe = seen.step;
        let fresh = self.reprobe();
        let decision = decide(&self.settings.policy, &current, Some(&fresh), |c| self.move_cost(c));
        // Whatever is decided, later checks compare with the fresh prediction.
        self.steps.clear();
        match decision {
            Ok(Decision::Move { to, current_s, candidate_s, gain_s, cost_s })
                if matches!(to.mode, Mode::Pipelined(_)) =>
            {
                self.predicted_s = candidate_s;
                self.predicted_stages = fresh.candidates.iter().find(|p| p.candidate == to).map(stage_times);
                self.current = to;
                let name = |i: usize| self.measurements.servers.get(i).map_or("?".to_string(), |s| s.name.clone());
                Some(Move {
                    server: to.server,
                    cut: to.cut,
                    micro_batches: to.micro_batches,
                    reason: format!(
                        "{why}; re-probed, {} at cut {} with M={} is predicted at {:.1} ms a step instead of {:.1} \
                         ms, saving {gain_s:.2} s over the remaining {} updates for a move of {cost_s:.2} s",
                        name(to.server),
                        to.cut,
                        to.micro_batches,
                        candidate_s * 1e3,
                        current_s * 1e3,
                        current.remaining_steps
                    ),
                })
            }
            Ok(_) => {
                if let Some(p) = fresh.candidates.iter().find(|p| p.candidate == self.current) {
                    self.predicted_s = p.step_s;
                    self.predicted_stages = Some(stage_times(p));
                }
                self.notes.push(format!(
                    "update {}: no move saves more than it costs; predicted step now {:.1} ms",
                    seen.step,
                    self.predicted_s * 1e3
                ));
                None
            }
            Err(e) => {
                self.notes.push(format!("re-planning: {e}"));
                None
            }
        }
    }

    fn notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    fn predicted_s(&self) -> Option<f64> {
        Some(self.predicted_s)
    }

    fn predicted_stages(&self) -> Option<StageTimes> {
        self.predicted_stages
    }
}

/// A prediction's stages as the device measures them (`edgefreeze_device::stages`): a
/// crossing's time is its occupancy and its latency.
pub fn stage_times(p: &Prediction) -> StageTimes {
    let s = &p.stages;
    StageTimes {
        step_s: p.step_s,
        device_forward_s: s.device_forward_s,
        uplink_s: s.up_s + s.latency_s,
        edge_s: s.edge_s,
        downlink_s: s.down_s + s.latency_s,
        device_backward_s: s.device_backward_s,
        device_update_s: p.device_apply_s,
        edge_update_s: p.edge_apply_s,
    }
}
