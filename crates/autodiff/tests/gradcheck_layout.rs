//! Finite-difference checks of the layout, reduction and softmax gradient rules.

mod common;

use common::*;
use edgefreeze_graph::ir::{Attribute, Node};
use edgefreeze_graph::{DataType, Tensor};

fn op(op: &str) -> Node {
    Node::new(op, op, &[], &["out0"])
}

#[test]
fn reshapes_flatten_squeeze_unsqueeze_transpose() {
    let mut rng = Rng::new(11);
    check(op("Reshape"), vec![param(&mut rng, &[2, 3, 4]), ints(&[4, -1])], 17);
    check(op("Flatten").with_attr("axis", Attribute::Int(2)), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("Squeeze"), vec![param(&mut rng, &[2, 1, 4]), ints(&[1])], 17);
    check(op("Unsqueeze"), vec![param(&mut rng, &[2, 4]), ints(&[0, -1])], 17);
    check(op("Transpose").with_attr("perm", Attribute::Ints(vec![2, 0, 1])), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("Transpose"), vec![param(&mut rng, &[2, 3, 4])], 17);
}

#[test]
fn concat_split_and_slice() {
    let mut rng = Rng::new(12);
    check(
        op("Concat").with_attr("axis", Attribute::Int(-1)),
        vec![param(&mut rng, &[2, 3]), param(&mut rng, &[2, 1]), param(&mut rng, &[2, 4])],
        17,
    );
    let split = Node::new("Split", "Split", &[], &["out0", "out1", "out2"]).with_attr("axis", Attribute::Int(1));
    check(split, vec![param(&mut rng, &[2, 6]), ints(&[1, 2, 3])], 17);
    check(op("Slice"), vec![param(&mut rng, &[4, 5]), ints(&[1, -3]), ints(&[3, 100]), ints(&[0, 1])], 17);
    // Strided and reversed slices, as x[:, 1::2] and x[::-2] write them.
    check(op("Slice"), vec![param(&mut rng, &[3, 7]), ints(&[1]), ints(&[100]), ints(&[1]), ints(&[2])], 17);
    check(op("Slice"), vec![param(&mut rng, &[6, 3]), ints(&[-1]), ints(&[i64::MIN]), ints(&[0]), ints(&[-2])], 17);
    check(
        op("Slice"),
        vec![param(&mut rng, &[2, 8, 5]), ints(&[0, 4]), ints(&[7, 0]), ints(&[1, 2]), ints(&[3, -3])],
        17,
    );
}

#[test]
fn split_with_an_unused_output() {
    let mut rng = Rng::new(13);
    // Both outputs feed the projection loss; the harness weights them independently.
    check(
        Node::new("Split", "Split", &[], &["out0", "out1"]).with_attr("axis", Attribute::Int(0)),
        vec![param(&mut rng, &[4, 3]), ints(&[1, 3])],
        17,
    );
}

#[test]
fn embedding_gather_with_repeated_and_negative_indices() {
    let mut rng = Rng::new(14);
    let indices = || Input::Const(Tensor::from_i64(vec![2, 3], &[0, 4, 4, -1, 2, 0]).unwrap());
    check(op("Gather"), vec![param(&mut rng, &[5, 3]), indices()], 17);
    // Before opset 16 the gradient is a one-hot product instead of an adding ScatterND.
    check(op("Gather"), vec![param(&mut rng, &[5, 3]), indices()], 13);
    let scalar_rows = Input::Const(Tensor::from_i64_as(DataType::Int32, vec![3], &[1, 1, 0]).unwrap());
    check(op("Gather"), vec![param(&mut rng, &[3, 2, 2]), scalar_rows], 17);
}

#[test]
fn gather_along_inner_axes_with_index_tensors_and_scalars() {
    let mut rng = Rng::new(15);
    let pairs = Input::Const(Tensor::from_i64(vec![2, 2], &[3, 0, -1, 1]).unwrap());
    let axis = |a: i64| op("Gather").with_attr("axis", Attribute::Int(a));
    check(axis(1), vec![param(&mut rng, &[3, 4, 2]), pairs], 17);
    // `x[:, :, 2]` as dynamo exports a select: a scalar index on the last axis.
    let select = Input::Const(Tensor::from_i64(vec![], &[2]).unwrap());
    check(axis(-1), vec![param(&mut rng, &[2, 3, 4]), select], 17);
    let repeated = Input::Const(Tensor::from_i64_as(DataType::Int32, vec![3], &[1, 1, 0]).unwrap());
    check(axis(2), vec![param(&mut rng, &[2, 2, 3, 2]), repeated], 17);
}

#[test]
fn gather_nd_scatters_back_with_repeated_tuples() {
    let mut rng = Rng::new(16);
    let tuples = Input::Const(Tensor::from_i64(vec![3, 2], &[0, 1, 2, 3, 0, 1]).unwrap());
    check(op("GatherND"), vec![param(&mut rng, &[3, 4, 2]), tuples], 17);
    // Depth 1 picks whole rows, as Swin's relative-position lookup does.
    let rows = Input::Const(Tensor::from_i64(vec![2, 2, 1], &[2, 0, 2, 1]).unwrap());
    check(op("GatherND"), vec![param(&mut rng, &[3, 4]), rows], 17);
}

#[test]
fn constant_pad_with_axes_and_negative_pads() {
    let mut rng = Rng::new(17);
    check(op("Pad"), vec![param(&mut rng, &[2, 3, 4]), ints(&[0, 1, 2, 0, 0, 1])], 17);
    // Swin's window padding: only some axes, given as input 3 (opset 18).
    // (The constant value, input 2, is omitted: the harness leaves an empty name empty.)
    let with_axes = Node::new("Pad", "Pad", &["x", "pads", "", "axes"], &["out0"]);
    check(with_axes, vec![param(&mut rng, &[2, 3, 4]), ints(&[1, 0, 2, 3]), ints(&[0]), ints(&[1, -1])], 18);
    // A negative pad crops.
    check(op("Pad"), vec![param(&mut rng, &[3, 5]), ints(&[-1, 2, 1, -2])], 17);
}

#[test]
fn expand_broadcasts_back() {
    let mut rng = Rng::new(15);
    check(op("Expand"), vec![param(&mut rng, &[3, 1]), ints(&[2, 3, 4])], 17);
}

#[test]
fn reductions_over_axes_and_opsets() {
    let mut rng = Rng::new(16);
    check(
        op("ReduceSum").with_attr("keepdims", Attribute::Int(0)),
        vec![param(&mut rng, &[2, 3, 4]), ints(&[0, 2])],
        17,
    );
    check(op("ReduceSum"), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("ReduceMean").with_attr("axes", Attribute::Ints(vec![-1])), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("ReduceMean").with_attr("keepdims", Attribute::Int(0)), vec![param(&mut rng, &[2, 3, 4]), ints(&[1])], 18);
}

#[test]
fn softmax_and_log_softmax() {
    let mut rng = Rng::new(17);
    for axis in [-1, 0, 1] {
        check(op("Softmax").with_attr("axis", Attribute::Int(axis)), vec![param(&mut rng, &[3, 4, 2])], 17);
        check(op("LogSoftmax").with_attr("axis", Attribute::Int(axis)), vec![param(&mut rng, &[3, 4, 2])], 17);
    }
}

#[test]
fn batch_and_layer_normalization_train_from_batch_statistics() {
    let mut rng = Rng::new(18);
    let bn = op("BatchNormalization").with_attr("epsilon", Attribute::Float(1e-3));
    check(
        bn,
        vec![
            param(&mut rng, &[4, 3, 2, 2]),
            param(&mut rng, &[3]),
            param(&mut rng, &[3]),
            Input::Const(Tensor::from_f64_as(DataType::Float64, vec![3], &[0.0; 3]).unwrap()),
            Input::Const(Tensor::from_f64_as(DataType::Float64, vec![3], &[1.0; 3]).unwrap()),
        ],
        17,
    );
    check(
        op("BatchNormalization"),
        {
            let mut v = vec![param(&mut rng, &[5, 2]), param(&mut rng, &[2]), param(&mut rng, &[2])];
            v.push(Input::Const(Tensor::from_f64_as(DataType::Float64, vec![2], &[0.0; 2]).unwrap()));
            v.push(Input::Const(Tensor::from_f64_as(DataType::Float64, vec![2], &[1.0; 2]).unwrap()));
            v
        },
        17,
    );
    check(
        op("LayerNormalization"),
        vec![param(&mut rng, &[2, 3, 4]), param(&mut rng, &[4]), param(&mut rng, &[4])],
        17,
    );
    check(
        op("LayerNormalization").with_attr("axis", Attribute::Int(1)),
        vec![param(&mut rng, &[2, 3, 2]), param(&mut rng, &[3, 2])],
        17,
    );
}
