//! `Resize`: what each axis becomes, shared by the shape rule and the autodiff crate's
//! gradient.
//!
//! Every mode `Resize` has on an axis of known size is a linear map of that axis: output
//! element `i` is a weighted sum of input elements, the weights fixed by the mode, the
//! coordinate transformation and the sizes (ONNX's definition of `Resize`). So the
//! gradient is the transposed map: [`ResizeAxis::Weights`] holds the matrix. Nearest
//! neighbour by a whole number with `asymmetric` coordinates and `floor` rounding (what
//! both PyTorch exporters write for `nn.Upsample` and `F.interpolate(scale_factor=k)`)
//! repeats each element k times, which needs no size: [`ResizeAxis::Repeat`], summed back
//! in blocks.

use super::{Inference, SymInt};
use crate::ir::{Dim, Node};

/// What `Resize` does to one axis.
#[derive(Debug, Clone, PartialEq)]
pub enum ResizeAxis {
    /// Each element repeated k times in a row (k = 1: the axis is unchanged).
    Repeat(usize),
    /// `output` elements, each a weighted sum of the axis's `input` elements: `weights`
    /// is the `output × input` matrix, row-major.
    Weights {
        /// Size of the axis in the input.
        input: usize,
        /// Size of the axis in the output.
        output: usize,
        /// The matrix.
        weights: Vec<f64>,
    },
}

impl ResizeAxis {
    /// The axis's size in the output, given its size `d` in the input.
    pub fn output_dim(&self, d: &Dim) -> Dim {
        match (self, d) {
            (ResizeAxis::Repeat(1), _) => d.clone(),
            (ResizeAxis::Repeat(k), Dim::Fixed(n)) => n.checked_mul(*k).map_or(Dim::Unknown, Dim::Fixed),
            (ResizeAxis::Repeat(_), _) => Dim::Unknown,
            (ResizeAxis::Weights { output, .. }, _) => Dim::Fixed(*output),
        }
    }

    /// The matrix of the axis (`output × input`), for an axis of known size `d`; `None`
    /// for a repeat too large to write as one.
    pub fn matrix(&self, d: usize) -> Option<(usize, usize, Vec<f64>)> {
        match self {
            ResizeAxis::Repeat(k) => {
                let out = d.checked_mul(*k).filter(|&o| o.saturating_mul(d) <= MAX_MATRIX)?;
                let mut w = vec![0.0; out * d];
                for i in 0..out {
                    w[i * d + i / k] = 1.0;
                }
                Some((out, d, w))
            }
            ResizeAxis::Weights { input, output, weights } => Some((*output, *input, weights.clone())),
        }
    }
}

/// How a coordinate of the output maps to one of the input.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Coordinates {
    HalfPixel,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
}

impl Coordinates {
    /// The source coordinate of output element `x`, in float32 as the engines compute it
    /// (ONNX scales are float32; where nearest neighbour rounds an exact half or whole
    /// number, float64 would pick another element than they do).
    fn source(self, x: usize, scale: f32, output: usize, input: usize) -> f64 {
        let x = x as f32;
        f64::from(match self {
            Coordinates::HalfPixel => (x + 0.5) / scale - 0.5,
            Coordinates::PytorchHalfPixel if output > 1 => (x + 0.5) / scale - 0.5,
            Coordinates::PytorchHalfPixel => 0.0,
            Coordinates::AlignCorners if output > 1 => x * (input as f32 - 1.0) / (output as f32 - 1.0),
            Coordinates::AlignCorners => 0.0,
            Coordinates::Asymmetric => x / scale,
        })
    }
}

/// How `nearest` rounds a source coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rounding {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

impl Rounding {
    fn round(self, x: f64) -> f64 {
        match self {
            Rounding::PreferFloor if x.fract().abs() == 0.5 => x.floor(),
            Rounding::PreferCeil if x.fract().abs() == 0.5 => x.ceil(),
            Rounding::PreferFloor | Rounding::PreferCeil => x.round(),
            Rounding::Floor => x.floor(),
            Rounding::Ceil => x.ceil(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Nearest(Rounding),
    Linear,
    Cubic { a: f64, exclude_outside: bool },
}

/// The `sizes` input of a `Resize` as [`resize_axes`] takes it, from its values as
/// symbolic inference knows them: a known size, or `None` for an axis whose size is the
/// input's own symbol (`torch.onnx.export` writes the batch of `F.interpolate(x,
/// size=...)` as `Shape(x)[0]`).
fn resize_sizes(x: &[Dim], sizes: &[SymInt]) -> std::result::Result<Vec<Option<i64>>, String> {
    sizes
        .iter()
        .enumerate()
        .map(|(a, s)| match (s, x.get(a)) {
            (SymInt::Known(n), _) => Ok(Some(*n)),
            (SymInt::Symbol(s), Some(Dim::Symbol(d))) if s == d => Ok(None),
            _ => Err(format!("Resize needs its sizes known at load time (axis {a} is not)")),
        })
        .collect()
}

/// [`resize_axes`] with the scales and sizes as inference knows the node's inputs (the
/// shape rule, the gradient rule and the import's rewrite all read them so).
pub fn resize_axes_of(node: &Node, x: &[Dim], inf: &Inference) -> std::result::Result<Vec<ResizeAxis>, String> {
    let scales = node.input(2).and_then(|n| inf.constants.get(n)).and_then(|t| t.to_f64_vec());
    let sizes = match node.input(3) {
        Some(name) => {
            let values = match inf.symbolic.get(name) {
                Some(v) => v.clone(),
                None => inf
                    .constants
                    .get(name)
                    .and_then(|t| t.to_i64_vec())
                    .ok_or("Resize needs its sizes known at load time")?
                    .into_iter()
                    .map(SymInt::Known)
                    .collect(),
            };
            Some(resize_sizes(x, &values)?)
        }
        None => None,
    };
    resize_axes(node, x, scales, sizes)
}

/// Most elements a resized axis may have, and most elements of one axis's matrix: past
/// them a scale is taken for a mistake, not a model (and would not fit in memory).
const MAX_AXIS: usize = 1 << 20;
const MAX_MATRIX: usize = 1 << 26;

/// What each axis of a `Resize` of an input shaped `x` becomes, given its scales or
/// sizes (constants), or why it cannot be said: an attribute value the op table does not
/// take (`tf_crop_and_resize`, `antialias`, `axes`, a `keep_aspect_ratio_policy`), a
/// resized axis of unknown size (other than a repeat), or a size past [`MAX_AXIS`]. Scales
/// and output sizes are computed in float32, as ONNX defines them and the engines do.
pub fn resize_axes(
    node: &Node,
    x: &[Dim],
    scales: Option<Vec<f64>>,
    sizes: Option<Vec<Option<i64>>>,
) -> std::result::Result<Vec<ResizeAxis>, String> {
    let text = |name: &str, default: &str| node.attr_string(name, default).map_err(|e| e.to_string());
    let mode_name = text("mode", "nearest")?;
    let coordinates_name = text("coordinate_transformation_mode", "half_pixel")?;
    let rounding_name = text("nearest_mode", "round_prefer_floor")?;
    let rounding = match rounding_name.as_str() {
        "round_prefer_floor" => Rounding::PreferFloor,
        "round_prefer_ceil" => Rounding::PreferCeil,
        "floor" => Rounding::Floor,
        "ceil" => Rounding::Ceil,
        other => return Err(format!("Resize with nearest_mode {other:?} is not supported")),
    };
    let mode = match mode_name.as_str() {
        "nearest" => Mode::Nearest(rounding),
        "linear" => Mode::Linear,
        "cubic" => Mode::Cubic {
            a: node.attr_float("cubic_coeff_a", -0.75).map_err(|e| e.to_string())? as f64,
            exclude_outside: node.attr_int("exclude_outside", 0).map_err(|e| e.to_string())? != 0,
        },
        other => return Err(format!("Resize in mode {other:?} is not supported (nearest, linear, cubic are)")),
    };
    let coordinates = match coordinates_name.as_str() {
        "half_pixel" => Coordinates::HalfPixel,
        "pytorch_half_pixel" => Coordinates::PytorchHalfPixel,
        "align_corners" => Coordinates::AlignCorners,
        "asymmetric" => Coordinates::Asymmetric,
        other => {
            return Err(format!(
                "Resize with coordinate_transformation_mode {other:?} is not supported (half_pixel, \
                 pytorch_half_pixel, align_corners, asymmetric are)"
            ));
        }
    };
    if node.attr_int("antialias", 0).map_err(|e| e.to_string())? != 0 {
        return Err("Resize with antialias is not supported".into());
    }
    if node.attr_ints("axes").ok().flatten().is_some() {
        return Err("Resize with an \"axes\" attribute is not supported".into());
    }
    if text("keep_aspect_ratio_policy", "stretch")? != "stretch" {
        return Err("Resize with a keep_aspect_ratio_policy other than \"stretch\" is not supported".into());
    }
    // Per axis: the scale, and the output size where sizes give it.
    let per_axis: Vec<(f32, Option<usize>)> = match (scales, sizes) {
        (Some(s), _) if !s.is_empty() => s.into_iter().map(|s| (s as f32, None)).collect(),
        (_, Some(sizes)) => sizes
            .iter()
            .zip(x)
            .map(|(&n, d)| match (n, d.fixed()) {
                // The input's own size.
                (None, _) => (1.0, None),
                (Some(n), Some(d)) if d > 0 => (n as f32 / d as f32, Some(n.max(0) as usize)),
                // An axis of unknown size kept at 1 (an exporter's size for the batch).
                (Some(1), _) => (1.0, None),
                (Some(n), _) => (f32::NAN, Some(n.max(0) as usize)),
            })
            .collect(),
        _ => return Err("Resize needs its scales or sizes known at load time".into()),
    };
    if per_axis.len() != x.len() {
        return Err(format!("{} scales do not fit a rank-{} input", per_axis.len(), x.len()));
    }
    let repeats = mode == Mode::Nearest(Rounding::Floor) && coordinates == Coordinates::Asymmetric;
    let mut axes = Vec::with_capacity(x.len());
    for (a, (&(scale, size), d)) in per_axis.iter().zip(x).enumerate() {
        // Scale 1 maps every coordinate to itself in every mode.
        let same = scale == 1.0 && size.is_none_or(|n| Some(n) == d.fixed());
        if same || (d == &Dim::Fixed(1) && size == Some(1)) {
            axes.push(ResizeAxis::Repeat(1));
            continue;
        }
        if !(scale.is_finite() && scale > 0.0 && scale <= MAX_AXIS as f32) {
            return Err(format!("Resize has scale {scale} on axis {a}"));
        }
        if repeats && scale >= 1.0 && scale.fract() == 0.0 {
            axes.push(ResizeAxis::Repeat(scale as usize));
            continue;
        }
        let Some(input) = d.fixed() else {
            return Err(format!("Resize scales axis {a}, whose size is not known at load time"));
        };
        // floor(input · scale) in float32, as ONNX Runtime and tract size the output.
        let output = size.unwrap_or(((input as f32) * scale).floor() as usize);
        if output == 0 {
            return Err(format!("Resize makes axis {a} empty"));
        }
        if output > MAX_AXIS || output.saturating_mul(input) > MAX_MATRIX {
            return Err(format!("Resize makes axis {a} of {input} elements {output} long, past what it takes"));
        }
        axes.push(ResizeAxis::Weights { input, output, weights: weights(mode, coordinates, scale, input, output) });
    }
    Ok(axes)
}

/// `F.interpolate(x, size=(h, w))` exported with a dynamic batch gives `Resize` sizes
/// computed at run time, `Concat(Shape(x)[:2], [h, w])`; tract's `Resize` cannot read a
/// run-time symbol among them ("Undetermined symbol in expression: batch"). Where every
/// size is known or is the input's own symbolic dimension, the sizes become constant
/// scales: 1 for the symbolic axes, for the others the float32 nearest `out / in` (raised
/// by the least amount that makes `floor(in · scale)` give `out` in float32 arithmetic, as
/// the engines size the output). The coordinates then move by at most a float32 rounding
/// of the ratio, as exporting with `scale_factor` does. Returns how many were rewritten.
pub(crate) fn constant_scales_for_symbolic_sizes(model: &mut crate::ir::Model) -> crate::error::Result<usize> {
    use crate::ir::Attribute;
    use crate::tensor::Tensor;
    let has_sizes = |n: &Node| n.op_type == "Resize" && n.input(3).is_some();
    if !model.graph.nodes.iter().any(has_sizes) {
        return Ok(0);
    }
    let inference = super::infer(&model.graph, model.opset())?;
    // A new Constant's node and value share the name: avoid both kinds.
    let mut taken = model.graph.value_names();
    taken.extend(model.graph.nodes.iter().map(|n| n.name.clone()));
    let mut constants = Vec::new();
    for node in model.graph.nodes.iter_mut().filter(|n| has_sizes(n)) {
        let sizes = node.input(3).unwrap_or_default().to_string();
        if inference.constants.contains_key(&sizes) {
            continue;
        }
        let (Some(values), Some(x)) = (
            inference.symbolic.get(&sizes),
            node.input(0).and_then(|v| inference.types.get(v)).and_then(|t| t.shape.clone()),
        ) else {
            continue;
        };
        let Ok(sizes_per_axis) = resize_sizes(&x, values) else { continue };
        let mut scales = Vec::with_capacity(x.len());
        for (n, d) in sizes_per_axis.iter().zip(&x) {
            scales.push(match (n, d.fixed()) {
                (None, _) => 1.0f32,
                (Some(n), Some(d)) if *n > 0 && d > 0 => {
                    let mut s = *n as f32 / d as f32;
                    while ((d as f32) * s).floor() < *n as f32 {
                        s = s.next_up();
                    }
                    s
                }
                _ => break,
            });
        }
        if scales.len() != x.len() {
            continue;
        }
        let name = crate::ir::fresh_name(&mut taken, &format!("{}/scales", node.name));
        constants.push(
            Node::new(name.clone(), "Constant", &[], &[&name])
                .with_attr("value", Attribute::Tensor(Tensor::from_f32(vec![scales.len()], &scales)?)),
        );
        node.inputs.truncate(2);
        node.inputs.push(name);
    }
    let rewritten = constants.len();
    if rewritten > 0 {
        constants.append(&mut model.graph.nodes);
        model.graph.nodes = constants;
        crate::sort::sort_topologically(&mut model.graph)?;
        model.graph.remove_dead_nodes();
    }
    Ok(rewritten)
}

/// The `output × input` matrix of one axis (ONNX's `Resize`: source coordinates from the
/// transformation; neighbours past either end read the end element).
fn weights(mode: Mode, coordinates: Coordinates, scale: f32, input: usize, output: usize) -> Vec<f64> {
    let mut w = vec![0.0; output * input];
    let last = input as i64 - 1;
    let at = |i: i64| i.clamp(0, last) as usize;
    for o in 0..output {
        let row = &mut w[o * input..(o + 1) * input];
        let x = coordinates.source(o, scale, output, input);
        match mode {
            Mode::Nearest(rounding) => row[at(rounding.round(x) as i64)] = 1.0,
            Mode::Linear => {
                let x0 = x.floor();
                let r = x - x0;
                row[at(x0 as i64)] += 1.0 - r;
                row[at(x0 as i64 + 1)] += r;
            }
            Mode::Cubic { a, exclude_outside } => {
                let x0 = x.floor();
                let r = x - x0;
                // Keys' cubic convolution kernel at the four neighbours' distances.
                let near = |t: f64| ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
                let far = |t: f64| ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a;
                let c = [far(r + 1.0), near(r), near(1.0 - r), far(2.0 - r)];
                let base = x0 as i64 - 1;
                let inside = |k: usize| (0..=last).contains(&(base + k as i64));
                let total: f64 = (0..4).filter(|&k| inside(k)).map(|k| c[k]).sum();
                for (k, &ck) in c.iter().enumerate() {
                    if exclude_outside {
                        if inside(k) {
                            row[at(base + k as i64)] += ck / total;
                        }
                    } else {
                        row[at(base + k as i64)] += ck;
                    }
                }
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(mode: Mode, coordinates: Coordinates, scale: f32, input: usize, output: usize) -> Vec<Vec<f64>> {
        weights(mode, coordinates, scale, input, output).chunks(input).map(<[f64]>::to_vec).collect()
    }

    #[test]
    fn every_row_sums_to_one() {
        let modes = [
            Mode::Nearest(Rounding::PreferFloor),
            Mode::Linear,
            Mode::Cubic { a: -0.75, exclude_outside: false },
            Mode::Cubic { a: -0.5, exclude_outside: true },
        ];
        let coords =
            [Coordinates::HalfPixel, Coordinates::PytorchHalfPixel, Coordinates::AlignCorners, Coordinates::Asymmetric];
        for mode in modes {
            for c in coords {
                for (input, output) in [(4, 8), (5, 3), (3, 7), (1, 4)] {
                    for row in matrix(mode, c, output as f32 / input as f32, input, output) {
                        let sum: f64 = row.iter().sum();
                        assert!((sum - 1.0).abs() < 1e-12, "{mode:?} {c:?} {input}->{output}: {row:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn bilinear_doubling_with_half_pixels_is_three_quarters_and_a_quarter() {
        // PyTorch's bilinear upsampling by 2 (align_corners=False): output 1 lies a quarter
        // of the way from input 0 to input 1; output 0 reads input 0 alone (the edge).
        let m = matrix(Mode::Linear, Coordinates::HalfPixel, 2.0, 3, 6);
        assert_eq!(m[0], [1.0, 0.0, 0.0]);
        assert_eq!(m[1], [0.75, 0.25, 0.0]);
        assert_eq!(m[2], [0.25, 0.75, 0.0]);
        assert_eq!(m[5], [0.0, 0.0, 1.0]);
        // align_corners: the ends coincide, the rest spaced evenly.
        let m = matrix(Mode::Linear, Coordinates::AlignCorners, 2.0, 3, 5);
        assert_eq!(m[0], [1.0, 0.0, 0.0]);
        assert_eq!(m[1], [0.5, 0.5, 0.0]);
        assert_eq!(m[4], [0.0, 0.0, 1.0]);
    }

    #[test]
    fn sizes_and_coordinates_are_float32_as_the_engines_compute_them() {
        // floor(10 · 0.7) is 7 in float32 (0.7f32 · 10 = 7.0000005) and 6 in float64
        // (0.7 · 10 = 6.999999999999999).
        let node = Node::new("up", "Resize", &["x", "", "s"], &["y"])
            .with_attr("mode", crate::ir::Attribute::String(b"nearest".to_vec()))
            .with_attr("coordinate_transformation_mode", crate::ir::Attribute::String(b"asymmetric".to_vec()))
            .with_attr("nearest_mode", crate::ir::Attribute::String(b"floor".to_vec()));
        let x = [Dim::Fixed(1), Dim::Fixed(10)];
        let axes = resize_axes(&node, &x, Some(vec![1.0, f64::from(0.7f32)]), None).unwrap();
        assert_eq!(axes[1].output_dim(&x[1]), Dim::Fixed(7));
        // Sizes 6 → 4: scale 4/6 = 0.6666667 in float32, and output 2 reads 2 / 0.6666667
        // = 3.0 (float32), element 3 with floor rounding (2.9999999, element 2, in float64).
        let axes = resize_axes(&node, &[Dim::Fixed(1), Dim::Fixed(6)], None, Some(vec![Some(1), Some(4)])).unwrap();
        let (_, _, w) = axes[1].matrix(6).unwrap();
        assert_eq!(&w[2 * 6..3 * 6], &[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        // Absurd scales are errors, not allocations.
        for scale in [1e12, 1e20, f64::INFINITY] {
            assert!(resize_axes(&node, &x, Some(vec![1.0, scale]), None).is_err(), "{scale}");
        }
    }

    #[test]
    fn nearest_rounding_modes_differ_at_halves() {
        // Asymmetric coordinates at scale 2/3: output 1 reads input 1.5.
        let pick = |r| matrix(Mode::Nearest(r), Coordinates::Asymmetric, 2.0 / 3.0, 3, 2)[1].clone();
        assert_eq!(pick(Rounding::PreferFloor), [0.0, 1.0, 0.0]);
        assert_eq!(pick(Rounding::PreferCeil), [0.0, 0.0, 1.0]);
        assert_eq!(pick(Rounding::Floor), [0.0, 1.0, 0.0]);
        assert_eq!(pick(Rounding::Ceil), [0.0, 0.0, 1.0]);
    }
}
