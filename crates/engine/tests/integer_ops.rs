//! Integer computations exporters put in front of a model (position ids, masks) run on
//! both engines with the same values.

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, save::encode_model};

/// RoBERTa's position ids as dynamo exports them: `cumsum(int64(tokens != 1), dim=1)`,
/// the cast to int64 going through int32 as `.int()` then `.long()` write it.
fn position_ids() -> Vec<u8> {
    let one = Tensor::from_i64(vec![], &[1]).unwrap();
    let graph = Graph {
        name: "position_ids".into(),
        nodes: vec![
            Node::new("one", "Constant", &[], &["one"]).with_attr("value", Attribute::Tensor(one)),
            Node::new("eq", "Equal", &["tokens", "one"], &["eq"]),
            Node::new("ne", "Not", &["eq"], &["ne"]),
            Node::new("to_i32", "Cast", &["ne"], &["i32"]).with_attr("to", Attribute::Int(6)),
            Node::new("to_i64", "Cast", &["i32"], &["i64"]).with_attr("to", Attribute::Int(7)),
            Node::new("cumsum", "CumSum", &["i64", "one"], &["ids"]),
        ],
        inputs: vec![ValueInfo::new("tokens", DataType::Int64, vec![Dim::Symbol("batch".into()), Dim::Fixed(6)])],
        outputs: vec![ValueInfo::new("ids", DataType::Int64, vec![Dim::Symbol("batch".into()), Dim::Fixed(6)])],
        ..Default::default()
    };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 18)], graph, ..Default::default() })
}

#[test]
fn a_cumulative_sum_of_a_cast_mask_counts_on_both_engines() {
    // tract reads a cast to int64 as one to its symbolic-dimension type, which its CumSum
    // kernels do not take ("TDim is not a number") until the backend casts around it.
    let tokens =
        Value::I64(ndarray::ArrayD::from_shape_vec(vec![2, 6], vec![5, 1, 7, 7, 1, 1, 1, 3, 1, 4, 9, 2]).unwrap());
    let expected = [1, 1, 2, 3, 3, 3, 0, 1, 1, 2, 3, 4];
    let bytes = position_ids();
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let mut s = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()).unwrap();
        let out = s.run(&[("tokens", &tokens)]).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let ids = out[0].as_i64().unwrap_or_else(|| panic!("{kind}: not int64"));
        assert_eq!(ids.as_slice().unwrap(), &expected, "{kind}");
    }
}

/// A lookup in a 5-row table by token ids from the caller.
fn lookup() -> Vec<u8> {
    let mut graph = Graph {
        name: "lookup".into(),
        nodes: vec![Node::new("embed", "Gather", &["table", "ids"], &["rows"])],
        inputs: vec![ValueInfo::new("ids", DataType::Int64, vec![Dim::Symbol("n".into())])],
        outputs: vec![ValueInfo::new("rows", DataType::Float32, vec![Dim::Symbol("n".into()), Dim::Fixed(2)])],
        ..Default::default()
    };
    let table: Vec<f32> = (0..10).map(|v| v as f32).collect();
    graph.initializers.insert("table".into(), Tensor::from_f32(vec![5, 2], &table).unwrap());
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

#[test]
fn a_token_id_past_the_table_is_an_error_on_both_engines_and_the_session_goes_on() {
    // tract's Gather panics on an index past its table; the engine turns that into an
    // error of the run, and the same session runs good input after it.
    let bytes = lookup();
    let bad = Value::I64(ndarray::ArrayD::from_shape_vec(vec![3], vec![1, 7, 0]).unwrap());
    let good = Value::I64(ndarray::ArrayD::from_shape_vec(vec![2], vec![4, 0]).unwrap());
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let mut s = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()).unwrap();
        assert!(s.run(&[("ids", &bad)]).is_err(), "{kind}: an id past the table ran");
        let out = s.run(&[("ids", &good)]).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(out[0].as_f32().unwrap().as_slice().unwrap(), &[8.0, 9.0, 0.0, 1.0], "{kind}");
    }
}
