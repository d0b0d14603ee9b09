//! tract's batch-along-the-width lowering (`edgefreeze_engine::tract_lower::
//! lay_batch_along_width`) moves a convolution onto a different kernel, which sums in
//! its own order: its outputs are checked against a float64 convolution to the bound any
//! order of float32 sums meets, γ_k · Σ|x·w| with k the terms of a sum (Higham, eq. 3.5),
//! as tract's unlowered plan is. The geometry is what the rewrite must get right: strides
//! whose images do not start on the stride, dilations, padding made explicit, kernels that
//! are not square, a bias, images whose last output points straddle the next image.

use edgefreeze_engine::tract_lower::{lay_batch_along_width, pad_convolutions_explicitly};
use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, save::encode_model};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use tract_onnx::prelude::*;

/// Batch, channels, height and width of the input: 16 rows of 21 points make one row
/// long enough for tract's direct kernel (128 points), one image's is not.
const X: [usize; 4] = [16, 3, 7, 21];

/// One convolution of `x`: output channels, kernel, strides, dilations, pads (ONNX order)
/// and whether it has a bias.
struct Case {
    name: &'static str,
    out: usize,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    pads: [usize; 4],
    bias: bool,
}

const CASES: [Case; 5] = [
    Case { name: "same", out: 4, kernel: [3, 3], strides: [1, 1], dilations: [1, 1], pads: [1, 1, 1, 1], bias: false },
    // 21 columns on a stride of 2: each image is padded to 22 so the next starts on it.
    Case { name: "strided", out: 4, kernel: [3, 3], strides: [2, 2], dilations: [1, 1], pads: [0; 4], bias: true },
    // 6 output channels: not a multiple of the kernel's four.
    Case {
        name: "dilated",
        out: 6,
        kernel: [3, 3],
        strides: [1, 1],
        dilations: [2, 2],
        pads: [2, 1, 0, 2],
        bias: false,
    },
    Case { name: "five", out: 8, kernel: [5, 5], strides: [1, 1], dilations: [1, 1], pads: [0; 4], bias: true },
    // One column per tap: no point straddles two images.
    Case { name: "column", out: 4, kernel: [3, 1], strides: [1, 1], dilations: [1, 1], pads: [0; 4], bias: false },
];

fn weight_shape(case: &Case) -> [usize; 4] {
    [case.out, X[1], case.kernel[0], case.kernel[1]]
}

fn graph() -> Vec<u8> {
    let ints = |v: &[usize]| Attribute::Ints(v.iter().map(|&d| d as i64).collect());
    let mut nodes = Vec::new();
    let mut inputs = vec![ValueInfo::new(
        "x",
        DataType::Float32,
        std::iter::once(Dim::Symbol("batch".into())).chain(X[1..].iter().map(|&d| Dim::Fixed(d))).collect(),
    )];
    for case in &CASES {
        let (w, b) = (format!("{}_w", case.name), format!("{}_b", case.name));
        inputs.push(ValueInfo::new(&w, DataType::Float32, weight_shape(case).map(Dim::Fixed).to_vec()));
        let mut reads = vec!["x", w.as_str()];
        if case.bias {
            inputs.push(ValueInfo::new(&b, DataType::Float32, vec![Dim::Fixed(case.out)]));
            reads.push(&b);
        }
        nodes.push(
            Node::new(case.name, "Conv", &reads, &[case.name])
                .with_attr("kernel_shape", ints(&case.kernel))
                .with_attr("strides", ints(&case.strides))
                .with_attr("dilations", ints(&case.dilations))
                .with_attr("pads", ints(&case.pads)),
        );
    }
    let outputs = CASES
        .iter()
        .map(|c| ValueInfo {
            name: c.name.into(),
            dtype: Some(DataType::Float32),
            shape: None,
            doc_string: String::new(),
        })
        .collect();
    let graph = Graph { name: "wide".into(), nodes, inputs, outputs, ..Default::default() };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

/// Values of both signs, no two alike in a row, so that a column taken from the wrong
/// image or offset changes the sum.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0).collect()
}

fn feeds() -> Vec<(String, ArrayD<f32>)> {
    let array =
        |dims: &[usize], seed| ArrayD::from_shape_vec(IxDyn(dims), values(dims.iter().product(), seed)).unwrap();
    let mut feeds = vec![("x".to_string(), array(&X, 1))];
    for (i, case) in CASES.iter().enumerate() {
        feeds.push((format!("{}_w", case.name), array(&weight_shape(case), 10 + i)));
        if case.bias {
            feeds.push((format!("{}_b", case.name), array(&[case.out], 20 + i)));
        }
    }
    feeds
}

/// The convolution in float64, and beside each output the sum of its terms' magnitudes.
fn reference(case: &Case, x: &ArrayD<f32>, w: &ArrayD<f32>, b: Option<&ArrayD<f32>>) -> (ArrayD<f64>, ArrayD<f64>) {
    let [n, c, h, wd] = X;
    let [kh, kw] = case.kernel;
    let reach = |size: usize, axis: usize| {
        let padded = size + case.pads[axis] + case.pads[axis + 2];
        (padded - case.dilations[axis] * (case.kernel[axis] - 1) - 1) / case.strides[axis] + 1
    };
    let (oh, ow) = (reach(h, 0), reach(wd, 1));
    let mut value = ArrayD::<f64>::zeros(IxDyn(&[n, case.out, oh, ow]));
    let mut magnitude = value.clone();
    for (i, o, y, xo) in itertools(n, case.out, oh, ow) {
        let (mut s, mut m) = b.map_or((0.0, 0.0), |b| (b[[o]] as f64, (b[[o]] as f64).abs()));
        for ci in 0..c {
            for ky in 0..kh {
                for kx in 0..kw {
                    let iy = (y * case.strides[0] + ky * case.dilations[0]) as isize - case.pads[0] as isize;
                    let ix = (xo * case.strides[1] + kx * case.dilations[1]) as isize - case.pads[1] as isize;
                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                        continue;
                    }
                    let term = x[[i, ci, iy as usize, ix as usize]] as f64 * w[[o, ci, ky, kx]] as f64;
                    s += term;
                    m += term.abs();
                }
            }
        }
        value[[i, o, y, xo]] = s;
        magnitude[[i, o, y, xo]] = m;
    }
    (value, magnitude)
}

fn itertools(a: usize, b: usize, c: usize, d: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    (0..a).flat_map(move |i| (0..b).flat_map(move |j| (0..c).flat_map(move |k| (0..d).map(move |l| (i, j, k, l)))))
}

fn run(options: EngineOptions) -> Vec<ArrayD<f32>> {
    let mut session = edgefreeze_engine::load(&EngineKind::Tract, &graph(), &options).unwrap();
    let feeds: Vec<(String, Value)> = feeds().into_iter().map(|(n, a)| (n, Value::F32(a))).collect();
    let feeds: Vec<(&str, &Value)> = feeds.iter().map(|(n, v)| (n.as_str(), v)).collect();
    session.run(&feeds).unwrap().into_iter().map(|v| v.as_f32().unwrap().to_owned()).collect()
}

#[test]
fn convolutions_laid_along_the_width_are_the_convolutions() {
    let one_thread = EngineOptions { threads: Some(1), ..Default::default() };
    let lowered = run(one_thread.clone());
    let generic = run(EngineOptions { tract_generic_plan: true, ..one_thread });
    let feeds = feeds();
    let find = |name: &str| feeds.iter().find(|(n, _)| n == name).map(|(_, a)| a);
    let unit = f64::from(f32::EPSILON) / 2.0;
    for (i, case) in CASES.iter().enumerate() {
        let (x, w, b) =
            (find("x").unwrap(), find(&format!("{}_w", case.name)).unwrap(), find(&format!("{}_b", case.name)));
        let (exact, magnitude) = reference(case, x, w, b);
        let terms = (X[1] * case.kernel[0] * case.kernel[1] + usize::from(case.bias)) as f64;
        let gamma = terms * unit / (1.0 - terms * unit);
        for (plan, got) in [("lowered", &lowered[i]), ("generic", &generic[i])] {
            assert_eq!(got.shape(), exact.shape(), "{}: {plan} plan's shape", case.name);
            for ((at, &g), (&e, &m)) in got.indexed_iter().zip(exact.iter().zip(magnitude.iter())) {
                assert!(
                    (g as f64 - e).abs() <= gamma * m,
                    "{} at {at:?}: {plan} plan gives {g}, float64 {e}, bound {}",
                    case.name,
                    gamma * m
                );
            }
        }
    }
}

#[test]
fn the_pass_lays_every_case_along_the_width() {
    let onnx = tract_onnx::onnx();
    let mut model = onnx.model_for_read(&mut &*graph()).unwrap().into_typed().unwrap();
    let batch = model.symbols.sym("batch");
    model = model.set_symbols(&std::collections::HashMap::from([(batch, TDim::from(X[0] as i64))])).unwrap();
    model.declutter().unwrap();
    let direct = tract_onnx::tract_core::tract_linalg::routines::conv_w4_f32().is_some()
        && tract_onnx::tract_core::tract_linalg::routines::depthwise_w_f32().is_some();
    assert_eq!(lay_batch_along_width(&mut model).unwrap(), if direct { CASES.len() } else { 0 });
    // The padded ones were laid with their padding: none is left to pad.
    assert_eq!(pad_convolutions_explicitly(&mut model).unwrap(), if direct { 0 } else { 2 });
    model.optimize().unwrap();
    let names: Vec<String> = model.nodes.iter().map(|n| n.op.name().to_string()).collect();
    if direct {
        assert_eq!(names.iter().filter(|n| *n == "DirectSpatialConv").count(), CASES.len(), "{names:?}");
    }
}

/// A sample's outputs do not depend on the batch it is in: a resumed run repeats its
/// steps bit for bit, an epoch's last batch is smaller, and a split step runs micro-batches.
/// tract's direct kernel computes a row's last few points without a fused multiply-add,
/// so the rewrite keeps every image's points out of them, and lays a batch of one too.
#[test]
fn a_sample_gives_the_same_bits_in_any_batch() {
    let one_thread = EngineOptions { threads: Some(1), ..Default::default() };
    let mut session = edgefreeze_engine::load(&EngineKind::Tract, &graph(), &one_thread).unwrap();
    let all = feeds();
    // Each output's samples, as bits, for the first `take` samples of the input.
    let mut run_first = |take: usize| -> Vec<Vec<Vec<u32>>> {
        let feeds: Vec<(String, Value)> = all
            .iter()
            .map(|(n, a)| {
                let a = if n == "x" { a.slice_axis(Axis(0), Slice::from(0..take)).to_owned() } else { a.clone() };
                (n.clone(), Value::F32(a))
            })
            .collect();
        let feeds: Vec<(&str, &Value)> = feeds.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let outputs = session.run(&feeds).unwrap();
        outputs
            .iter()
            .map(|v| {
                let v = v.as_f32().unwrap();
                v.axis_iter(Axis(0)).map(|sample| sample.iter().map(|x| x.to_bits()).collect()).collect()
            })
            .collect()
    };
    let whole = run_first(X[0]);
    for take in [1, 2, 5, 7, 9] {
        let part = run_first(take);
        for (case, (part, whole)) in CASES.iter().zip(part.iter().zip(&whole)) {
            // The last sample of the smaller batch ends its row.
            for (i, sample) in part.iter().enumerate() {
                assert!(sample == &whole[i], "{}: sample {i} in a batch of {take} against one of {}", case.name, X[0]);
            }
        }
    }
}
