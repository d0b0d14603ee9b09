//! The cross-entropy loss stays finite however far apart the logits are, on every engine:
//! tract's LogSoftmax is −∞ where a probability underflows in float32, and the loss once
//! multiplied that by the zero target of every other class (NaN).

use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, prepare};
use ndarray::{ArrayD, IxDyn};

#[test]
fn cross_entropy_of_logits_far_apart_is_finite_and_exact() {
    let mut graph = Graph { name: "logits".into(), ..Default::default() };
    graph.inputs.push(ValueInfo::new("x", DataType::Float32, vec![Dim::Symbol("batch".into()), Dim::Fixed(3)]));
    graph.initializers.insert("w".into(), Tensor::from_f32(vec![3], &[1.0; 3]).unwrap());
    graph.nodes.push(Node::new("scale", "Mul", &["x", "w"], &["logits"]));
    graph.outputs.push(ValueInfo { name: "logits".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
        .unwrap();
    let grad = gradient_graph(&model, &Loss::cross_entropy(), &[]).unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    // exp(-227) and exp(-150) are 0 in float32 (and float64 keeps them): the first row's
    // label is its largest logit, the second's is 227 below it.
    let logits = [[0.0f32, -150.0, 77.0], [0.0, 77.0, -150.0], [1.0, 2.0, 3.0]];
    let labels = [2i64, 2, 0];
    let expected: f64 = logits
        .iter()
        .zip(labels)
        .map(|(row, label)| {
            let max = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            lse - row[label as usize] as f64
        })
        .sum::<f64>()
        / 3.0;
    let x = Value::F32(ArrayD::from_shape_vec(IxDyn(&[3, 3]), logits.concat()).unwrap());
    let y = Value::I64(ArrayD::from_shape_vec(IxDyn(&[3]), labels.to_vec()).unwrap());
    let w = Value::F32(ArrayD::from_elem(IxDyn(&[3]), 1.0));
    for kind in [EngineKind::Ort(Provider::Cpu), EngineKind::Tract] {
        let mut session = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()).unwrap();
        let names = session.input_names().to_vec();
        let feeds: Vec<(&str, &Value)> = names
            .iter()
            .map(|n| {
                (
                    n.as_str(),
                    match n.as_str() {
                        "x" => &x,
                        "w" => &w,
                        _ => &y,
                    },
                )
            })
            .collect();
        let out = session.run(&feeds).unwrap();
        let at = |name: &str| session.output_names().iter().position(|o| o == name).unwrap();
        let loss = out[at("loss")].as_f32().unwrap().iter().copied().next().unwrap() as f64;
        assert!((loss - expected).abs() <= 1e-6 * expected, "{kind}: loss {loss}, float64 {expected}");
        let g: Vec<f32> = out[at("grad.w")].as_f32().unwrap().iter().copied().collect();
        assert!(g.iter().all(|v| v.is_finite()), "{kind}: {g:?}");
    }
}

/// Logits `w` of shape `dims` (a parameter, so that the gradient graph returns d loss /
/// d logits) in `float`, through `Identity`.
fn logits_model(dims: &[usize], values: &[f64], float: DataType) -> Model {
    let mut graph = Graph { name: "per_label".into(), ..Default::default() };
    graph.initializers.insert("w".into(), Tensor::from_f64_as(float, dims.to_vec(), values).unwrap());
    graph.nodes.push(Node::new("logits", "Identity", &["w"], &["logits"]));
    graph.outputs.push(ValueInfo::new("logits", float, dims.iter().map(|&d| Dim::Fixed(d)).collect()));
    prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() }).unwrap()
}

/// PyTorch's `F.cross_entropy(w, labels, ignore_index, label_smoothing)` in float64 for
/// logits `[N, K, rest]` (rest flattened), with its gradient: the mean over the counted
/// labels, (softmax − targets) / count at each counted position, and the correct count.
fn reference(dims: &[usize], w: &[f64], labels: &[i64], ignore: Option<i64>, eps: f64) -> (f64, Vec<f64>, f64) {
    let (n, k) = (dims[0], dims[1]);
    let rest: usize = dims[2..].iter().product();
    let counted = labels.iter().filter(|&&l| Some(l) != ignore).count();
    let denominator = counted.max(1) as f64;
    let (mut loss, mut grad, mut right) = (0.0, vec![0.0; w.len()], 0.0);
    for s in 0..n {
        for at in 0..rest {
            let label = labels[s * rest + at];
            if Some(label) == ignore {
                continue;
            }
            let logit = |c: usize| w[(s * k + c) * rest + at];
            let max = (0..k).map(logit).fold(f64::MIN, f64::max);
            let lse = max + (0..k).map(|c| (logit(c) - max).exp()).sum::<f64>().ln();
            let best = (0..k).fold(0, |b, c| if logit(c) > logit(b) { c } else { b });
            right += f64::from(best as i64 == label);
            for c in 0..k {
                let target = (1.0 - eps) * f64::from(c as i64 == label) + eps / k as f64;
                loss -= target * (logit(c) - lse);
                grad[(s * k + c) * rest + at] = ((logit(c) - lse).exp() - target) / denominator;
            }
        }
    }
    (loss / denominator, grad, right / denominator * n as f64)
}

/// (loss and gradient of the gradient graph, the eval graph's correct count).
fn run_loss(kind: &EngineKind, model: &Model, loss: &Loss, labels: &Value) -> (f64, Vec<f64>, f64) {
    let grad = gradient_graph(model, loss, &[]).unwrap();
    let (loss_value, grad_w) = run_graph(kind, model, &grad, labels, &["loss", "grad.w"]);
    let eval = edgefreeze_autodiff::training::eval_graph(model, loss).unwrap();
    let (correct, _) = run_graph(kind, model, &eval, labels, &["correct", "loss"]);
    (loss_value[0], grad_w, correct[0])
}

fn run_graph(
    kind: &EngineKind,
    model: &Model,
    graph: &Model,
    labels: &Value,
    wanted: &[&str; 2],
) -> (Vec<f64>, Vec<f64>) {
    let bytes = edgefreeze_graph::save::encode_model(graph);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default()).unwrap();
    let names = session.input_names().to_vec();
    let w = match model.graph.initializers["w"].dtype() {
        DataType::Float64 => Value::F64(
            ArrayD::from_shape_vec(
                IxDyn(model.graph.initializers["w"].dims()),
                model.graph.initializers["w"].to_f64_vec().unwrap(),
            )
            .unwrap(),
        ),
        _ => Value::F32(
            ArrayD::from_shape_vec(
                IxDyn(model.graph.initializers["w"].dims()),
                model.graph.initializers["w"].to_f32_vec().unwrap(),
            )
            .unwrap(),
        ),
    };
    let feeds: Vec<(&str, &Value)> = names.iter().map(|n| (n.as_str(), if n == "w" { &w } else { labels })).collect();
    let out = session.run(&feeds).unwrap();
    let at = |name: &str| {
        &out[session
            .output_names()
            .iter()
            .position(|o| o == name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", session.output_names()))]
    };
    let numbers = |v: &Value| -> Vec<f64> {
        match v {
            Value::F64(a) => a.iter().copied().collect(),
            Value::F32(a) => a.iter().map(|&x| x as f64).collect(),
            Value::I64(a) => a.iter().map(|&x| x as f64).collect(),
            other => panic!("{other:?}"),
        }
    };
    (numbers(at(wanted[0])), numbers(at(wanted[1])))
}

/// Per-pixel and per-position cross-entropy, with an ignored label and smoothing, against
/// PyTorch's definition in float64 (loss, gradient, accuracy), evaluated in float64 on
/// ONNX Runtime and in float32 on tract; and the gradient against central differences of
/// the graph's own float64 loss.
#[test]
fn cross_entropy_per_label_with_ignored_labels_is_pytorchs() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut draw = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    // (logit dims, ignored label, smoothing, share of labels ignored)
    let cases: [(&[usize], Option<i64>, f64, f64); 5] = [
        (&[2, 3, 2, 4], Some(255), 0.1, 0.25),
        (&[3, 4, 5], None, 0.0, 0.0),
        (&[4, 5], Some(-100), 0.0, 0.3),
        (&[2, 3, 2, 2], Some(1), 0.05, 0.0),
        (&[2, 3, 2, 2], Some(255), 0.0, 1.0),
    ];
    for (dims, ignore, eps, share) in cases {
        let k = dims[1] as i64;
        let values: Vec<f64> = (0..dims.iter().product::<usize>()).map(|_| 4.0 * draw() - 2.0).collect();
        let label_dims: Vec<usize> = std::iter::once(dims[0]).chain(dims[2..].iter().copied()).collect();
        let labels: Vec<i64> = (0..label_dims.iter().product::<usize>())
            .map(|_| match ignore {
                Some(i) if draw() < share => i,
                _ => ((draw() * k as f64) as i64).min(k - 1),
            })
            .collect();
        let loss = Loss::CrossEntropy { label_smoothing: eps, ignore_index: ignore };
        let y = Value::I64(ArrayD::from_shape_vec(IxDyn(&label_dims), labels.clone()).unwrap());
        let (want_loss, want_grad, want_correct) = reference(dims, &values, &labels, ignore, eps);
        let what = format!("{dims:?}, ignore {ignore:?}, smoothing {eps}");
        if share == 1.0 {
            assert_eq!((want_loss, want_correct), (0.0, 0.0), "{what}: everything ignored");
        }
        for (kind, float, tol) in
            [(EngineKind::Ort(Provider::Cpu), DataType::Float64, 1e-12), (EngineKind::Tract, DataType::Float32, 2e-6)]
        {
            let model = logits_model(dims, &values, float);
            let (got_loss, got_grad, got_correct) = run_loss(&kind, &model, &loss, &y);
            assert!(
                (got_loss - want_loss).abs() <= tol * want_loss.abs().max(1.0),
                "{what} on {kind}: loss {got_loss} vs {want_loss}"
            );
            let worst = got_grad.iter().zip(&want_grad).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
            assert!(worst <= tol, "{what} on {kind}: gradient off by {worst}");
            assert!(
                (got_correct - want_correct).abs() <= 1e-5 * dims[0] as f64,
                "{what} on {kind}: correct {got_correct} vs {want_correct}"
            );
        }
        // Central differences of the graph's own float64 loss, at a few logits.
        let kind = EngineKind::Ort(Provider::Cpu);
        let (_, grad, _) = run_loss(&kind, &logits_model(dims, &values, DataType::Float64), &loss, &y);
        for at in [0, values.len() / 3, values.len() - 1] {
            let h = 1e-6;
            let mut shifted = values.clone();
            shifted[at] += h;
            let up = run_loss(&kind, &logits_model(dims, &shifted, DataType::Float64), &loss, &y).0;
            shifted[at] -= 2.0 * h;
            let down = run_loss(&kind, &logits_model(dims, &shifted, DataType::Float64), &loss, &y).0;
            let fd = (up - down) / (2.0 * h);
            assert!(
                (fd - grad[at]).abs() <= 1e-8,
                "{what}: d loss / d w[{at}] = {} by the graph, {fd} by differences",
                grad[at]
            );
        }
    }
}

#[test]
fn cross_entropy_refuses_logits_of_rank_one_and_reads_its_options() {
    let model = logits_model(&[5], &[0.0; 5], DataType::Float32);
    let err = gradient_graph(&model, &Loss::cross_entropy(), &[]).unwrap_err().to_string();
    assert!(err.contains("batch×classes") && err.contains("per pixel"), "{err}");
    let parse = edgefreeze_autodiff::artifacts::parse_loss;
    assert_eq!(
        parse("cross-entropy:ignore=255,smoothing=0.1").unwrap(),
        Loss::CrossEntropy { label_smoothing: 0.1, ignore_index: Some(255) }
    );
    assert_eq!(
        parse("ce:ignore_index=-100").unwrap(),
        Loss::CrossEntropy { label_smoothing: 0.0, ignore_index: Some(-100) }
    );
    let err = parse("cross-entropy:ignore=2.5").unwrap_err().to_string();
    assert!(err.contains("ignore=2.5") && err.contains("integer"), "{err}");
}
