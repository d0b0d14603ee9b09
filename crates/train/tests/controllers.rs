//! The seams of the loop: a controller that switches graphs in the middle of an epoch
//! keeps every state tensor (the run is bit for bit the one without the switch), its
//! decisions reach metrics.jsonl and the plot, and its saved state comes back on resume.

mod common;

use edgefreeze_engine::{EngineKind, Value};
use edgefreeze_train::control::{Controller, Opening, Outcome, Saved, StateView, StepReport};
use edgefreeze_train::metrics::{Decision, DecisionKind, read_decisions, read_records};
use edgefreeze_train::step::{GraphSet, StepGraphs};
use edgefreeze_train::{TrainOptions, Trainer};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Switches to the run's own training step after update `at` and logs it; remembers
/// what it was opened with.
struct Switcher {
    at: u64,
    graph: Vec<u8>,
    opened_with: Arc<Mutex<Option<serde_json::Value>>>,
    switches: u64,
}

impl Controller for Switcher {
    fn open(&mut self, opening: Opening<'_>, _: &dyn StateView) -> edgefreeze_train::Result<Outcome> {
        *self.opened_with.lock().unwrap() = opening.saved.map(|s| s.json);
        Ok(Outcome::default())
    }
    fn observes(&self, _: u64) -> bool {
        false
    }
    fn after_step(&mut self, report: &StepReport<'_>, state: &dyn StateView) -> edgefreeze_train::Result<Outcome> {
        if report.step != self.at {
            return Ok(Outcome::default());
        }
        // The controller can read the live state.
        assert!(matches!(state.state("conv1.weight"), Ok(Value::F32(_))));
        self.switches += 1;
        let graphs =
            GraphSet { label: "same graph again".into(), step: StepGraphs::Whole(self.graph.clone()), observing: None };
        let decision = Decision {
            epoch: report.epoch,
            step: report.step,
            kind: DecisionKind::Freeze,
            layer: Some(0),
            depth: 1,
            history: vec![0.5, 0.25],
            reason: "test".into(),
        };
        Ok(Outcome { switch: Some(graphs), decisions: vec![decision] })
    }
    fn save(&mut self) -> edgefreeze_train::Result<Option<Saved>> {
        Ok(Some(Saved {
            json: serde_json::json!({ "switches": self.switches }),
            tensors: vec![("x".into(), Value::scalar_f32(1.5))],
        }))
    }
    fn status(&self) -> Option<String> {
        Some(format!("{} switches", self.switches))
    }
    fn summary(&self) -> Option<String> {
        None
    }
}

fn options() -> TrainOptions {
    TrainOptions { engine: EngineKind::Tract, ..TrainOptions::default() }
}

fn switcher(dir: &Path, at: u64, opened_with: Arc<Mutex<Option<serde_json::Value>>>) -> Box<Switcher> {
    let graph = std::fs::read(dir.join("graphs/train_step.onnx")).unwrap();
    Box::new(Switcher { at, graph, opened_with, switches: 0 })
}

#[test]
fn switching_graphs_mid_epoch_keeps_every_state_tensor() {
    if !common::fashion_mnist_available() {
        return;
    }
    let recipe = common::recipe(2, 32, 0.05, 192, 64);
    let plain = tempfile::tempdir().unwrap();
    common::create(plain.path(), "lenet5", &recipe);
    let mut a = Trainer::open(plain.path(), options()).unwrap();
    a.run().unwrap();

    let switched = tempfile::tempdir().unwrap();
    common::create(switched.path(), "lenet5", &recipe);
    let opened = Arc::new(Mutex::new(None));
    let plot = switched.path().join("curves.png");
    let mut b = Trainer::open_with(
        switched.path(),
        TrainOptions { plot: Some(plot.clone()), ..options() },
        switcher(switched.path(), 3, opened.clone()),
    )
    .unwrap();
    b.run().unwrap();
    assert_eq!(a.state().unwrap(), b.state().unwrap(), "the switch lost or changed state");
    // The switched-out training step was freed: the eval graph and one step remain.
    assert_eq!(b.loaded_graphs(), 2);
    let strip = |p: &Path| {
        read_records(&p.join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .map(|mut v| {
                for k in ["samples_per_s", "train_seconds", "cpu_seconds"] {
                    v.as_object_mut().unwrap().remove(k);
                }
                v
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(plain.path()), strip(switched.path()));
    let decisions = read_decisions(&switched.path().join("metrics.jsonl")).unwrap();
    assert_eq!(decisions.len(), 1);
    assert_eq!(
        (decisions[0].step, decisions[0].kind, decisions[0].history.clone()),
        (3, DecisionKind::Freeze, vec![0.5, 0.25])
    );
    assert!(plot.is_file());

    // Resuming: the controller gets back what it saved with the last checkpoint.
    let mut c = Trainer::open_with(switched.path(), options(), switcher(switched.path(), 3, opened.clone())).unwrap();
    c.run().unwrap();
    assert_eq!(*opened.lock().unwrap(), Some(serde_json::json!({ "switches": 1 })));
}
