//! The part of a model between named values: the one piece of graph surgery the other
//! rewrites are built from.

use crate::batch::BatchForms;
use crate::error::{Result, RewriteError};
use edgefreeze_graph::infer::infer;
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use std::collections::{HashMap, HashSet};

/// Every value name of a model: node outputs, graph inputs, initializers.
pub fn value_names(graph: &Graph) -> HashSet<&str> {
    graph
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter())
        .map(String::as_str)
        .chain(graph.inputs.iter().map(|v| v.name.as_str()))
        .chain(graph.initializers.keys().map(String::as_str))
        .filter(|s| !s.is_empty())
        .collect()
}

/// Which nodes (by index, in a topologically sorted graph) the values `outputs` depend
/// on when the values in `given` are known, and every value they read.
pub fn needed_nodes<'a>(
    graph: &'a Graph,
    outputs: impl IntoIterator<Item = &'a str>,
    given: &HashSet<&str>,
) -> (Vec<bool>, HashSet<&'a str>) {
    let mut needed: HashSet<&str> = outputs.into_iter().collect();
    let mut keep = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if node.outputs.iter().any(|o| needed.contains(o.as_str()) && !given.contains(o.as_str())) {
            keep[i] = true;
            needed.extend(node.inputs.iter().map(String::as_str).filter(|v| !v.is_empty() && !given.contains(v)));
        }
    }
    (keep, needed)
}

/// The part of `model` that computes `outputs` when the values in `inputs` are given.
///
/// Each `(value, name)` of `inputs` becomes a graph input `name` (typed like the value)
/// and nothing in front of it is kept; each `(value, name)` of `outputs` becomes graph
/// output `name`. The model's own graph inputs and initializers that the part reads stay
/// what they are. A new name that is already another value of the model is an error.
pub fn extract(model: &Model, name: &str, inputs: &[(String, String)], outputs: &[(String, String)]) -> Result<Model> {
    let graph = &model.graph;
    let types = infer(graph, model.opset())?;
    let existing = value_names(graph);
    for (value, new) in inputs.iter().chain(outputs) {
        if value != new && existing.contains(new.as_str()) {
            return Err(RewriteError::NameTaken(new.clone()));
        }
    }
    let given: HashMap<&str, &str> = inputs.iter().map(|(v, n)| (v.as_str(), n.as_str())).collect();
    let stop: HashSet<&str> = given.keys().copied().collect();
    let (keep, needed) = needed_nodes(graph, outputs.iter().map(|(v, _)| v.as_str()), &stop);
    // A value is renamed to its first output name; further names of it are copies.
    // Only values the part computes are renamed; graph inputs and constants are copied.
    let computed: HashSet<&str> = graph
        .nodes
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .flat_map(|(n, _)| n.outputs.iter().map(String::as_str))
        .collect();
    let mut rename: HashMap<&str, &str> = given.clone();
    for (v, n) in outputs.iter().filter(|(v, _)| computed.contains(v.as_str())) {
        rename.entry(v.as_str()).or_insert(n.as_str());
    }
    let renamed = |v: &String| rename.get(v.as_str()).map_or_else(|| v.clone(), |n| n.to_string());
    let mut nodes: Vec<Node> = Vec::new();
    for (node, _) in graph.nodes.iter().zip(&keep).filter(|(_, k)| **k) {
        let mut node = node.clone();
        for v in node.inputs.iter_mut().chain(node.outputs.iter_mut()) {
            *v = renamed(v);
        }
        nodes.push(node);
    }
    let produced: HashSet<String> = nodes.iter().flat_map(|n| n.outputs.iter().cloned()).collect();
    let typed = |value: &str, name: &str| -> Result<ValueInfo> {
        let t = types.types.get(value).ok_or_else(|| RewriteError::NoValue(value.to_string()))?;
        Ok(ValueInfo { name: name.to_string(), ..t.clone() })
    };
    let mut graph_outputs = Vec::new();
    for (value, new) in outputs {
        if !produced.contains(new) {
            // A given value, a constant, or a value with another output name: copied.
            let source = renamed(value);
            if !produced.contains(&source) && !given.contains_key(value.as_str()) && !existing.contains(value.as_str())
            {
                return Err(RewriteError::NoValue(value.clone()));
            }
            nodes.push(Node::new(format!("output/{new}"), "Identity", &[&source], &[new]));
        }
        graph_outputs.push(typed(value, new)?);
    }
    let mut graph_inputs = Vec::new();
    let mut unnamed = 0;
    let mut forms: Option<Option<BatchForms>> = None;
    for (value, new) in inputs {
        let mut v = typed(value, new)?;
        // A dimension inference could not name (`B·heads` of an attention) is named by
        // its batch expression (`2*batch`), which tract needs to check the shape
        // arithmetic it reads; failing that, a symbol of its own.
        for (k, d) in v.shape.iter_mut().flatten().enumerate() {
            if *d == Dim::Unknown {
                let forms = forms.get_or_insert_with(|| BatchForms::of(model));
                *d = match forms.as_ref().and_then(|f| f.named(value, k)) {
                    Some(named) => named,
                    None => {
                        unnamed += 1;
                        Dim::Symbol(format!("unnamed_dim_{unnamed}"))
                    }
                };
            }
        }
        graph_inputs.push(v);
    }
    graph_inputs.extend(graph.inputs.iter().filter(|v| needed.contains(v.name.as_str())).cloned());
    let part = Graph {
        name: name.to_string(),
        nodes,
        inputs: graph_inputs,
        outputs: graph_outputs,
        initializers: graph
            .initializers
            .iter()
            .filter(|(k, _)| needed.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        initializer_inputs: graph
            .initializer_inputs
            .iter()
            .filter(|v| needed.contains(v.name.as_str()))
            .cloned()
            .collect(),
        ..Default::default()
    };
    let mut out = Model {
        ir_version: model.ir_version,
        opset_imports: model.opset_imports.clone(),
        producer_name: model.producer_name.clone(),
        producer_version: model.producer_version.clone(),
        domain: model.domain.clone(),
        model_version: model.model_version,
        doc_string: model.doc_string.clone(),
        metadata: model.metadata.clone(),
        graph: part,
        functions: model.functions.clone(),
        training_info: Vec::new(),
    };
    edgefreeze_graph::sort::sort_topologically(&mut out.graph)?;
    edgefreeze_graph::record_types(&mut out)?;
    Ok(out)
}
