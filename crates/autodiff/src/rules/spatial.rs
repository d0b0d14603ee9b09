//! Gradient rules of convolution and pooling.
//!
//! Every rule is written in ops that ONNX Runtime, tract and the ONNX reference evaluator
//! all run with a symbolic batch: spatial sizes and channels must be known, the batch
//! need not be.
//!
//! - `Conv`: the input gradient is a `ConvTranspose` of dY with the weight (explicit pads
//!   and output padding so that it has exactly X's size), or at stride 1 a `Conv` of dY
//!   with the flipped kernel; the weight gradient is an im2col built from one strided
//!   `Slice` per kernel offset, each in a `MatMul` with dY: per sample and summed over the
//!   batch in the early layers, with batch and positions contracted together in the deep
//!   ones and depthwise (a grouped `MatMul` for other grouped convolutions)
//!   (tract cannot run a `Conv` whose kernel has a symbolic dimension, which rules out the
//!   "batch as channels" convolution); the bias gradient sums dY.
//! - `MaxPool`: the same pool again with its `Indices` output (the first maximum of each
//!   window in row-major order on ONNX Runtime and tract, as in PyTorch), and dY added
//!   at those positions into zeros of X's size by a `ScatterElements` per (n, c) plane.
//!   Where that cannot be written (overlapping windows before opset 16; stride-1 pools,
//!   whose indices onnx.reference gets wrong): each kernel offset's strided slice of the
//!   input (padded with the lowest value) is compared with Y, dY goes to the first
//!   position equal to its window's maximum, and one `ConvTranspose` with a one-hot
//!   kernel scatters it back. The forward node's own `Indices` output carries no
//!   gradient.
//! - `AveragePool`: dY divided by each window's element count (known statically; with
//!   `count_include_pad` the explicit padding counts, the `ceil_mode` overhang never does)
//!   is scattered back by a `ConvTranspose` with a kernel of ones.
//! - `GlobalAveragePool`: dY / (spatial size), expanded; `GlobalMaxPool`: dY at the first
//!   position where X = Y.
//!
//! onnx.reference computes a grouped `ConvTranspose` correctly only with one input and one
//! output channel per group, so that is the only grouped form emitted: the pooling
//! scatters fold the channels into the batch and run ungrouped, and grouped convolutions
//! are split per group unless they are depthwise.

use super::{InputGrads, RuleCx};
use crate::error::{AutodiffError, Result};
use edgefreeze_graph::DataType;
use edgefreeze_graph::infer::Window;
use edgefreeze_graph::ir::{Attribute, Dim, Node};

/// The window of a sliding-window node with known spatial sizes and channel count.
struct Geometry {
    window: Window,
    /// Channels of the input.
    channels: usize,
    /// Spatial sizes of the input.
    input: Vec<usize>,
    /// Spatial sizes of the output.
    output: Vec<usize>,
}

impl Geometry {
    fn of(cx: &RuleCx<'_>, weight_kernel: Option<&[Dim]>) -> Result<Geometry> {
        let x = cx.shape(cx.x(0))?;
        if x.len() < 3 {
            return Err(cx.err(format!("the input must be N×C×spatial..., got rank {}", x.len())));
        }
        let known = |dims: &[Dim], what: &str| -> Result<Vec<usize>> {
            dims.iter().map(|d| d.fixed().ok_or_else(|| cx.err(format!("the gradient needs known {what}")))).collect()
        };
        let channels = known(&x[1..2], "input channels")?[0];
        let input = known(&x[2..], "spatial sizes of the input")?;
        let window = Window::from_node(cx.node, &x[2..], weight_kernel)?;
        let output = known(&window.output(cx.node, &x[2..])?, "spatial sizes of the output")?;
        if output.contains(&0) {
            return Err(cx.err("the output is empty"));
        }
        Ok(Geometry { window, channels, input, output })
    }

    fn axes(&self) -> usize {
        self.input.len()
    }

    /// Kernel extent along `axis` with dilation.
    fn extent(&self, axis: usize) -> usize {
        (self.window.kernel[axis] - 1) * self.window.dilations[axis] + 1
    }

    /// Length, in padded coordinates, of what the windows read along `axis`.
    fn span(&self, axis: usize) -> usize {
        (self.output[axis] - 1) * self.window.strides[axis] + self.extent(axis)
    }

    /// Elements of the kernel.
    fn kernel_size(&self) -> usize {
        self.window.kernel.iter().product()
    }

    /// Output positions per channel.
    fn output_size(&self) -> usize {
        self.output.iter().product()
    }

    fn ints(values: &[usize]) -> Attribute {
        Attribute::Ints(values.iter().map(|&v| v as i64).collect())
    }
}

/// Every kernel offset, row-major (the order of a weight's kernel axes).
fn offsets(kernel: &[usize]) -> Vec<Vec<usize>> {
    let mut all = vec![Vec::new()];
    for &k in kernel {
        all = all
            .into_iter()
            .flat_map(|prefix: Vec<usize>| {
                (0..k).map(move |i| {
                    let mut p = prefix.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    all
}

/// Where the spatial axes of a rank-(2 + spatial) tensor are.
#[derive(Clone, Copy)]
enum Layout {
    /// `[N, C, spatial...]` (ONNX's), or `[C, N, spatial...]`.
    ChannelsFirst,
    /// `[N, spatial..., C]`.
    ChannelsLast,
}

impl Layout {
    fn first_spatial_axis(self) -> usize {
        match self {
            Layout::ChannelsFirst => 2,
            Layout::ChannelsLast => 1,
        }
    }
}

/// Pads the spatial axes of `x` with a constant (`None`: zero); `x` itself when no padding.
fn pad_spatial(cx: &mut RuleCx<'_>, x: &str, begin: &[usize], end: &[usize], value: Option<f64>) -> String {
    pad_spatial_in(cx, x, Layout::ChannelsFirst, begin, end, value)
}

fn pad_spatial_in(
    cx: &mut RuleCx<'_>,
    x: &str,
    layout: Layout,
    begin: &[usize],
    end: &[usize],
    value: Option<f64>,
) -> String {
    if begin.iter().chain(end).all(|&p| p == 0) {
        return x.to_string();
    }
    let (rank, first) = (begin.len() + 2, layout.first_spatial_axis());
    let mut pads = vec![0i64; 2 * rank];
    for (a, (&b, &e)) in begin.iter().zip(end).enumerate() {
        pads[first + a] = b as i64;
        pads[rank + first + a] = e as i64;
    }
    let pads = cx.e.ints(&pads);
    match value {
        Some(v) => {
            let v = cx.e.scalar(v);
            cx.e.op("Pad", &[x, &pads, &v], vec![])
        }
        None => cx.e.op("Pad", &[x, &pads], vec![]),
    }
}

/// For each kernel offset (row-major), the strided slice of the padded input `xp`
/// (spatial sizes `padded`) that the offset reads in every window: `[N, C, out...]` each;
/// `None` for an offset whose every window reads padding only (its slice is zeros): a
/// 3×3 kernel with padding 1 on a 1×1 map reads the map with its centre alone.
fn offset_slices(cx: &mut RuleCx<'_>, xp: &str, padded: &[usize], geo: &Geometry) -> Vec<Option<String>> {
    offset_slices_in(cx, xp, Layout::ChannelsFirst, padded, geo, true)
}

/// Whether some window reads, at kernel offset `offset`, a position of the input itself
/// rather than of its padding.
fn reads_input(geo: &Geometry, offset: &[usize]) -> bool {
    let w = &geo.window;
    (0..geo.axes()).all(|a| {
        let start = offset[a] * w.dilations[a];
        let inside = w.pads_begin[a]..w.pads_begin[a] + geo.input[a];
        (0..geo.output[a]).any(|j| inside.contains(&(start + j * w.strides[a])))
    })
}

/// [`offset_slices`] of a tensor whose spatial axes are where `layout` puts them; with
/// `skip_padding` false, every offset's slice.
fn offset_slices_in(
    cx: &mut RuleCx<'_>,
    xp: &str,
    layout: Layout,
    padded: &[usize],
    geo: &Geometry,
    skip_padding: bool,
) -> Vec<Option<String>> {
    let n = geo.axes();
    let w = &geo.window;
    let first = layout.first_spatial_axis() as i64;
    let axes = cx.e.ints(&(first..first + n as i64).collect::<Vec<_>>());
    let steps = cx.e.ints(&w.strides.iter().map(|&s| s as i64).collect::<Vec<_>>());
    let mut parts = Vec::new();
    for offset in offsets(&w.kernel) {
        if skip_padding && !reads_input(geo, &offset) {
            parts.push(None);
            continue;
        }
        let starts: Vec<usize> = (0..n).map(|a| offset[a] * w.dilations[a]).collect();
        let ends: Vec<usize> = (0..n).map(|a| starts[a] + (geo.output[a] - 1) * w.strides[a] + 1).collect();
        let whole = (0..n).all(|a| starts[a] == 0 && w.strides[a] == 1 && ends[a] == padded[a]);
        if whole {
            parts.push(Some(xp.to_string()));
            continue;
        }
        let starts = cx.e.ints(&starts.iter().map(|&s| s as i64).collect::<Vec<_>>());
        let ends = cx.e.ints(&ends.iter().map(|&s| s as i64).collect::<Vec<_>>());
        parts.push(Some(cx.e.op("Slice", &[xp, &starts, &ends, &axes, &steps], vec![])));
    }
    parts
}

/// The per-offset products `product(slice)` of the slices that read the input, and for
/// the offsets that read padding only zeros of the product's shape `dims` (made at run
/// time from that shape, not stored).
fn offset_products(
    cx: &mut RuleCx<'_>,
    slices: Vec<Option<String>>,
    dims: &[usize],
    mut product: impl FnMut(&mut RuleCx<'_>, String) -> String,
) -> Vec<String> {
    slices
        .into_iter()
        .map(|slice| match slice {
            Some(slice) => product(cx, slice),
            None => {
                let shape = cx.e.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
                let zero = edgefreeze_graph::Tensor::from_f64_as(cx.e.float, vec![1], &[0.0])
                    .expect("a one-element tensor always fits");
                cx.e.op("ConstantOfShape", &[&shape], vec![("value", Attribute::Tensor(zero))])
            }
        })
        .collect()
}

/// The [`offset_slices`] concatenated along the channels to `[N, K·C, out...]`
/// (offset-major).
fn window_slices(cx: &mut RuleCx<'_>, xp: &str, padded: &[usize], geo: &Geometry) -> String {
    let parts: Vec<String> =
        offset_slices_in(cx, xp, Layout::ChannelsFirst, padded, geo, false).into_iter().flatten().collect();
    concat_along(cx, &parts, 1)
}

/// `parts` concatenated along `axis`; a single part as it is.
fn concat_along(cx: &mut RuleCx<'_>, parts: &[String], axis: i64) -> String {
    if let [one] = parts {
        return one.clone();
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    cx.e.op("Concat", &refs, vec![("axis", Attribute::Int(axis))])
}

/// Per-offset results `[A, B]` (offset-major, as [`offsets`] lists them) stacked on a
/// last axis to `[A, B, K]`, then given `shape`.
fn stack_offsets(cx: &mut RuleCx<'_>, parts: &[String], shape: &[usize]) -> String {
    let parts: Vec<String> = parts.iter().map(|p| cx.e.unsqueeze(p, &[2])).collect();
    let stacked = concat_along(cx, &parts, 2);
    cx.e.reshape(&stacked, &shape.iter().map(|&v| v as i64).collect::<Vec<_>>())
}

/// A `ConvTranspose` of `values` (`[N, C_in, out...]`) with `weight` that scatters window
/// values back onto the input: it has the window's strides and dilations, and pads and
/// output padding chosen so that its result has exactly the input's spatial size (the
/// start padding is cropped, as is any window overhang at the end; input positions no
/// window reads get zeros).
fn scatter(cx: &mut RuleCx<'_>, values: &str, weight: &str, geo: &Geometry, group: usize) -> String {
    let n = geo.axes();
    let w = &geo.window;
    let mut pads_end = vec![0; n];
    let mut output_padding = vec![0; n];
    for a in 0..n {
        let (full, target) = (geo.span(a), geo.input[a] + w.pads_begin[a]);
        if full >= target {
            pads_end[a] = full - target;
        } else {
            output_padding[a] = target - full;
        }
    }
    let mut pads = w.pads_begin.clone();
    pads.extend(pads_end);
    let mut attrs = vec![
        ("kernel_shape", Geometry::ints(&w.kernel)),
        ("strides", Geometry::ints(&w.strides)),
        ("dilations", Geometry::ints(&w.dilations)),
        ("pads", Geometry::ints(&pads)),
        ("group", Attribute::Int(group as i64)),
    ];
    if output_padding.iter().any(|&p| p != 0) {
        attrs.push(("output_padding", Geometry::ints(&output_padding)));
    }
    cx.e.op("ConvTranspose", &[values, weight], attrs)
}

/// X `[N, C, in...]`, W `[M, C/group, k...]`, optional B `[M]` → Y `[N, M, out...]`.
pub(super) fn conv(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let (x, w) = (cx.x(0).to_string(), cx.x(1).to_string());
    let w_shape = cx.fixed_shape(&w)?;
    let kernel: Vec<Dim> = w_shape[2..].iter().map(|&d| Dim::Fixed(d)).collect();
    let geo = Geometry::of(cx, Some(&kernel))?;
    let group = cx.node.attr_int("group", 1)?.max(1) as usize;
    let (m, cg) = (w_shape[0], w_shape[1]);
    if geo.channels != cg * group || m % group != 0 {
        return Err(cx.err(format!("{} input channels, weight {w_shape:?} and group {group} do not fit", geo.channels)));
    }
    let n = geo.axes();
    let mut g = cx.none();
    if cx.need(0) {
        g[0] = Some(conv_input_grad(cx, &dy, &w, &w_shape, &geo, group));
    }
    if cx.need(1) {
        g[1] = Some(conv_weight_grad(cx, &x, &dy, &w_shape, &geo, group));
    }
    if cx.need(2) {
        let axes: Vec<i64> = std::iter::once(0).chain(2..2 + n as i64).collect();
        g[2] = Some(cx.e.reduce_sum(&dy, &axes, false));
    }
    Ok(g)
}

/// The adjoint of a convolution: the transposed convolution of dY with the same weight,
/// or, at stride 1, the equivalent `Conv` of dY with the flipped kernel
/// ([`flipped_kernel_input_grad`]), which ONNX Runtime and tract both run faster than
/// their `ConvTranspose`.
///
/// onnx.reference runs a grouped `ConvTranspose` correctly only with one input and one
/// output channel per group, so a grouped convolution becomes either that depthwise form
/// (one input channel per group: each output channel scatters back on its own, then the
/// channel multiplier is summed) or one ungrouped `ConvTranspose` per group.
fn conv_input_grad(cx: &mut RuleCx<'_>, dy: &str, w: &str, w_shape: &[usize], geo: &Geometry, group: usize) -> String {
    let (m, cg) = (w_shape[0], w_shape[1]);
    let mg = m / group;
    // The flipped kernel's `Conv` has X's C channels as its output rows: with fewer than
    // FLIPPED_MIN_CHANNELS (LeNet-5's 6) the engines' GEMM tiles run mostly empty and the
    // `ConvTranspose` is faster (on tract, 14–28% of LeNet-5's step).
    if ((group == 1 && geo.channels >= FLIPPED_MIN_CHANNELS) || cg == 1)
        && let Some(dx) = flipped_kernel_input_grad(cx, dy, w, w_shape, geo, group)
    {
        return dx;
    }
    if group == 1 {
        return scatter(cx, dy, w, geo, 1);
    }
    if cg == 1 {
        let dx = scatter(cx, dy, w, geo, m);
        if mg == 1 {
            return dx;
        }
        let mut shape = vec![-1, geo.channels as i64, mg as i64];
        shape.extend(geo.input.iter().map(|&s| s as i64));
        let dx = cx.e.reshape(&dx, &shape);
        return cx.e.reduce_sum(&dx, &[2], false);
    }
    let sizes = cx.e.ints(&vec![mg as i64; group]);
    let mut split = |x: &str, axis: i64| -> Vec<String> {
        let parts: Vec<String> = (0..group).map(|_| cx.e.fresh("split")).collect();
        let outputs: Vec<&str> = parts.iter().map(String::as_str).collect();
        cx.e.op_into("Split", &[x, &sizes], &outputs, vec![("axis", Attribute::Int(axis))]);
        parts
    };
    let (dys, ws) = (split(dy, 1), split(w, 0));
    let parts: Vec<String> = dys.iter().zip(&ws).map(|(d, wk)| scatter(cx, d, wk, geo, 1)).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    cx.e.op("Concat", &parts, vec![("axis", Attribute::Int(1))])
}

/// Below this many input channels an ungrouped convolution's input gradient stays a
/// `ConvTranspose` (see [`conv_input_grad`]).
const FLIPPED_MIN_CHANNELS: usize = 16;

/// The input gradient of a stride-1 convolution, ungrouped or depthwise (one input
/// channel per group, Mg outputs each), as a `Conv` of dY with the spatially flipped
/// kernel: dX[n, c, i] = Σ_{m, t} dY[n, m, i + p_begin − t·d] · W[m, c, t], a correlation
/// with W[m, c, k − 1 − t] padded by (k − 1)·d − p on each side. Ungrouped, the kernel's
/// two channel axes swap (C output channels reading M); depthwise, the channel
/// multiplier is summed by each group's Mg input channels. `None` (the caller scatters
/// instead) with strides (the correlation would need dY dilated) or padding beyond the
/// kernel's extent (negative pads).
fn flipped_kernel_input_grad(
    cx: &mut RuleCx<'_>,
    dy: &str,
    w: &str,
    w_shape: &[usize],
    geo: &Geometry,
    group: usize,
) -> Option<String> {
    let win = &geo.window;
    let n = geo.axes();
    if win.strides.iter().any(|&s| s != 1) {
        return None;
    }
    let mut pads = vec![0; 2 * n];
    for a in 0..n {
        let reach = geo.extent(a) - 1;
        pads[a] = reach.checked_sub(win.pads_begin[a])?;
        pads[n + a] = reach.checked_sub(win.pads_end[a])?;
    }
    let (m, cg, k) = (w_shape[0] as i64, w_shape[1] as i64, geo.kernel_size() as i64);
    // The kernel as [out, in, K] of the new convolution: ungrouped, W's channel axes
    // swapped ([C, M, K]); depthwise, W itself read as C groups of Mg inputs ([C·Mg, 1, K]
    // is [C, Mg, K] in memory).
    let (kernel, out, inp) = if group == 1 {
        let flat = cx.e.reshape(w, &[m, cg, k]);
        (cx.e.transpose(&flat, &[1, 0, 2]), cg, m)
    } else {
        let c = geo.channels as i64;
        (cx.e.reshape(w, &[c, m / c, k]), c, m / c)
    };
    // Reversing every kernel axis reverses the row-major flattened kernel.
    let kernel = if k > 1 {
        let reversed = cx.e.ints(&(0..k).rev().collect::<Vec<_>>());
        cx.e.op("Gather", &[&kernel, &reversed], vec![("axis", Attribute::Int(2))])
    } else {
        kernel
    };
    let mut kernel_shape = vec![out, inp];
    kernel_shape.extend(win.kernel.iter().map(|&v| v as i64));
    let kernel = cx.e.reshape(&kernel, &kernel_shape);
    let conv_group = if group == 1 { 1 } else { geo.channels as i64 };
    Some(cx.e.op(
        "Conv",
        &[dy, &kernel],
        vec![
            ("kernel_shape", Geometry::ints(&win.kernel)),
            ("dilations", Geometry::ints(&win.dilations)),
            ("pads", Geometry::ints(&pads)),
            ("group", Attribute::Int(conv_group)),
        ],
    ))
}

/// An ungrouped convolution with at least this many times as many output channels as
/// input channels, and more positions than outputs, takes its weight gradient from an
/// im2col in groups of M / C offsets ([`conv_weight_grad`]).
const FEW_INPUT_CHANNELS: i64 = 4;

/// dW[m, c, k] = Σ_{n, p} dY[n, m, p] · cols[n, c, k, p], per group, where `cols` is the
/// im2col of the padded input made of one strided slice per kernel offset.
///
/// Ungrouped, one of two products per offset, by which is smaller:
/// - while the per-sample result `[N, M, C]` would be smaller than the slice `[N, C, P]`
///   (M < P, the early layers: many positions, few channels), one product per sample,
///   summed over the batch by a `ReduceSum`; the batch keeps both engines' threads busy
///   on these thin products. The product is oriented so that the larger channel count
///   is its columns, which both engines' kernels vectorise: with C ≥ M,
///   dY `[N, M, P]` · sliceᵀ `[N, P, C]` (ONNX Runtime fuses the transpose into the
///   product); with C < M (a first layer's one input channel, a widening layer),
///   slice `[N, C, P]` · dYᵀ `[N, P, M]`, dY transposed once for every offset and the
///   weight-sized result at the end (on ONNX Runtime, 1.4–1.5x LeNet-5's and M5's step
///   against the other orientation, whose products are matrix-vector);
/// - but with at most a [`FEW_INPUT_CHANNELS`]th as many input channels as outputs (a
///   first layer: one audio or grey channel, three colours), the per-offset product is
///   still a vector times dYᵀ, and each of the K offsets streams all of dY through it
///   (M5's first layer: 80 offsets, 4 MiB of dY each at batch 64). There the offsets'
///   slices are concatenated, M / C offsets at a time, into im2cols `[N, G·C, P]` no
///   larger than dY, each in one product per sample with dYᵀ `[N, P, M]`: dY is read
///   K·C / M times, not K, and the products are matrices, not vectors (one `Gather` at
///   constant positions instead of the slices ran LeNet-5's step on ONNX Runtime 1.5-2x
///   slower, docs/results.md);
/// - otherwise (few positions, many channels: the deep layers) the batch is folded into
///   the contraction: X transposed once to channels-last, so that each offset's slice is
///   `[N·P, C]`, and dY once to `[M, N·P]`; one `MatMul` goes straight to `[M, C]`. No
///   per-sample tensor larger than the activation is kept alive, and no `ReduceSum` runs
///   over one (tract runs it as a scalar loop: half of ResNet-18's step when every
///   layer had one, docs/results.md).
///
/// Depthwise (one input channel per group, Mg outputs each), X is transposed once to
/// `[C, N, in...]` and dY to `[C, Mg, N·P]`: per offset a batched matrix-vector product,
/// `[C, Mg, N·P]` · `[C, N·P, 1]`, or with one output per channel (Mg = 1) a product and
/// a sum over N·P. Otherwise the columns are regrouped for a batched `MatMul`.
///
/// (A single `Conv` with batch and channels swapped, the "batch as channels" form, is
/// ruled out: its kernel is dY or X, whose batch dimension is symbolic, and tract only
/// builds a `Conv` whose kernel shape is concrete; ONNX Runtime, which accepts it, runs
/// it slower than the per-offset form, see docs/results.md.)
fn conv_weight_grad(cx: &mut RuleCx<'_>, x: &str, dy: &str, w_shape: &[usize], geo: &Geometry, group: usize) -> String {
    let w = &geo.window;
    let n = geo.axes() as i64;
    let padded: Vec<usize> = (0..geo.axes()).map(|a| geo.input[a] + w.pads_begin[a] + w.pads_end[a]).collect();
    let (k, p) = (geo.kernel_size() as i64, geo.output_size() as i64);
    let (g, cg, mg) = (group as i64, w_shape[1] as i64, (w_shape[0] / group) as i64);
    if group == 1 && mg < p && FEW_INPUT_CHANNELS * cg <= mg {
        // A thin input (a first layer): the im2col in groups of offsets, one product per
        // sample and group (doc above).
        let xp = pad_spatial(cx, x, &w.pads_begin, &w.pads_end, None);
        let d = cx.e.reshape(dy, &[-1, mg, p]);
        let d = cx.e.transpose(&d, &[0, 2, 1]);
        let slices: Vec<String> =
            offset_slices_in(cx, &xp, Layout::ChannelsFirst, &padded, geo, false).into_iter().flatten().collect();
        // At least FEW_INPUT_CHANNELS offsets per group, by the condition above.
        let mut parts = Vec::new();
        for group in slices.chunks((mg / cg) as usize) {
            let cols = concat_along(cx, group, 1);
            let cols = cx.e.reshape(&cols, &[-1, group.len() as i64 * cg, p]);
            let prod = cx.e.op("MatMul", &[&cols, &d], vec![]);
            parts.push(cx.e.reduce_sum(&prod, &[0], false));
        }
        // [K·C, M] (offset-major rows) → [K, C, M] → W's [M, C, K].
        let summed = concat_along(cx, &parts, 0);
        let summed = cx.e.reshape(&summed, &[k, cg, mg]);
        let summed = cx.e.transpose(&summed, &[2, 1, 0]);
        return cx.e.reshape(&summed, &w_shape.iter().map(|&v| v as i64).collect::<Vec<_>>());
    }
    if group == 1 && mg < p {
        // The larger channel count as the product's columns (doc above).
        let widening = cg < mg;
        let xp = pad_spatial(cx, x, &w.pads_begin, &w.pads_end, None);
        let d = cx.e.reshape(dy, &[-1, mg, p]);
        let d = if widening { cx.e.transpose(&d, &[0, 2, 1]) } else { d };
        let slices = offset_slices(cx, &xp, &padded, geo);
        let dims = if widening { [cg, mg] } else { [mg, cg] }.map(|v| v as usize);
        let parts = offset_products(cx, slices, &dims, |cx, slice| {
            let slice = cx.e.reshape(&slice, &[-1, cg, p]);
            let prod = if widening {
                cx.e.op("MatMul", &[&slice, &d], vec![])
            } else {
                let slice = cx.e.transpose(&slice, &[0, 2, 1]);
                cx.e.op("MatMul", &[&d, &slice], vec![])
            };
            cx.e.reduce_sum(&prod, &[0], false)
        });
        if !widening {
            return stack_offsets(cx, &parts, w_shape);
        }
        // [C, M] per offset → [C, M, K] → W's [M, C, K].
        let stacked = stack_offsets(cx, &parts, &[cg as usize, mg as usize, k as usize]);
        let stacked = cx.e.transpose(&stacked, &[1, 0, 2]);
        return cx.e.reshape(&stacked, &w_shape.iter().map(|&v| v as i64).collect::<Vec<_>>());
    }
    if group == 1 {
        let last: Vec<i64> = std::iter::once(0).chain(2..2 + n).chain([1]).collect();
        let xt = cx.e.transpose(x, &last);
        let xtp = pad_spatial_in(cx, &xt, Layout::ChannelsLast, &w.pads_begin, &w.pads_end, None);
        let d = cx.e.reshape(dy, &[-1, mg, p]);
        let d = cx.e.transpose(&d, &[1, 0, 2]);
        let d = cx.e.reshape(&d, &[mg, -1]);
        let slices = offset_slices_in(cx, &xtp, Layout::ChannelsLast, &padded, geo, true);
        let parts = offset_products(cx, slices, &[mg as usize, cg as usize], |cx, slice| {
            let slice = cx.e.reshape(&slice, &[-1, cg]);
            cx.e.op("MatMul", &[&d, &slice], vec![])
        });
        return stack_offsets(cx, &parts, w_shape);
    }
    if cg == 1 {
        // dW[c·Mg + j, 0, k] = Σ_{n,p} dY[n, c·Mg + j, p] · slice_k[c, n, p].
        let swap: Vec<i64> = [1, 0].into_iter().chain(2..2 + n).collect();
        let xt = cx.e.transpose(x, &swap);
        let xtp = pad_spatial(cx, &xt, &w.pads_begin, &w.pads_end, None);
        let d = cx.e.transpose(dy, &swap);
        // One output per channel: the product of [C, 1, N·P] by [C, N·P, 1] is C dot
        // products, which engines run as C matrix products of one row and one column
        // (tract packs both operands of each: 9 of these were 5% of MobileNetV2's step);
        // a product and a sum over the last axis are two plain passes.
        let d = cx.e.reshape(&d, &if mg == 1 { vec![g, -1] } else { vec![g, mg, -1] });
        let slices = offset_slices(cx, &xtp, &padded, geo);
        let parts = offset_products(cx, slices, &[(g * mg) as usize, 1], |cx, slice| {
            if mg == 1 {
                let slice = cx.e.reshape(&slice, &[g, -1]);
                let prod = cx.e.mul(&d, &slice);
                return cx.e.reduce_sum(&prod, &[1], true);
            }
            let slice = cx.e.reshape(&slice, &[g, -1, 1]);
            let prod = cx.e.op("MatMul", &[&d, &slice], vec![]);
            cx.e.reshape(&prod, &[g * mg, 1])
        });
        return stack_offsets(cx, &parts, w_shape);
    }
    let xp = pad_spatial(cx, x, &w.pads_begin, &w.pads_end, None);
    let cols = window_slices(cx, &xp, &padded, geo);
    // [N, K·C, P] (offset-major) → [N, K, g, Cg, P] → [g, N, P, Cg, K] → [g, N·P, Cg·K].
    let cols = cx.e.reshape(&cols, &[-1, k, g, cg, p]);
    let cols = cx.e.transpose(&cols, &[2, 0, 4, 3, 1]);
    let cols = cx.e.reshape(&cols, &[g, -1, cg * k]);
    // dY [N, M, out...] → [N, g, Mg, P] → [g, Mg, N, P] → [g, Mg, N·P].
    let d = cx.e.reshape(dy, &[-1, g, mg, p]);
    let d = cx.e.transpose(&d, &[1, 2, 0, 3]);
    let d = cx.e.reshape(&d, &[g, mg, -1]);
    let prod = cx.e.op("MatMul", &[&d, &cols], vec![]);
    cx.e.reshape(&prod, &w_shape.iter().map(|&v| v as i64).collect::<Vec<_>>())
}

/// The most negative finite value of a float type: padding that never wins a max.
fn lowest(float: DataType) -> f64 {
    match float {
        DataType::Float64 => f64::MIN,
        DataType::Float16 => -65504.0,
        _ => f32::MIN as f64,
    }
}

/// dX = dY routed to the first position (row-major in its window) holding its window's
/// maximum, as PyTorch does.
pub(super) fn max_pool(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    if !cx.need(0) {
        return Ok(g);
    }
    let dy = cx.dy()?;
    let (x, y) = (cx.x(0).to_string(), cx.y(0).to_string());
    let geo = Geometry::of(cx, None)?;
    // The training forward gave the node its Indices output where the scatter applies.
    let node = cx.node;
    g[0] = Some(match node.output(1) {
        Some(indices) if !indices.is_empty() && max_pool_scatters(node, cx.e.opset)? => {
            max_pool_scatter(cx, indices, &dy, &geo)
        }
        _ => max_pool_windows(cx, &x, &y, &dy, &geo),
    });
    Ok(g)
}

/// Whether the gradient of this MaxPool scatters dY at the pool's own indices
/// ([`max_pool_scatter`]), for which the training forward gives it its `Indices` output:
/// not for overlapping windows before opset 16 (`ScatterElements` cannot add yet), not
/// for pools whose strides are all 1 (onnx.reference 1.23 numbers their indices wrongly:
/// a 2×2 stride-1 pool of a 4×5 map gives 2 where ONNX Runtime and tract give 5, and
/// every rule must run there), and not with column-major indices (`storage_order` 1).
pub fn max_pool_scatters(node: &Node, opset: i64) -> Result<bool> {
    let kernel = node.attr_ints("kernel_shape")?.ok_or_else(|| AutodiffError::node(node, "kernel_shape is missing"))?;
    let ones = vec![1; kernel.len()];
    let strides = node.attr_ints("strides")?.unwrap_or(&ones);
    let dilations = node.attr_ints("dilations")?.unwrap_or(&ones);
    if strides.len() != kernel.len() || dilations.len() != kernel.len() {
        return Err(AutodiffError::node(node, "strides, dilations and kernel_shape differ in length"));
    }
    let overlapping = (0..kernel.len()).any(|a| strides[a] < (kernel[a] - 1) * dilations[a] + 1);
    Ok(node.attr_int("storage_order", 0)? == 0 && strides.iter().any(|&s| s != 1) && (!overlapping || opset >= 16))
}

/// The max-pool gradient from the pool's own argmax `indices`, at a cost that does not
/// grow with the window: dY added into zeros of X's size at those indices
/// (`ScatterElements` along each (n, c) plane). Both engines pick the first maximum of a
/// window in row-major order (ONNX Runtime and tract compare with a strict `>`), which
/// is PyTorch's choice for ties. ONNX numbers the indices over the whole tensor and the
/// scatter indexes a plane, so each row's first index (row · plane, a `Range`) is
/// subtracted: exact, and an addition per index where a `Mod` was an integer division
/// (8% of LeNet-5's step on tract, docs/results.md).
/// Overlapping windows can pick the same position, whose gradients add up
/// (`reduction="add"`).
fn max_pool_scatter(cx: &mut RuleCx<'_>, indices: &str, dy: &str, geo: &Geometry) -> String {
    let w = &geo.window;
    let overlapping = (0..geo.axes()).any(|a| w.strides[a] < geo.extent(a));
    let plane = geo.input.iter().product::<usize>() as i64;
    let p = geo.output_size() as i64;
    let updates = cx.e.reshape(dy, &[-1, p]);
    // Zeros of [N·C, plane], their row count read off the updates rather than off X:
    // X is then not kept alive through the forward pass for its shape alone.
    let rows = if cx.e.opset >= 15 {
        cx.e.op("Shape", &[&updates], vec![("end", Attribute::Int(1))])
    } else {
        let shape = cx.e.shape_of(&updates);
        let (start, end) = (cx.e.ints(&[0]), cx.e.ints(&[1]));
        cx.e.op("Slice", &[&shape, &start, &end], vec![])
    };
    // Row r's indices run from r · plane: [0, plane, 2·plane, ...] as a column. (A `Range`
    // with step 1, then scaled: with the step `plane`, tract cannot reduce its symbolic
    // length, ⌈rows · plane / plane⌉, to the row count.)
    let (first_row, step) = (cx.e.int_scalar(0), cx.e.int_scalar(1));
    let row_count = cx.e.reshape(&rows, &[]);
    let row_index = cx.e.op("Range", &[&first_row, &row_count, &step], vec![]);
    let row_index = cx.e.reshape(&row_index, &[-1, 1]);
    let plane_size = cx.e.int_scalar(plane);
    let starts = cx.e.op("Mul", &[&row_index, &plane_size], vec![]);
    let flat = cx.e.reshape(indices, &[-1, p]);
    let within = cx.e.op("Sub", &[&flat, &starts], vec![]);
    let columns = cx.e.ints(&[plane]);
    let target = cx.e.op("Concat", &[&rows, &columns], vec![("axis", Attribute::Int(0))]);
    let zero = cx.e.scalar(0.0);
    let zeros = cx.e.op("Expand", &[&zero, &target], vec![]);
    let mut attributes = vec![("axis", Attribute::Int(1))];
    if overlapping {
        attributes.push(("reduction", Attribute::String(b"add".to_vec())));
    }
    let dx = cx.e.op("ScatterElements", &[&zeros, &within, &updates], attributes);
    let target: Vec<i64> = [-1, geo.channels as i64].into_iter().chain(geo.input.iter().map(|&d| d as i64)).collect();
    cx.e.reshape(&dx, &target)
}

/// `[N, C, spatial...]` viewed as `[N·C, 1, spatial...]`: one image per channel, so that
/// scatters run as ungrouped `ConvTranspose`s with a small constant kernel.
fn channels_to_batch(cx: &mut RuleCx<'_>, x: &str, spatial: &[usize]) -> String {
    let shape: Vec<i64> = [-1, 1].into_iter().chain(spatial.iter().map(|&s| s as i64)).collect();
    cx.e.reshape(x, &shape)
}

/// `[N·C, 1, spatial...]` back to `[N, C, spatial...]`.
fn batch_to_channels(cx: &mut RuleCx<'_>, x: &str, channels: usize, spatial: &[usize]) -> String {
    let shape: Vec<i64> = [-1, channels as i64].into_iter().chain(spatial.iter().map(|&s| s as i64)).collect();
    cx.e.reshape(x, &shape)
}

/// The general max-pool gradient: per kernel offset, the strided slice of the input
/// (padded with the lowest value) equal to Y takes dY; a `ConvTranspose` with a one-hot
/// kernel (offset k of the K input channels → its kernel position) scatters and sums them.
fn max_pool_windows(cx: &mut RuleCx<'_>, x: &str, y: &str, dy: &str, geo: &Geometry) -> String {
    let w = &geo.window;
    let n = geo.axes();
    // Pad with the lowest value, also past the end where ceil_mode windows overhang.
    let padded: Vec<usize> =
        (0..n).map(|a| (geo.input[a] + w.pads_begin[a] + w.pads_end[a]).max(geo.span(a))).collect();
    let pads_end: Vec<usize> = (0..n).map(|a| padded[a] - geo.input[a] - w.pads_begin[a]).collect();
    let x1 = channels_to_batch(cx, x, &geo.input);
    let low = lowest(cx.e.float);
    let xp = pad_spatial(cx, &x1, &w.pads_begin, &pads_end, Some(low));
    // [N·C, K, out...] compared with Y as [N·C, 1, out...].
    let cols = window_slices(cx, &xp, &padded, geo);
    let y1 = channels_to_batch(cx, y, &geo.output);
    let dy1 = channels_to_batch(cx, dy, &geo.output);
    let mask = cx.e.op("Equal", &[&cols, &y1], vec![]);
    let k = geo.kernel_size();
    let mut order_dims = vec![1, k];
    order_dims.extend(std::iter::repeat_n(1, n));
    let mask = first_max(cx, &mask, order_dims, (0..k).map(|j| j as f64).collect(), &[1]);
    let zero = cx.e.scalar(0.0);
    let routed = cx.e.op("Where", &[&mask, &dy1, &zero], vec![]);
    let mut dims = vec![k, 1];
    dims.extend(&w.kernel);
    let mut one_hot = vec![0.0; k * k];
    for j in 0..k {
        one_hot[j * k + j] = 1.0;
    }
    let one_hot = cx.e.floats(dims, &one_hot);
    let dx = scatter(cx, &routed, &one_hot, geo, 1);
    batch_to_channels(cx, &dx, geo.channels, &geo.input)
}

/// dX = scatter of dY / count, where count is each window's divisor: its elements inside
/// the explicitly padded input with `count_include_pad`, inside the input without.
pub(super) fn average_pool(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    if !cx.need(0) {
        return Ok(g);
    }
    let dy = cx.dy()?;
    let geo = Geometry::of(cx, None)?;
    let include_pad = cx.node.attr_int("count_include_pad", 0)? != 0;
    let w = &geo.window;
    // The count along each axis; a window's count is the product over the axes. dY is
    // divided by it (exact counts, see `Emitter::divide`); a window with no element counted
    // divides by infinity, which gives its elements no gradient.
    let mut per_axis: Vec<Vec<f64>> = Vec::new();
    for a in 0..geo.axes() {
        let (size, begin, end) = (geo.input[a] as i64, w.pads_begin[a] as i64, w.pads_end[a] as i64);
        let (lo, hi) = if include_pad { (-begin, size + end) } else { (0, size) };
        let count_of = (0..geo.output[a] as i64)
            .map(|o| {
                let start = o * w.strides[a] as i64 - begin;
                let count =
                    (0..w.kernel[a] as i64).filter(|t| (lo..hi).contains(&(start + t * w.dilations[a] as i64))).count();
                if count == 0 { f64::INFINITY } else { count as f64 }
            })
            .collect();
        per_axis.push(count_of);
    }
    let mut counts = vec![1.0];
    for axis in &per_axis {
        counts = counts.iter().flat_map(|&v| axis.iter().map(move |&u| v * u)).collect();
    }
    let scaled = if counts.iter().all(|&v| v == counts[0]) {
        cx.e.divide(&dy, counts[0])
    } else {
        let t = cx.e.floats(geo.output.clone(), &counts);
        cx.e.div(&dy, &t)
    };
    let mut dims = vec![1, 1];
    dims.extend(&w.kernel);
    let ones = cx.e.floats(dims, &vec![1.0; geo.kernel_size()]);
    let scaled = channels_to_batch(cx, &scaled, &geo.output);
    let dx = scatter(cx, &scaled, &ones, &geo, 1);
    g[0] = Some(batch_to_channels(cx, &dx, geo.channels, &geo.input));
    Ok(g)
}

/// dX = dY / (spatial size), broadcast over the spatial axes.
pub(super) fn global_average_pool(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    if !cx.need(0) {
        return Ok(g);
    }
    let dy = cx.dy()?;
    let (x, y) = (cx.x(0).to_string(), cx.y(0).to_string());
    let shape = cx.shape(&x)?;
    let spatial: Option<usize> = shape.iter().skip(2).map(Dim::fixed).product();
    let scaled = match spatial {
        Some(count) => cx.e.divide(&dy, count as f64),
        None => {
            // Unknown spatial sizes: |Y| / |X| is 1 / (spatial size).
            let (ny, nx) = (cx.e.numel(&y), cx.e.numel(&x));
            let ratio = cx.e.div(&ny, &nx);
            cx.e.mul(&dy, &ratio)
        }
    };
    let spatial_axes: Vec<i64> = (2..shape.len() as i64).collect();
    g[0] = Some(cx.expand_over(&scaled, &x, &spatial_axes)?);
    Ok(g)
}

/// dX = dY where X equals its channel's maximum (every tied element), else 0.
pub(super) fn global_max_pool(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    if !cx.need(0) {
        return Ok(g);
    }
    let dy = cx.dy()?;
    let (x, y) = (cx.x(0).to_string(), cx.y(0).to_string());
    let shape = cx.shape(&x)?;
    let spatial: Vec<usize> = shape[2..]
        .iter()
        .map(|d| d.fixed().ok_or_else(|| cx.err("GlobalMaxPool's spatial sizes must be known")))
        .collect::<Result<_>>()?;
    let size: usize = spatial.iter().product();
    // [N, C, spatial...] as [N, C, S]: the first maximum in row-major order takes dY.
    let xr = cx.e.reshape(&x, &[0, 0, size as i64]);
    let yr = cx.e.reshape(&y, &[0, 0, 1]);
    let mask = cx.e.op("Equal", &[&xr, &yr], vec![]);
    let mask = first_max(cx, &mask, vec![1, 1, size], (0..size).map(|j| j as f64).collect(), &[2]);
    let zero = cx.e.scalar(0.0);
    let dyr = cx.e.reshape(&dy, &[0, 0, 1]);
    let routed = cx.e.op("Where", &[&mask, &dyr, &zero], vec![]);
    g[0] = Some(cx.e.reshape_like(&routed, &x));
    Ok(g)
}

/// Of the positions of each window where `mask` holds (those equal to the window's
/// maximum), keeps only the first in row-major order, as PyTorch's max-pool gradient
/// does: with ties (spatially constant maps, as a 1×1 convolution of a pooled-to-one
/// input makes) every tied position taking dY would multiply the gradient. `order` holds
/// each window position's row-major index, laid out to broadcast against the mask; the
/// smallest index where the mask holds is the first maximum.
fn first_max(cx: &mut RuleCx<'_>, mask: &str, order_dims: Vec<usize>, order: Vec<f64>, window_axes: &[i64]) -> String {
    let none = cx.e.scalar(order.len() as f64);
    let order = cx.e.floats(order_dims, &order);
    let keyed = cx.e.op("Where", &[mask, &order, &none], vec![]);
    let keep = ("keepdims", Attribute::Int(1));
    let first = if cx.e.opset >= 18 {
        let axes = cx.e.ints(window_axes);
        cx.e.op("ReduceMin", &[&keyed, &axes], vec![keep])
    } else {
        cx.e.op("ReduceMin", &[&keyed], vec![keep, ("axes", Attribute::Ints(window_axes.to_vec()))])
    };
    cx.e.op("Equal", &[&keyed, &first], vec![])
}
