//! Max-pool gradients with tied maxima: PyTorch sends each window's gradient to the first
//! maximum in row-major order, not to every tied position. Ties are common in real
//! models: GoogLeNet's 1×1 convolution after a 3×3 pool of a 2×2 map makes spatially
//! constant maps, which the next block's pool reads; giving the gradient to all four
//! tied positions made every earlier gradient of GoogLeNet wrong by O(1). A tie is a
//! point where the loss is not differentiable, so finite differences cannot check it:
//! these tests compare with the exact values PyTorch's rule gives.

use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{Tensor, prepare};

/// d/dx of Σ wᵢ·pool(x)ᵢ for x a constant 2×2 map, on ONNX Runtime and tract.
fn pooled_gradient(pool: Node, outputs: usize) -> Vec<Vec<f32>> {
    let mut graph = Graph { name: "ties".into(), ..Default::default() };
    graph.initializers.insert("x".into(), Tensor::from_f32(vec![1, 1, 2, 2], &[0.5; 4]).unwrap());
    let weights: Vec<f32> = (1..=outputs).map(|i| i as f32).collect();
    let dims = if outputs == 1 { vec![1, 1, 1, 1] } else { vec![1, 1, 2, 2] };
    graph.nodes.push(
        Node::new("w", "Constant", &[], &["w"])
            .with_attr("value", Attribute::Tensor(Tensor::from_f32(dims, &weights).unwrap())),
    );
    graph.nodes.push(pool);
    graph.nodes.push(Node::new("mul", "Mul", &["y", "w"], &["yw"]));
    graph.nodes.push(Node::new("sum", "ReduceSum", &["yw"], &["loss"]).with_attr("keepdims", Attribute::Int(0)));
    graph.outputs.push(ValueInfo { name: "loss".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
        .unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&gradient_graph(&model, &Loss::Output, &[]).unwrap());
    let x = Value::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[1, 1, 2, 2]), 0.5));
    [EngineKind::Ort(Provider::Cpu), EngineKind::Tract]
        .iter()
        .map(|kind| {
            let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default()).unwrap();
            let out = session.run(&[("x", &x)]).unwrap();
            let at = session.output_names().iter().position(|n| n == "grad.x").unwrap();
            out[at].as_f32().unwrap().iter().copied().collect()
        })
        .collect()
}

fn ints(v: &[i64]) -> Attribute {
    Attribute::Ints(v.to_vec())
}

#[test]
fn overlapping_windows_give_each_gradient_to_the_first_maximum() {
    // 3×3 windows, stride 1, pad 1, as in GoogLeNet's inception branch: every one of the
    // four windows covers the whole 2×2 map, whose first position is (0, 0).
    let pool = Node::new("pool", "MaxPool", &["x"], &["y"])
        .with_attr("kernel_shape", ints(&[3, 3]))
        .with_attr("pads", ints(&[1, 1, 1, 1]))
        .with_attr("ceil_mode", Attribute::Int(1));
    for grad in pooled_gradient(pool, 4) {
        assert_eq!(grad, vec![1.0 + 2.0 + 3.0 + 4.0, 0.0, 0.0, 0.0]);
    }
}

#[test]
fn tiled_windows_and_global_max_pool_give_it_to_the_first_maximum() {
    let tiled = Node::new("pool", "MaxPool", &["x"], &["y"])
        .with_attr("kernel_shape", ints(&[2, 2]))
        .with_attr("strides", ints(&[2, 2]));
    for grad in pooled_gradient(tiled, 1) {
        assert_eq!(grad, vec![1.0, 0.0, 0.0, 0.0]);
    }
    for grad in pooled_gradient(Node::new("pool", "GlobalMaxPool", &["x"], &["y"]), 1) {
        assert_eq!(grad, vec![1.0, 0.0, 0.0, 0.0]);
    }
}

#[test]
fn strided_overlapping_windows_give_each_gradient_to_the_first_maximum() {
    // 3×3 windows, stride 2, pad 1, ceil_mode (the scatter of the pool's own indices, with
    // reduction="add"): the first window covers the whole tied map and gives its gradient
    // to (0, 0) alone; the others cover one column, one row, one position. PyTorch gives
    // [1, 2, 3, 4].
    let pool = Node::new("pool", "MaxPool", &["x"], &["y"])
        .with_attr("kernel_shape", ints(&[3, 3]))
        .with_attr("strides", ints(&[2, 2]))
        .with_attr("pads", ints(&[1, 1, 1, 1]))
        .with_attr("ceil_mode", Attribute::Int(1));
    for grad in pooled_gradient(pool, 4) {
        assert_eq!(grad, vec![1.0, 2.0, 3.0, 4.0]);
    }
}
