//! Bad training requests give clear errors that name the parameter, output or node.

use edgefreeze_autodiff::training::check_trainable;
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec, gradient_graph, training_step_graph};
use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, prepare};

fn model(nodes: Vec<Node>, output: &str, input_shape: Vec<Dim>) -> Model {
    let mut graph = Graph {
        name: "m".into(),
        nodes,
        inputs: vec![ValueInfo::new("x", DataType::Float32, input_shape)],
        outputs: vec![ValueInfo { name: output.into(), dtype: None, shape: None, doc_string: String::new() }],
        ..Default::default()
    };
    graph.initializers.insert("w".into(), Tensor::from_f32(vec![4, 3], &[0.1; 12]).unwrap());
    graph.initializers.insert("steps".into(), Tensor::from_i64(vec![2], &[-1, 4]).unwrap());
    prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() }).unwrap()
}

fn linear() -> Model {
    model(
        vec![
            Node::new("flat", "Reshape", &["x", "steps"], &["x2"]),
            Node::new("fc", "MatMul", &["x2", "w"], &["logits"]),
        ],
        "logits",
        vec![Dim::Symbol("batch".into()), Dim::Fixed(4)],
    )
}

fn spec() -> TrainingSpec {
    TrainingSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        frozen: vec![],
    }
}

#[test]
fn integer_parameters_cannot_be_trained() {
    let err = check_trainable(&linear(), &["steps".into()]).unwrap_err().to_string();
    assert!(err.contains("\"steps\"") && err.contains("integer type i64"), "{err}");
    let err = gradient_graph(&linear(), &spec().loss, &["steps".into()]).unwrap_err().to_string();
    assert!(err.contains("\"steps\"") && err.contains("not a trainable parameter"), "{err}");
}

#[test]
fn unknown_frozen_parameter_is_named() {
    let mut s = spec();
    s.frozen = vec!["fc.weight".into()];
    let err = training_step_graph(&linear(), &s).unwrap_err().to_string();
    assert!(err.contains("\"fc.weight\"") && err.contains("no initializer"), "{err}");
}

#[test]
fn cross_entropy_needs_batch_by_classes_logits() {
    // One vector of scores with no batch axis.
    let m1 = model(vec![Node::new("fc", "MatMul", &["x", "w"], &["h"])], "h", vec![Dim::Fixed(4)]);
    let err = training_step_graph(&m1, &spec()).unwrap_err().to_string();
    assert!(
        err.contains("cross-entropy needs logits of shape batch×classes")
            && err.contains("\"h\"")
            && err.contains(" 3"),
        "{err}"
    );
    // Logits with more axes are a class map along axis 1, with a label per position.
    let m3 = model(
        vec![Node::new("fc", "MatMul", &["x", "w"], &["h"])],
        "h",
        vec![Dim::Fixed(2), Dim::Fixed(2), Dim::Fixed(4)],
    );
    let step = training_step_graph(&m3, &spec()).unwrap();
    let labels = step.graph.inputs.iter().find(|i| i.name == "labels").unwrap();
    assert_eq!(labels.shape.as_deref(), Some(&[Dim::Fixed(2), Dim::Fixed(3)][..]));
}

#[test]
fn loss_needs_a_floating_point_output() {
    let m = model(
        vec![
            Node::new("fc", "MatMul", &["x", "w"], &["h"]),
            Node::new("pick", "ArgMax", &["h"], &["class"]).with_attr("axis", Attribute::Int(1)),
        ],
        "class",
        vec![Dim::Symbol("batch".into()), Dim::Fixed(4)],
    );
    let err = training_step_graph(&m, &spec()).unwrap_err().to_string();
    assert!(err.contains("output \"class\" is i64") && err.contains("floating-point"), "{err}");
}

#[test]
fn scalar_loss_output_must_be_a_scalar() {
    let err = gradient_graph(&linear(), &Loss::Output, &[]).unwrap_err().to_string();
    assert!(err.contains("\"logits\" must be a scalar loss"), "{err}");
}

#[test]
fn ops_without_a_gradient_rule_are_listed_with_their_nodes() {
    let m = model(
        vec![
            Node::new("fc", "MatMul", &["x", "w"], &["h"]),
            Node::new("floor_a", "Floor", &["h"], &["f"]),
            Node::new("ceil_b", "Ceil", &["f"], &["logits"]),
        ],
        "logits",
        vec![Dim::Symbol("batch".into()), Dim::Fixed(4)],
    );
    let err = training_step_graph(&m, &spec()).unwrap_err().to_string();
    assert!(
        err.contains("no gradient rule for")
            && err.contains("Ceil (nodes: ceil_b)")
            && err.contains("Floor (nodes: floor_a)"),
        "{err}"
    );
}

#[test]
fn bad_optimizer_and_loss_options_are_reported() {
    use edgefreeze_autodiff::artifacts::{parse_loss, parse_optimizer};
    assert!(
        parse_optimizer("sgd:lr=0.1,momentun=0.9")
            .unwrap_err()
            .to_string()
            .contains("unknown optimizer option \"momentun\"")
    );
    assert!(parse_optimizer("adam").unwrap_err().to_string().contains("unknown optimizer \"adam\""));
    assert!(parse_optimizer("sgd:nesterov").unwrap_err().to_string().contains("Nesterov momentum needs momentum > 0"));
    assert!(parse_loss("cross-entropy:smoothing=x").unwrap_err().to_string().contains("not a number"));
    let (opt, lr) = parse_optimizer("sgd:lr=0.05,momentum=0.9,wd=5e-4,nesterov").unwrap();
    assert_eq!(lr, 0.05);
    assert_eq!(opt, Optimizer::Sgd { momentum: 0.9, nesterov: true, weight_decay: 5e-4 });
}
