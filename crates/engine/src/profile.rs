//! Where a graph's run time goes: the time of every node of every profiled run, as the
//! engine measured it, and its sum by op type.
//!
//! Both engines report per node: ONNX Runtime through its own profiler (the kernel time
//! of each node, from the JSON trace it writes), tract by timing each node's evaluation
//! in the plan it runs. What a node is called differs: ONNX Runtime names the kernel it
//! ran, which is the ONNX op type unless its optimisers fused nodes (`FusedConv`); tract
//! rewrites the graph into its own ops, named after the ONNX node they came from
//! (`conv3.im2col`), so each tract node is counted under the ONNX op type of that node,
//! or as `tract:<its op>` where it came from none (a node tract added itself).

use crate::EngineError;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One node's time in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTime {
    /// The node, as the engine names it.
    pub node: String,
    /// What it is counted as: the ONNX op type (or ONNX Runtime's fused kernel), see the
    /// module documentation.
    pub op_type: String,
    /// Its time, in microseconds.
    pub micros: f64,
}

/// The node times of each profiled run of one graph, in run order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// One entry per run.
    pub runs: Vec<Vec<NodeTime>>,
}

/// The time of one op type, averaged over runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpTypeTime {
    /// The op type (see [`NodeTime::op_type`]).
    pub op_type: String,
    /// Its mean time per run, in milliseconds.
    pub ms_per_run: f64,
    /// Its fraction of the summed node time.
    pub share: f64,
    /// How many distinct nodes of it ran.
    pub nodes: usize,
}

impl Profile {
    /// The op types by decreasing time over the runs after the first `skip` (warm-up
    /// runs, whose first-run allocations and plan building would weigh in otherwise).
    pub fn by_op_type(&self, skip: usize) -> Vec<OpTypeTime> {
        let runs = &self.runs[skip.min(self.runs.len())..];
        let mut micros: BTreeMap<&str, f64> = BTreeMap::new();
        let mut nodes: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for node in runs.iter().flatten() {
            *micros.entry(&node.op_type).or_default() += node.micros;
            nodes.entry(&node.op_type).or_default().insert(&node.node);
        }
        let total: f64 = micros.values().sum();
        let n = runs.len().max(1) as f64;
        let mut ops: Vec<OpTypeTime> = micros
            .iter()
            .map(|(op, us)| OpTypeTime {
                op_type: op.to_string(),
                ms_per_run: us / n / 1e3,
                share: if total > 0.0 { us / total } else { 0.0 },
                nodes: nodes[op].len(),
            })
            .collect();
        ops.sort_by(|a, b| b.ms_per_run.total_cmp(&a.ms_per_run).then_with(|| a.op_type.cmp(&b.op_type)));
        ops
    }

    /// The summed node time per run after the first `skip`, in milliseconds.
    pub fn node_ms_per_run(&self, skip: usize) -> f64 {
        let runs = &self.runs[skip.min(self.runs.len())..];
        let us: f64 = runs.iter().flatten().map(|n| n.micros).sum();
        us / runs.len().max(1) as f64 / 1e3
    }
}

/// The ONNX op type of each named node of an ONNX model, for naming engine nodes.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpTypes(HashMap<String, String>);

impl OpTypes {
    pub(crate) fn of_model(model: &tract_onnx::pb::ModelProto) -> OpTypes {
        let graph = model.graph.as_ref();
        OpTypes(
            graph
                .into_iter()
                .flat_map(|g| &g.node)
                .filter(|n| !n.name.is_empty())
                .map(|n| (n.name.clone(), n.op_type.clone()))
                .collect(),
        )
    }

    /// The op type of the ONNX node an engine node came from: the node of that name, or
    /// of the longest prefix of it ending before a `.` (tract names the nodes it derives
    /// from `conv3` `conv3.im2col`, `conv3.matmul`...; ONNX names may hold dots too, so
    /// the whole name is tried first).
    pub(crate) fn of_node(&self, name: &str) -> Option<&str> {
        let mut candidate = name;
        loop {
            if let Some(op) = self.0.get(candidate) {
                return Some(op);
            }
            candidate = &candidate[..candidate.rfind('.')?];
        }
    }
}

/// Parses the JSON trace ONNX Runtime's profiler writes into runs: each `Node` event
/// whose name ends in `_kernel_time` is a node's kernel time, and belongs to the
/// `model_run` event whose interval holds its start.
pub(crate) fn parse_ort_trace(json: &str) -> Result<Profile, EngineError> {
    #[derive(serde::Deserialize)]
    struct Event {
        #[serde(default)]
        cat: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        ts: f64,
        #[serde(default)]
        dur: f64,
        #[serde(default)]
        args: HashMap<String, serde_json::Value>,
    }
    let events: Vec<Event> =
        serde_json::from_str(json).map_err(|e| EngineError::Ort(format!("cannot read ONNX Runtime's profile: {e}")))?;
    let mut runs: Vec<(f64, f64)> =
        events.iter().filter(|e| e.cat == "Session" && e.name == "model_run").map(|e| (e.ts, e.ts + e.dur)).collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut profile = Profile { runs: vec![Vec::new(); runs.len()] };
    for e in events.iter().filter(|e| e.cat == "Node") {
        let Some(node) = e.name.strip_suffix("_kernel_time") else { continue };
        let Some(run) = runs.iter().position(|(start, end)| *start <= e.ts && e.ts <= *end) else { continue };
        let op_type = e.args.get("op_name").and_then(|v| v.as_str()).unwrap_or("unknown").to_string();
        profile.runs[run].push(NodeTime { node: node.to_string(), op_type, micros: e.dur });
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, op: &str, micros: f64) -> NodeTime {
        NodeTime { node: name.into(), op_type: op.into(), micros }
    }

    #[test]
    fn sums_by_op_type_after_the_warm_up_runs() {
        let profile = Profile {
            runs: vec![
                vec![node("a", "Conv", 1000.0)], // warm-up: left out
                vec![node("a", "Conv", 300.0), node("b", "Conv", 100.0), node("c", "Relu", 100.0)],
                vec![node("a", "Conv", 500.0), node("b", "Conv", 100.0), node("c", "Relu", 100.0)],
            ],
        };
        let ops = profile.by_op_type(1);
        assert_eq!(ops.len(), 2);
        assert_eq!((ops[0].op_type.as_str(), ops[0].nodes), ("Conv", 2));
        assert!((ops[0].ms_per_run - 0.5).abs() < 1e-12 && (ops[0].share - 1000.0 / 1200.0).abs() < 1e-12);
        assert_eq!((ops[1].op_type.as_str(), ops[1].nodes), ("Relu", 1));
        assert!((profile.node_ms_per_run(1) - 0.6).abs() < 1e-12);
        assert!(profile.by_op_type(5).is_empty());
    }

    #[test]
    fn engine_nodes_take_the_op_type_of_the_onnx_node_they_came_from() {
        let types = OpTypes(
            [("conv3", "Conv"), ("/layer1/layer1.0/conv1/Conv", "Conv"), ("relu", "Relu")]
                .into_iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        );
        assert_eq!(types.of_node("conv3.im2col"), Some("Conv"));
        assert_eq!(types.of_node("conv3"), Some("Conv"));
        assert_eq!(types.of_node("/layer1/layer1.0/conv1/Conv.pack"), Some("Conv"));
        assert_eq!(types.of_node("relu.1.x"), Some("Relu"));
        assert_eq!(types.of_node("conv"), None);
        assert_eq!(types.of_node("added.by.tract"), None);
    }

    #[test]
    fn reads_onnx_runtime_traces_into_runs() {
        let trace = r#"[
          {"cat":"Session","name":"model_loading_array","ts":1,"dur":5,"args":{}},
          {"cat":"Session","name":"model_run","ts":100,"dur":50,"args":{}},
          {"cat":"Node","name":"conv_fence_before","ts":101,"dur":0,"args":{"op_name":"Conv"}},
          {"cat":"Node","name":"conv_kernel_time","ts":101,"dur":30,"args":{"op_name":"Conv"}},
          {"cat":"Node","name":"relu_kernel_time","ts":132,"dur":10,"args":{"op_name":"Relu"}},
          {"cat":"Session","name":"model_run","ts":200,"dur":40,"args":{}},
          {"cat":"Node","name":"conv_kernel_time","ts":201,"dur":20,"args":{"op_name":"FusedConv"}}
        ]"#;
        let profile = parse_ort_trace(trace).unwrap();
        assert_eq!(
            profile.runs,
            vec![vec![node("conv", "Conv", 30.0), node("relu", "Relu", 10.0)], vec![node("conv", "FusedConv", 20.0)]]
        );
        let bad = parse_ort_trace("{not json").unwrap_err().to_string();
        assert!(bad.contains("cannot read ONNX Runtime's profile"), "{bad}");
    }
}
