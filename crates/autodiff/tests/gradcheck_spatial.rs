//! Finite-difference checks of the convolution and pooling gradient rules, and one check
//! that tract and ONNX Runtime agree on a small CNN's gradients with a symbolic batch.

mod common;

use common::*;
use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, prepare};
use ndarray::{ArrayD, IxDyn};

fn op(op: &str) -> Node {
    Node::new(op, op, &[], &["out0"])
}

fn ints(v: &[i64]) -> Attribute {
    Attribute::Ints(v.to_vec())
}

fn text(s: &str) -> Attribute {
    Attribute::String(s.as_bytes().to_vec())
}

/// Distinct values (a shuffled even spread over [-1, 1)) so that no window of a max pool has a tie.
fn distinct(rng: &mut Rng, dims: &[usize]) -> Input {
    let n: usize = dims.iter().product();
    let mut v: Vec<f64> = (0..n).map(|i| -1.0 + 2.0 * i as f64 / n as f64).collect();
    for i in (1..n).rev() {
        let j = (rng.uniform() * (i + 1) as f64) as usize;
        v.swap(i, j.min(i));
    }
    Input::Param(dims.to_vec(), v)
}

/// Parameter values by name, with their dimensions.
type Params = Vec<(String, Vec<usize>, Vec<f64>)>;

/// A named test model: its nodes and its parameters' shapes.
type Case<'a> = (&'a str, Vec<Node>, Vec<(&'a str, &'a [usize])>);

/// The finite-difference check, then [`engines_agree`].
fn case(node: Node, inputs: Vec<Input>, opset: i64) {
    engines_agree(&node, &inputs, opset);
    check(node, inputs, opset);
}

/// The one-op model of the finite-difference harness (parameters `in0`..., a projection
/// loss over the float outputs) in `float`, and its gradient graph.
fn gradient_model(node: &Node, inputs: &[Input], opset: i64, float: DataType) -> (Model, Params) {
    let mut graph = Graph { name: format!("engines_{}", node.op_type), ..Default::default() };
    let mut node = node.clone();
    let mut params = Vec::new();
    node.inputs.clear();
    for (i, input) in inputs.iter().enumerate() {
        let name = format!("in{i}");
        match input {
            Input::Param(dims, v) => {
                graph.initializers.insert(name.clone(), Tensor::from_f64_as(float, dims.clone(), v).unwrap());
                params.push((name.clone(), dims.clone(), v.clone()));
            }
            Input::Const(t) => graph.nodes.push(
                Node::new(format!("const{i}"), "Constant", &[], &[&name])
                    .with_attr("value", Attribute::Tensor(t.clone())),
            ),
        }
        node.inputs.push(name);
    }
    let mut rng = Rng::new(7);
    let y = node.outputs[0].clone();
    graph.nodes.push(node);
    graph.outputs = vec![ValueInfo { name: y.clone(), dtype: None, shape: None, doc_string: String::new() }];
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), opset)], graph, ..Default::default() };
    let typed = prepare(model.clone()).unwrap();
    let dims: Vec<usize> =
        typed.graph.value_type(&y).unwrap().shape.unwrap().iter().map(|d| d.fixed().unwrap()).collect();
    let n = dims.iter().product();
    let weights = Tensor::from_f64_as(float, dims, &rng.values(n, -1.0, 1.0)).unwrap();
    let mut model = model;
    let g = &mut model.graph;
    g.nodes.push(Node::new("proj_const", "Constant", &[], &["proj"]).with_attr("value", Attribute::Tensor(weights)));
    g.nodes.push(Node::new("proj_mul", "Mul", &[&y, "proj"], &["prod"]));
    g.nodes
        .push(Node::new("proj_sum", "ReduceSum", &["prod"], &["objective"]).with_attr("keepdims", Attribute::Int(0)));
    g.outputs = vec![ValueInfo { name: "objective".into(), dtype: None, shape: None, doc_string: String::new() }];
    let model = prepare(model).unwrap();
    (gradient_graph(&model, &Loss::Output, &[]).unwrap(), params)
}

fn assert_close(what: &str, name: &str, a: &[f64], b: &[f64], rel: f64) {
    assert_eq!(a.len(), b.len(), "{what}: {name} sizes differ");
    let scale = a.iter().chain(b).fold(0f64, |m, v| m.max(v.abs())).max(1e-12);
    for (k, (u, v)) in a.iter().zip(b).enumerate() {
        assert!((u - v).abs() <= rel * scale, "{what}: {name}[{k}]: {u} vs {v}");
    }
}

/// The gradient graph gives the same values on every engine: in f64 on tract and
/// onnx.reference, in f32 on tract and ONNX Runtime (whose CPU kernels lack f64 Conv).
fn engines_agree(node: &Node, inputs: &[Input], opset: i64) {
    let op = &node.op_type;
    let (grad, params) = gradient_model(node, inputs, opset, DataType::Float64);
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let values: Vec<(String, Value)> = params
        .iter()
        .map(|(n, d, v)| (n.clone(), Value::F64(ArrayD::from_shape_vec(IxDyn(d), v.clone()).unwrap())))
        .collect();
    let tract = run_engine(&EngineKind::Tract, &bytes, &values);
    let reference = &common::reference_outputs(&grad, std::slice::from_ref(&params))[0];
    for (name, t) in &tract {
        let t: Vec<f64> = t.iter().copied().collect();
        assert_close(&format!("{op} f64, tract vs onnx.reference"), name, &t, &reference[name], 1e-9);
    }
    let (grad, params) = gradient_model(node, inputs, opset, DataType::Float32);
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let values: Vec<(String, Value)> = params
        .iter()
        .map(|(n, d, v)| {
            (n.clone(), Value::F32(ArrayD::from_shape_vec(IxDyn(d), v.iter().map(|&x| x as f32).collect()).unwrap()))
        })
        .collect();
    let tract = run_engine(&EngineKind::Tract, &bytes, &values);
    let ort = run_engine(&EngineKind::Ort(Provider::Cpu), &bytes, &values);
    for ((name, a), (_, b)) in tract.iter().zip(&ort) {
        let (a, b): (Vec<f64>, Vec<f64>) = (a.iter().copied().collect(), b.iter().copied().collect());
        assert_close(&format!("{op} f32, tract vs ONNX Runtime"), name, &a, &b, 1e-4);
    }
}

#[test]
fn conv_2d_plain_and_with_bias() {
    let mut rng = Rng::new(11);
    case(op("Conv"), vec![param(&mut rng, &[2, 3, 5, 5]), param(&mut rng, &[4, 3, 3, 3])], 17);
    case(op("Conv"), vec![param(&mut rng, &[2, 3, 5, 6]), param(&mut rng, &[4, 3, 3, 2]), param(&mut rng, &[4])], 17);
}

#[test]
fn conv_2d_strided_and_padded() {
    let mut rng = Rng::new(12);
    let node = op("Conv").with_attr("strides", ints(&[2, 2])).with_attr("pads", ints(&[1, 0, 1, 2]));
    case(node, vec![param(&mut rng, &[2, 3, 6, 7]), param(&mut rng, &[2, 3, 3, 2]), param(&mut rng, &[2])], 13);
    // Strides that leave input rows no window reads, with large end padding.
    let node = op("Conv").with_attr("strides", ints(&[3, 2])).with_attr("pads", ints(&[0, 2, 2, 1]));
    case(node, vec![param(&mut rng, &[1, 2, 8, 5]), param(&mut rng, &[3, 2, 2, 3])], 21);
}

#[test]
fn conv_2d_dilated() {
    let mut rng = Rng::new(13);
    let node = op("Conv").with_attr("dilations", ints(&[2, 1])).with_attr("pads", ints(&[1, 1, 1, 1]));
    case(node, vec![param(&mut rng, &[1, 2, 7, 6]), param(&mut rng, &[3, 2, 2, 3])], 17);
    let node = op("Conv").with_attr("dilations", ints(&[2, 2])).with_attr("strides", ints(&[2, 1]));
    case(node, vec![param(&mut rng, &[2, 2, 8, 7]), param(&mut rng, &[2, 2, 3, 2]), param(&mut rng, &[2])], 17);
}

#[test]
fn conv_2d_grouped() {
    let mut rng = Rng::new(14);
    let node = op("Conv").with_attr("group", Attribute::Int(2)).with_attr("pads", ints(&[1, 1, 1, 1]));
    case(node, vec![param(&mut rng, &[2, 4, 5, 5]), param(&mut rng, &[6, 2, 3, 3]), param(&mut rng, &[6])], 17);
    // Split takes its sizes as an input at every opset from 13; opset 18 added num_outputs.
    let node = op("Conv").with_attr("group", Attribute::Int(3)).with_attr("strides", ints(&[2, 1]));
    case(node, vec![param(&mut rng, &[1, 6, 5, 4]), param(&mut rng, &[3, 2, 2, 2])], 18);
}

#[test]
fn depthwise_kernel_larger_than_the_input() {
    // MNASNet's 5×5 depthwise convolutions (pad 2) on the 2×2 maps of a 64×64 input.
    let mut rng = Rng::new(18);
    let node = op("Conv").with_attr("group", Attribute::Int(3)).with_attr("pads", ints(&[2, 2, 2, 2]));
    case(node, vec![param(&mut rng, &[2, 3, 2, 2]), param(&mut rng, &[3, 1, 5, 5])], 17);
    let node = op("Conv").with_attr("group", Attribute::Int(3)).with_attr("pads", ints(&[2, 2, 2, 2]));
    case(node, vec![param(&mut rng, &[2, 3, 3, 2]), param(&mut rng, &[3, 1, 5, 5])], 17);
    let node = op("Conv").with_attr("pads", ints(&[2, 2, 2, 2]));
    case(node, vec![param(&mut rng, &[2, 3, 2, 2]), param(&mut rng, &[4, 3, 5, 5])], 17);
}

#[test]
fn conv_2d_depthwise_with_multiplier() {
    let mut rng = Rng::new(15);
    let node = op("Conv")
        .with_attr("group", Attribute::Int(3))
        .with_attr("strides", ints(&[2, 2]))
        .with_attr("pads", ints(&[1, 1, 1, 1]));
    case(node, vec![param(&mut rng, &[2, 3, 6, 5]), param(&mut rng, &[6, 1, 3, 3]), param(&mut rng, &[6])], 17);
}

#[test]
fn depthwise_stride_1_as_a_grouped_conv_with_the_flipped_kernel() {
    // The input gradient of these runs as a grouped Conv (stride 1, pads within the
    // kernel's reach); with a channel multiplier, dilation, uneven pads, and pads beyond
    // the reach (which falls back to the ConvTranspose).
    let mut rng = Rng::new(19);
    let node = op("Conv").with_attr("group", Attribute::Int(3)).with_attr("pads", ints(&[1, 0, 0, 2]));
    case(node, vec![param(&mut rng, &[2, 3, 5, 6]), param(&mut rng, &[6, 1, 3, 3]), param(&mut rng, &[6])], 17);
    let node = op("Conv")
        .with_attr("group", Attribute::Int(2))
        .with_attr("dilations", ints(&[2, 1]))
        .with_attr("pads", ints(&[2, 1, 1, 1]));
    case(node, vec![param(&mut rng, &[2, 2, 6, 5]), param(&mut rng, &[2, 1, 3, 3])], 17);
    let node = op("Conv").with_attr("group", Attribute::Int(2)).with_attr("pads", ints(&[2, 0, 0, 3]));
    case(node, vec![param(&mut rng, &[1, 2, 4, 5]), param(&mut rng, &[4, 1, 2, 3])], 17);
}

/// The op types of the gradient graph of one `Conv` (bias or not), forward included.
fn conv_gradient_ops(node: &Node, inputs: &[Input]) -> Vec<String> {
    let (model, _) = gradient_model(node, inputs, 17, DataType::Float64);
    model.graph.nodes.iter().map(|n| n.op_type.clone()).collect()
}

#[test]
fn ungrouped_stride_1_input_gradient_as_a_conv_with_the_flipped_kernel() {
    // Uneven pads, dilation, a 1×1 kernel (no flip); then pads beyond the kernel's reach,
    // a stride, and fewer than 16 input channels, each of which keeps the ConvTranspose.
    let mut rng = Rng::new(23);
    let flipped = [
        (
            op("Conv").with_attr("pads", ints(&[1, 0, 0, 2])),
            vec![param(&mut rng, &[2, 16, 4, 5]), param(&mut rng, &[3, 16, 3, 3])],
        ),
        (
            op("Conv").with_attr("dilations", ints(&[2, 1])).with_attr("pads", ints(&[2, 1, 1, 1])),
            vec![param(&mut rng, &[1, 16, 6, 5]), param(&mut rng, &[2, 16, 3, 3]), param(&mut rng, &[2])],
        ),
        (op("Conv"), vec![param(&mut rng, &[2, 16, 3, 4]), param(&mut rng, &[3, 16, 1, 1])]),
    ];
    for (node, inputs) in flipped {
        let ops = conv_gradient_ops(&node, &inputs);
        assert_eq!(ops.iter().filter(|o| *o == "Conv").count(), 2, "{ops:?}");
        assert!(!ops.iter().any(|o| o == "ConvTranspose"), "{ops:?}");
        case(node, inputs, 17);
    }
    let scattered = [
        (
            op("Conv").with_attr("pads", ints(&[3, 0, 0, 0])),
            vec![param(&mut rng, &[1, 16, 4, 5]), param(&mut rng, &[2, 16, 2, 3])],
        ),
        (
            op("Conv").with_attr("strides", ints(&[2, 2])),
            vec![param(&mut rng, &[2, 16, 5, 5]), param(&mut rng, &[3, 16, 1, 1])],
        ),
        (
            op("Conv").with_attr("pads", ints(&[1, 1, 1, 1])),
            vec![param(&mut rng, &[2, 15, 3, 3]), param(&mut rng, &[2, 15, 3, 3])],
        ),
    ];
    for (node, inputs) in scattered {
        let ops = conv_gradient_ops(&node, &inputs);
        assert!(ops.iter().any(|o| o == "ConvTranspose"), "{ops:?}");
        case(node, inputs, 17);
    }
}

#[test]
fn weight_gradient_folds_the_batch_into_the_product_where_channels_outnumber_positions() {
    // With at least as many output channels as positions (the deep layers), no
    // per-sample product is summed over the batch afterwards: the only ReduceSums left
    // are the bias's and the harness's projection. With fewer channels than positions,
    // one per kernel offset (the per-sample form), in both orientations of its product
    // (C ≥ M and C < M). Depthwise with one output per channel, one per kernel offset
    // too: there each is the contraction itself, over the batch and positions of a
    // product no larger than the layer's input.
    let mut rng = Rng::new(29);
    let cases = [
        (op("Conv"), vec![param(&mut rng, &[3, 2, 3, 3]), param(&mut rng, &[8, 2, 2, 2]), param(&mut rng, &[8])], 2),
        (
            op("Conv").with_attr("group", Attribute::Int(2)).with_attr("strides", ints(&[2, 1])),
            vec![param(&mut rng, &[3, 2, 5, 4]), param(&mut rng, &[2, 1, 3, 2]), param(&mut rng, &[2])],
            6 + 2,
        ),
        (
            op("Conv").with_attr("pads", ints(&[1, 1, 1, 1])),
            vec![param(&mut rng, &[3, 4, 4, 4]), param(&mut rng, &[3, 4, 3, 3]), param(&mut rng, &[3])],
            9 + 2,
        ),
        (
            op("Conv"),
            vec![param(&mut rng, &[2, 1, 5, 5]), param(&mut rng, &[3, 1, 2, 2]), param(&mut rng, &[3])],
            4 + 2,
        ),
    ];
    for (node, inputs, reduce_sums) in cases {
        let ops = conv_gradient_ops(&node, &inputs);
        assert_eq!(ops.iter().filter(|o| *o == "ReduceSum").count(), reduce_sums, "{ops:?}");
        case(node, inputs, 17);
    }
}

#[test]
fn weight_gradient_of_a_thin_input_is_an_im2col_in_groups_of_offsets() {
    // At least four output channels per input channel and more positions than outputs (a
    // first layer: M5's 1 → 32 with an 80-tap kernel at stride 16): the offsets' slices
    // are concatenated M / C at a time, and each group is one MatMul per sample, not one
    // per offset. Strided, padded, dilated, 1-D and 2-D, one and two input channels; the
    // input gradient is a ConvTranspose or a Conv, never a MatMul.
    let mut rng = Rng::new(37);
    let cases = [
        // 8 offsets, 4 per group.
        (
            op("Conv").with_attr("strides", ints(&[4])),
            vec![param(&mut rng, &[2, 1, 40]), param(&mut rng, &[4, 1, 8])],
            2,
        ),
        // 6 offsets, 5 per group.
        (
            op("Conv").with_attr("strides", ints(&[2, 1])).with_attr("pads", ints(&[1, 0, 2, 1])),
            vec![param(&mut rng, &[2, 1, 7, 6]), param(&mut rng, &[5, 1, 3, 2]), param(&mut rng, &[5])],
            2,
        ),
        // 4 offsets of 2 channels, 4 per group.
        (
            op("Conv").with_attr("dilations", ints(&[2, 2])).with_attr("pads", ints(&[1, 1, 1, 1])),
            vec![param(&mut rng, &[3, 2, 6, 6]), param(&mut rng, &[8, 2, 2, 2])],
            1,
        ),
    ];
    for (node, inputs, groups) in cases {
        let ops = conv_gradient_ops(&node, &inputs);
        assert_eq!(ops.iter().filter(|o| *o == "MatMul").count(), groups, "{ops:?}");
        case(node, inputs, 17);
    }
}

#[test]
fn weight_gradient_offsets_that_read_only_padding_are_zeros() {
    // A 3×3 kernel with padding 1 on a 1×1 map (MobileNetV2's last blocks at 28×28) reads
    // the map with its centre alone, and a 5×5 kernel with padding 2 on a 2×2 map
    // (MNASNet's, EfficientNet's) with its middle 3×3 offsets alone: the other offsets'
    // weight gradients are zeros, made from their shape without a slice or a product
    // (one `ConstantOfShape`, which the graph's common subexpressions share).
    // One case per form of the weight gradient: batch folded in (M ≥ P), per sample
    // (M < P), per sample widening (C < M), depthwise. The count is of the live offsets'
    // slices.
    let mut rng = Rng::new(31);
    let pad = |p: i64| op("Conv").with_attr("pads", ints(&[p, p, p, p]));
    let cases = [
        (pad(1), vec![param(&mut rng, &[2, 3, 1, 1]), param(&mut rng, &[4, 3, 3, 3])], 1),
        (pad(2), vec![param(&mut rng, &[2, 3, 2, 2]), param(&mut rng, &[2, 3, 5, 5])], 9),
        (pad(2), vec![param(&mut rng, &[2, 1, 2, 2]), param(&mut rng, &[3, 1, 5, 5])], 9),
        (
            pad(1).with_attr("group", Attribute::Int(3)),
            vec![param(&mut rng, &[2, 3, 1, 1]), param(&mut rng, &[3, 1, 3, 3]), param(&mut rng, &[3])],
            1,
        ),
    ];
    for (node, inputs, live) in cases {
        let ops = conv_gradient_ops(&node, &inputs);
        assert_eq!(ops.iter().filter(|o| *o == "Slice").count(), live, "{ops:?}");
        assert!(ops.iter().any(|o| o == "ConstantOfShape"), "{ops:?}");
        case(node, inputs, 17);
    }
}

/// Why a convolution's weight gradient is not one `Conv` with batch and channels swapped
/// (X as [C, N, ...] and dY as the kernel [M, N, ...]): the kernel's input-channel
/// dimension is then the symbolic batch, and tract only builds a `Conv` whose kernel
/// shape is concrete (`Translating node #4 "conv" ConvHir ToTypedTranslator: Expect
/// concrete shape for kernel`, from tract-hir's cnn/conv.rs),
/// while ONNX Runtime runs it. If tract starts accepting it, this fails, and the form
/// is worth measuring again (on ONNX Runtime it was slower, see docs/results.md).
#[test]
fn tract_builds_no_conv_whose_kernel_has_the_symbolic_batch() {
    let batch = || Dim::Symbol("batch".into());
    let mut graph = Graph { name: "batch_as_channels".into(), ..Default::default() };
    graph.inputs.push(ValueInfo::new(
        "x",
        DataType::Float32,
        vec![batch(), Dim::Fixed(2), Dim::Fixed(5), Dim::Fixed(5)],
    ));
    graph.inputs.push(ValueInfo::new(
        "dy",
        DataType::Float32,
        vec![batch(), Dim::Fixed(3), Dim::Fixed(3), Dim::Fixed(3)],
    ));
    let swap = |name: &str, out: &str| {
        Node::new(format!("t_{name}"), "Transpose", &[name], &[out]).with_attr("perm", ints(&[1, 0, 2, 3]))
    };
    graph.nodes = vec![
        swap("x", "xt"),
        swap("dy", "dyt"),
        Node::new("conv", "Conv", &["xt", "dyt"], &["dwt"]),
        swap("dwt", "dw"),
    ];
    graph.outputs.push(ValueInfo {
        name: "dw".into(),
        dtype: Some(DataType::Float32),
        shape: None,
        doc_string: String::new(),
    });
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() };
    let bytes = edgefreeze_graph::save::encode_model(&model);
    let mut rng = Rng::new(61);
    let mut value = |dims: &[usize]| {
        let n = dims.iter().product();
        Value::F32(
            ArrayD::from_shape_vec(IxDyn(dims), rng.values(n, -1.0, 1.0).iter().map(|&v| v as f32).collect()).unwrap(),
        )
    };
    let inputs = vec![("x".to_string(), value(&[4, 2, 5, 5])), ("dy".to_string(), value(&[4, 3, 3, 3]))];
    let ort = run_engine(&EngineKind::Ort(Provider::Cpu), &bytes, &inputs);
    assert_eq!(ort[0].1.shape(), &[3, 2, 3, 3], "ONNX Runtime runs the batch-as-channels Conv");
    let tract = edgefreeze_engine::load(&EngineKind::Tract, &bytes, &EngineOptions::default());
    let err = tract.err().expect("tract rejects a Conv whose kernel shape has the symbolic batch").to_string();
    // What tract 0.23 says, seen at run time: it fails translating the node to its typed form.
    assert!(err.contains("\"conv\"") && err.contains("Expect concrete shape for kernel"), "tract's reason: {err}");
}

#[test]
fn conv_2d_auto_pad() {
    let mut rng = Rng::new(16);
    for auto_pad in ["SAME_UPPER", "SAME_LOWER", "VALID"] {
        let node = op("Conv").with_attr("auto_pad", text(auto_pad)).with_attr("strides", ints(&[2, 2]));
        case(node, vec![param(&mut rng, &[1, 2, 7, 6]), param(&mut rng, &[3, 2, 3, 3]), param(&mut rng, &[3])], 17);
    }
    let node = op("Conv").with_attr("auto_pad", text("SAME_UPPER"));
    case(node, vec![param(&mut rng, &[2, 2, 5, 4]), param(&mut rng, &[2, 2, 2, 3])], 17);
}

#[test]
fn conv_1d_keyword_spotting_style() {
    let mut rng = Rng::new(17);
    let node = op("Conv").with_attr("strides", ints(&[2]));
    case(node, vec![param(&mut rng, &[2, 4, 20]), param(&mut rng, &[6, 4, 5]), param(&mut rng, &[6])], 17);
    let node = op("Conv").with_attr("group", Attribute::Int(4)).with_attr("pads", ints(&[2, 2]));
    case(node, vec![param(&mut rng, &[2, 4, 9]), param(&mut rng, &[4, 1, 5])], 17);
}

#[test]
fn conv_1x1() {
    let mut rng = Rng::new(18);
    case(op("Conv"), vec![param(&mut rng, &[2, 3, 4, 4]), param(&mut rng, &[5, 3, 1, 1]), param(&mut rng, &[5])], 17);
    let node = op("Conv").with_attr("strides", ints(&[2, 2]));
    case(node, vec![param(&mut rng, &[2, 3, 5, 4]), param(&mut rng, &[5, 3, 1, 1])], 17);
}

#[test]
fn max_pool_2x2_stride_2() {
    let mut rng = Rng::new(21);
    let node = || op("MaxPool").with_attr("kernel_shape", ints(&[2, 2])).with_attr("strides", ints(&[2, 2]));
    case(node(), vec![distinct(&mut rng, &[2, 3, 4, 6])], 17);
    // A last row and column no window covers.
    case(node(), vec![distinct(&mut rng, &[2, 3, 5, 7])], 17);
}

#[test]
fn max_pool_overlapping_and_padded() {
    let mut rng = Rng::new(22);
    let node = op("MaxPool")
        .with_attr("kernel_shape", ints(&[3, 3]))
        .with_attr("strides", ints(&[2, 2]))
        .with_attr("pads", ints(&[1, 1, 1, 1]));
    case(node, vec![distinct(&mut rng, &[2, 2, 7, 6])], 17);
    let node = op("MaxPool").with_attr("kernel_shape", ints(&[2, 3])).with_attr("dilations", ints(&[2, 1]));
    case(node, vec![distinct(&mut rng, &[1, 2, 6, 5])], 17);
}

#[test]
fn max_pool_1d() {
    let mut rng = Rng::new(23);
    let node = op("MaxPool").with_attr("kernel_shape", ints(&[4])).with_attr("strides", ints(&[4]));
    case(node, vec![distinct(&mut rng, &[2, 3, 18])], 17);
}

#[test]
fn max_pool_ceil_mode() {
    let mut rng = Rng::new(24);
    let node = op("MaxPool")
        .with_attr("kernel_shape", ints(&[3, 3]))
        .with_attr("strides", ints(&[2, 2]))
        .with_attr("ceil_mode", Attribute::Int(1));
    case(node, vec![distinct(&mut rng, &[1, 2, 6, 8])], 17);
    let node = op("MaxPool")
        .with_attr("kernel_shape", ints(&[2, 2]))
        .with_attr("strides", ints(&[2, 2]))
        .with_attr("ceil_mode", Attribute::Int(1));
    case(node, vec![distinct(&mut rng, &[2, 2, 5, 4])], 17);
}

#[test]
fn max_pool_gradient_is_a_scatter_of_the_pools_own_indices() {
    // A MaxPool with Indices and a ScatterElements (adding where windows overlap, opset
    // 16 on), with no mask over the window offsets; the mask form before opset 16 with
    // overlapping windows, and for stride-1 pools (onnx.reference's indices are wrong).
    let mut rng = Rng::new(26);
    let overlapping = |stride: i64| {
        op("MaxPool")
            .with_attr("kernel_shape", ints(&[3, 3]))
            .with_attr("strides", ints(&[stride, stride]))
            .with_attr("pads", ints(&[1, 1, 1, 1]))
    };
    let tiled = || op("MaxPool").with_attr("kernel_shape", ints(&[2, 2])).with_attr("strides", ints(&[2, 2]));
    let input = distinct(&mut rng, &[1, 2, 6, 6]);
    // (ScatterElements, whether it adds, Equal masks) in each gradient graph.
    let forms = |node: Node, opset: i64| -> (usize, bool, usize) {
        let (grad, _) = gradient_model(&node, std::slice::from_ref(&input), opset, DataType::Float32);
        let count = |t: &str| grad.graph.nodes.iter().filter(|n| n.op_type == t).count();
        let adds = grad.graph.nodes.iter().any(|n| {
            n.op_type == "ScatterElements" && n.attributes.get("reduction") == Some(&Attribute::String(b"add".to_vec()))
        });
        (count("ScatterElements"), adds, count("Equal"))
    };
    // Each row's indices are brought into its plane by subtracting the row's start, not
    // by an integer division.
    let (grad, _) = gradient_model(&overlapping(2), std::slice::from_ref(&input), 17, DataType::Float32);
    assert!(!grad.graph.nodes.iter().any(|n| n.op_type == "Mod"));
    assert_eq!(forms(overlapping(2), 17), (1, true, 0));
    assert_eq!(forms(tiled(), 17), (1, false, 0));
    assert_eq!(forms(tiled(), 13), (1, false, 0));
    assert_eq!(forms(overlapping(2), 13), (0, false, 2));
    assert_eq!(forms(overlapping(1), 17), (0, false, 2));
}

#[test]
fn max_pool_mask_form_before_opset_16_and_with_stride_1() {
    // The mask form the scatter replaced, still used where ScatterElements cannot add
    // (overlapping windows before opset 16) and for stride-1 pools.
    let mut rng = Rng::new(27);
    let node = op("MaxPool")
        .with_attr("kernel_shape", ints(&[3, 3]))
        .with_attr("strides", ints(&[2, 2]))
        .with_attr("pads", ints(&[1, 1, 1, 1]));
    case(node, vec![distinct(&mut rng, &[2, 2, 7, 6])], 13);
    let node = op("MaxPool").with_attr("kernel_shape", ints(&[3, 3])).with_attr("pads", ints(&[1, 1, 1, 1]));
    case(node, vec![distinct(&mut rng, &[2, 2, 5, 6])], 17);
}

#[test]
fn max_pool_indices_output_carries_no_gradient() {
    let mut rng = Rng::new(25);
    let node = Node::new("MaxPool", "MaxPool", &[], &["out0", "out1"])
        .with_attr("kernel_shape", ints(&[2, 2]))
        .with_attr("strides", ints(&[1, 1]));
    case(node, vec![distinct(&mut rng, &[1, 2, 4, 5])], 17);
}

#[test]
fn average_pool_with_pads() {
    let mut rng = Rng::new(31);
    for include in [0, 1] {
        let node = op("AveragePool")
            .with_attr("kernel_shape", ints(&[3, 3]))
            .with_attr("strides", ints(&[2, 2]))
            .with_attr("pads", ints(&[1, 1, 1, 0]))
            .with_attr("count_include_pad", Attribute::Int(include));
        case(node, vec![param(&mut rng, &[2, 2, 7, 6])], 17);
        let node = op("AveragePool")
            .with_attr("kernel_shape", ints(&[2, 2]))
            .with_attr("strides", ints(&[2, 2]))
            .with_attr("count_include_pad", Attribute::Int(include));
        case(node, vec![param(&mut rng, &[2, 3, 5, 4])], 17);
        let node = op("AveragePool")
            .with_attr("kernel_shape", ints(&[3]))
            .with_attr("pads", ints(&[1, 1]))
            .with_attr("count_include_pad", Attribute::Int(include));
        case(node, vec![param(&mut rng, &[2, 3, 6])], 17);
    }
}

#[test]
fn average_pool_dilated() {
    let mut rng = Rng::new(33);
    for include in [0, 1] {
        let node = op("AveragePool")
            .with_attr("kernel_shape", ints(&[2, 2]))
            .with_attr("dilations", ints(&[2, 1]))
            .with_attr("pads", ints(&[1, 0, 1, 1]))
            .with_attr("count_include_pad", Attribute::Int(include));
        case(node, vec![param(&mut rng, &[1, 2, 6, 5])], 19);
    }
}

#[test]
fn average_pool_ceil_mode() {
    let mut rng = Rng::new(32);
    for include in [0, 1] {
        let node = op("AveragePool")
            .with_attr("kernel_shape", ints(&[3, 3]))
            .with_attr("strides", ints(&[2, 2]))
            .with_attr("ceil_mode", Attribute::Int(1))
            .with_attr("count_include_pad", Attribute::Int(include));
        case(node, vec![param(&mut rng, &[1, 2, 6, 8])], 17);
    }
}

#[test]
fn global_pools() {
    let mut rng = Rng::new(41);
    case(op("GlobalAveragePool"), vec![param(&mut rng, &[2, 3, 4, 5])], 17);
    case(op("GlobalAveragePool"), vec![param(&mut rng, &[2, 3, 7])], 17);
    case(op("GlobalMaxPool"), vec![distinct(&mut rng, &[2, 3, 4, 5])], 17);
}

fn f32_tensor(rng: &mut Rng, dims: &[usize], scale: f64) -> Tensor {
    let n: usize = dims.iter().product();
    Tensor::from_f64_as(DataType::Float32, dims.to_vec(), &rng.values(n, -scale, scale)).unwrap()
}

/// A model with data input `x` of shape `batch×C×spatial...`, f32 parameters, the given
/// nodes and scalar output `objective`.
fn symbolic_batch_model(x: &[usize], params: &[(&str, &[usize])], nodes: Vec<Node>, rng: &mut Rng) -> Model {
    let mut graph = Graph { name: "symbolic".into(), nodes, ..Default::default() };
    let mut shape = vec![Dim::Symbol("batch".into())];
    shape.extend(x.iter().map(|&d| Dim::Fixed(d)));
    graph.inputs.push(ValueInfo::new("x", DataType::Float32, shape));
    for (name, dims) in params {
        graph.initializers.insert(name.to_string(), f32_tensor(rng, dims, 0.5));
    }
    graph.outputs.push(ValueInfo { name: "objective".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() };
    prepare(model).expect("the model is valid")
}

/// Builds the gradient graph, runs it on tract and ONNX Runtime with batch 3, and checks
/// that both give the same loss and gradients, none all zeros.
fn symbolic_batch_engines_agree(what: &str, model: &Model, rng: &mut Rng) {
    let grad = gradient_graph(model, &Loss::Output, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
    let x = grad.graph.inputs.iter().find(|v| v.name == "x").unwrap().shape.clone().unwrap();
    assert_eq!(x[0], Dim::Symbol("batch".into()), "{what}: the batch stays symbolic");
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let mut inputs = Vec::new();
    for v in &grad.graph.inputs {
        let value = if v.name == "x" {
            let dims: Vec<usize> = std::iter::once(3).chain(x[1..].iter().map(|d| d.fixed().unwrap())).collect();
            let n = dims.iter().product();
            ArrayD::from_shape_vec(IxDyn(&dims), rng.values(n, -1.0, 1.0).iter().map(|&x| x as f32).collect()).unwrap()
        } else {
            let t = &model.graph.initializers[&v.name];
            ArrayD::from_shape_vec(IxDyn(t.dims()), t.to_f32_vec().unwrap()).unwrap()
        };
        inputs.push((v.name.clone(), Value::F32(value)));
    }
    let tract = run_engine(&EngineKind::Tract, &bytes, &inputs);
    let ort = run_engine(&EngineKind::Ort(Provider::Cpu), &bytes, &inputs);
    assert_eq!(tract.len(), 1 + model.graph.initializers.len(), "{what}: the loss and every gradient");
    for ((name, a), (name_b, b)) in tract.iter().zip(&ort) {
        assert_eq!(name, name_b);
        assert_eq!(a.shape(), b.shape(), "{what}: {name}: shapes differ");
        let (u, v): (Vec<f64>, Vec<f64>) = (a.iter().copied().collect(), b.iter().copied().collect());
        assert_close(&format!("{what}, tract vs ONNX Runtime"), name, &u, &v, 1e-4);
        if name.starts_with("grad.") {
            assert!(a.iter().any(|v| *v != 0.0), "{what}: {name} is all zeros");
        }
    }
}

#[test]
fn symbolic_batch_cnn_gradients_agree_on_tract_and_onnx_runtime() {
    let mut rng = Rng::new(51);
    let proj = f32_tensor(&mut rng, &[1, 6, 1, 1], 1.0);
    let nodes = vec![
        Node::new("conv1", "Conv", &["x", "w1", "b1"], &["c1"]).with_attr("pads", ints(&[1, 1, 1, 1])),
        Node::new("relu1", "Relu", &["c1"], &["r1"]),
        Node::new("pool1", "MaxPool", &["r1"], &["p1"])
            .with_attr("kernel_shape", ints(&[3, 3]))
            .with_attr("strides", ints(&[2, 2]))
            .with_attr("pads", ints(&[1, 1, 1, 1])),
        Node::new("conv2", "Conv", &["p1", "w2", "b2"], &["c2"])
            .with_attr("group", Attribute::Int(2))
            .with_attr("strides", ints(&[2, 2]))
            .with_attr("auto_pad", text("SAME_UPPER")),
        Node::new("pool2", "MaxPool", &["c2"], &["p2"])
            .with_attr("kernel_shape", ints(&[2, 2]))
            .with_attr("strides", ints(&[2, 2])),
        Node::new("conv3", "Conv", &["p2", "w3"], &["c3"])
            .with_attr("group", Attribute::Int(6))
            .with_attr("pads", ints(&[1, 1, 1, 1])),
        Node::new("pool3", "AveragePool", &["c3"], &["a3"])
            .with_attr("kernel_shape", ints(&[2, 2]))
            .with_attr("pads", ints(&[1, 1, 0, 0])),
        Node::new("gap", "GlobalAveragePool", &["a3"], &["g"]),
        Node::new("proj_const", "Constant", &[], &["proj"]).with_attr("value", Attribute::Tensor(proj)),
        Node::new("proj_mul", "Mul", &["g", "proj"], &["gp"]),
        Node::new("loss_sum", "ReduceSum", &["gp"], &["objective"]).with_attr("keepdims", Attribute::Int(0)),
    ];
    let params: &[(&str, &[usize])] =
        &[("w1", &[4, 3, 3, 3]), ("b1", &[4]), ("w2", &[6, 2, 3, 3]), ("b2", &[6]), ("w3", &[6, 1, 3, 3])];
    let model = symbolic_batch_model(&[3, 10, 10], params, nodes, &mut rng);
    symbolic_batch_engines_agree("CNN", &model, &mut rng);
}

/// A gradient that is a broadcast (a global pooling or a plain sum right after a layer)
/// is where tract's optimizer rewrites most; every rule must still load and agree.
#[test]
fn broadcast_output_gradients_on_tract_and_onnx_runtime() {
    let mut rng = Rng::new(52);
    let sum =
        |from: &str| Node::new("sum", "ReduceSum", &[from], &["objective"]).with_attr("keepdims", Attribute::Int(0));
    let gap = |from: &str| Node::new("gap", "GlobalAveragePool", &[from], &["g"]);
    let conv = |name: &str, x: &str, w: &str, y: &str| {
        Node::new(name, "Conv", &[x, w], &[y]).with_attr("pads", ints(&[1, 1, 1, 1]))
    };
    let cases: Vec<Case<'_>> = vec![
        ("conv → sum", vec![conv("c", "x", "w", "y"), sum("y")], vec![("w", &[4, 3, 3, 3])]),
        ("conv → gap → sum", vec![conv("c", "x", "w", "y"), gap("y"), sum("g")], vec![("w", &[4, 3, 3, 3])]),
        (
            "conv → gap → tanh → sum",
            vec![conv("c", "x", "w", "y"), gap("y"), Node::new("t", "Tanh", &["g"], &["t"]), sum("t")],
            vec![("w", &[4, 3, 3, 3])],
        ),
        ("1×1 conv → sum", vec![Node::new("c", "Conv", &["x", "w"], &["y"]), sum("y")], vec![("w", &[5, 3, 1, 1])]),
        (
            "depthwise conv → sum",
            vec![
                Node::new("c", "Conv", &["x", "w"], &["y"])
                    .with_attr("group", Attribute::Int(3))
                    .with_attr("strides", ints(&[2, 2]))
                    .with_attr("pads", ints(&[1, 1, 1, 1])),
                sum("y"),
            ],
            vec![("w", &[3, 1, 3, 3])],
        ),
        (
            "conv → conv → gap → sum",
            vec![conv("c", "x", "w", "y"), conv("c2", "y", "w2", "z"), gap("z"), sum("g")],
            vec![("w", &[4, 3, 3, 3]), ("w2", &[4, 4, 3, 3])],
        ),
        (
            "conv → grouped conv → gap → sum",
            vec![
                conv("c", "x", "w", "y"),
                conv("c2", "y", "w2", "z").with_attr("group", Attribute::Int(2)),
                gap("z"),
                sum("g"),
            ],
            vec![("w", &[4, 3, 3, 3]), ("w2", &[6, 2, 3, 3])],
        ),
        (
            "conv → depthwise conv → gap → sum",
            vec![
                conv("c", "x", "w", "y"),
                conv("c2", "y", "w2", "z").with_attr("group", Attribute::Int(4)),
                gap("z"),
                sum("g"),
            ],
            vec![("w", &[4, 3, 3, 3]), ("w2", &[8, 1, 3, 3])],
        ),
        (
            "conv → max pool 3×3 → gap → sum",
            vec![
                conv("c", "x", "w", "y"),
                Node::new("mp", "MaxPool", &["y"], &["z"])
                    .with_attr("kernel_shape", ints(&[3, 3]))
                    .with_attr("strides", ints(&[2, 2])),
                gap("z"),
                sum("g"),
            ],
            vec![("w", &[4, 3, 3, 3])],
        ),
        (
            "conv → max pool 2×2 → sum",
            vec![
                conv("c", "x", "w", "y"),
                Node::new("mp", "MaxPool", &["y"], &["z"])
                    .with_attr("kernel_shape", ints(&[2, 2]))
                    .with_attr("strides", ints(&[2, 2])),
                sum("z"),
            ],
            vec![("w", &[4, 3, 3, 3])],
        ),
        (
            "conv → average pool → gap → sum",
            vec![
                conv("c", "x", "w", "y"),
                Node::new("ap", "AveragePool", &["y"], &["z"])
                    .with_attr("kernel_shape", ints(&[3, 3]))
                    .with_attr("pads", ints(&[1, 1, 1, 1])),
                gap("z"),
                sum("g"),
            ],
            vec![("w", &[4, 3, 3, 3])],
        ),
        (
            "conv → global max pool → sum",
            vec![conv("c", "x", "w", "y"), Node::new("gmp", "GlobalMaxPool", &["y"], &["g"]), sum("g")],
            vec![("w", &[4, 3, 3, 3])],
        ),
    ];
    for (what, nodes, params) in cases {
        let model = symbolic_batch_model(&[3, 8, 8], &params, nodes, &mut rng);
        symbolic_batch_engines_agree(what, &model, &mut rng);
    }
}

/// Runs a graph; every output as f64.
fn run_engine(kind: &EngineKind, bytes: &[u8], inputs: &[(String, Value)]) -> Vec<(String, ArrayD<f64>)> {
    let mut session = edgefreeze_engine::load(kind, bytes, &EngineOptions::default())
        .unwrap_or_else(|e| panic!("{kind} cannot load the gradient graph: {e}"));
    let refs: Vec<(&str, &Value)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let out = session.run(&refs).unwrap_or_else(|e| panic!("{kind} cannot run the gradient graph: {e}"));
    let as_f64 = |v: Value| match v {
        Value::F32(a) => a.mapv(f64::from),
        Value::F64(a) => a,
        other => panic!("{kind}: a non-float output {other:?}"),
    };
    session.output_names().iter().cloned().zip(out.into_iter().map(as_f64)).collect()
}
