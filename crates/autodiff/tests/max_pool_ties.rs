//! Max-pool gradients with tied maxima: PyTorch sends each window's gradient to the first
//! maximum in row-major order, not to every tied position. Ties are common in real
//! models: GoogLeNet's 1×1 convolution after a 3×3 pool of a 2×2 map makes spatially
//! constant maps, which the next block's pool reads; giving the gradient to all four
//! tied positions made every earlier gradient of GoogLeNet wrong by O(1). A tie is a
//! point where the loss is not differentiable, so finite differences cannot check it:
//! these tests compare with the exact values PyTorch's rule gives.

mod common;

use common::weighted_output_gradient;
use edgefreeze_graph::ir::{Attribute, Node};

/// d/dx of Σ wᵢ·pool(x)ᵢ for x a constant 2×2 map, on ONNX Runtime and tract.
fn pooled_gradient(pool: Node, outputs: usize) -> Vec<Vec<f32>> {
    let dims = if outputs == 1 { [1, 1, 1, 1] } else { [1, 1, 2, 2] };
    weighted_output_gradient(&[1, 1, 2, 2], &[0.5; 4], vec![pool], &dims, &[])
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
