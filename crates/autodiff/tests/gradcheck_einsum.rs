//! Finite-difference checks of the Einsum gradient rule on tract and ONNX Runtime: the
//! equations MaxViT's attention exports (both exporters write them with spaces and
//! capitals), a batched matrix product, broadcasting ellipses, subscripts summed within one
//! operand, implicit outputs and three operands.

mod common;

use common::*;
use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider};
use edgefreeze_graph::ir::{Attribute, Node};

/// The loss is linear in each operand, so a central difference is exact whatever the step:
/// a large step keeps the engines' float64 rounding (tract's reductions: about 1e-10
/// relative) far below the tolerance.
const MULTILINEAR: Tolerance = Tolerance { h: 1e-2, abs: 1e-8, rel: 1e-7 };

fn einsum(equation: &str) -> Node {
    Node::new("einsum", "Einsum", &[], &["out0"]).with_attr("equation", Attribute::String(equation.into()))
}

fn case(equation: &str, shapes: &[&[usize]], rng: &mut Rng) {
    let inputs = shapes.iter().map(|s| param(rng, s)).collect();
    check_on_both(einsum(equation), inputs, 17, rng, MULTILINEAR);
}

#[test]
fn maxvit_attention_equations() {
    let mut rng = Rng::new(81);
    // Scores q·kᵀ per (batch, grid/window, head), then scores·v.
    case("B G H I D, B G H J D -> B G H I J", &[&[2, 2, 2, 3, 4], &[2, 2, 2, 5, 4]], &mut rng);
    case("B G H I J, B G H J D -> B G H I D", &[&[2, 2, 2, 3, 5], &[2, 2, 2, 5, 4]], &mut rng);
}

#[test]
fn batched_and_shared_matrix_products() {
    let mut rng = Rng::new(82);
    case("bij,bjk->bik", &[&[3, 2, 4], &[3, 4, 5]], &mut rng);
    case("bij,jk->bik", &[&[3, 2, 4], &[4, 5]], &mut rng);
    case("ij,kj->ik", &[&[3, 4], &[2, 4]], &mut rng);
}

#[test]
fn broadcasting_ellipses() {
    let mut rng = Rng::new(83);
    // (ONNX requires every ellipsis to stand for the same number of dimensions.)
    case("...ij,...jk->...ik", &[&[2, 3, 2, 3], &[2, 3, 3, 4]], &mut rng);
}

#[test]
fn subscripts_summed_within_one_operand_and_implicit_outputs() {
    let mut rng = Rng::new(84);
    // i is summed over A alone: A's gradient is constant along i.
    case("ij,jk->k", &[&[3, 4], &[4, 2]], &mut rng);
    case("ijk->j", &[&[2, 3, 4]], &mut rng);
    case("ij->ji", &[&[2, 3]], &mut rng);
    // Implicit output: the letters used once, in order ("ik").
    case("ij,jk", &[&[2, 3], &[3, 4]], &mut rng);
    case("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 2]], &mut rng);
}

#[test]
fn a_diagonal_is_refused_naming_the_node() {
    let mut rng = Rng::new(85);
    let (model, _) = projected_model(einsum("ii->i"), vec![param(&mut rng, &[3, 3])], 17, &mut rng);
    let err = gradient_graph(&model, &Loss::Output, &[]).unwrap_err().to_string();
    assert!(err.contains("\"einsum\"") && err.contains("diagonal") && err.contains("ii"), "{err}");
}

/// Two ellipsis forms tract 0.23's Einsum refuses in the forward node itself, checked on
/// ONNX Runtime: size-1 dimensions under an ellipsis broadcast (tract unifies the sizes
/// instead), an implicit output with an ellipsis (tract leaves the ellipsis out), and an
/// ellipsis after a letter beside an operand without one (tract's output rank is off by one;
/// the second operand's gradient sums over the ellipsis).
#[test]
fn ellipsis_forms_tract_refuses_on_onnx_runtime() {
    let mut rng = Rng::new(86);
    let cases: [(&str, [&[usize]; 2]); 3] = [
        // A's ellipsis is 2×1, B's is 1×3: both broadcast to 2×3, and both gradients sum back.
        ("...ij,...jk->...ik", [&[2, 1, 2, 3], &[1, 3, 3, 4]]),
        ("...ij,...jk", [&[2, 2, 2, 3], &[2, 2, 3, 4]]),
        ("i...,i->...", [&[3, 2, 4], &[3]]),
    ];
    for (equation, [a, b]) in cases {
        let inputs = vec![param(&mut rng, a), param(&mut rng, b)];
        let (model, _) = projected_model(einsum(equation), inputs, 17, &mut rng);
        check_on(&[EngineKind::Ort(Provider::Cpu)], equation, &model, &[], MULTILINEAR);
        let bytes = edgefreeze_graph::save::encode_model(&gradient_graph(&model, &Loss::Output, &[]).unwrap());
        let tract = edgefreeze_engine::load(&EngineKind::Tract, &bytes, &EngineOptions::default());
        assert!(tract.is_err(), "{equation}: tract now loads it: check it on tract too");
    }
}
