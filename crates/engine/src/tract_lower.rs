//! Rewrites of a tract model, made once its dimensions are numbers and its decluttering
//! is done, that steer tract's code generation onto its fast kernels. They change how a
//! value is computed, never what it is: every rewrite here gives the same bits, but the
//! one that moves convolutions onto another kernel, whose sums run in another order.
//!
//! **Per-channel operands.** tract code-generates an element-wise `Add`, `Sub`, `Mul`,
//! `Min` or `Max` into a vectorised kernel only where the smaller operand lines up with
//! the larger one in one of two ways: equal leading dimensions and then ones ("by
//! scalar": one value per block of the larger operand), or leading ones and then equal
//! dimensions ("unicast"). A per-channel operand of an NCHW tensor, `[1, C, 1, 1]`
//! against `[N, C, H, W]`, is neither, and falls to the generic broadcasting loop, which
//! runs 10–20x slower per element. Training graphs are full of these: every
//! BatchNormalization's statistics, scale and shift, forward and backward (docs/results.md:
//! a third of MobileNetV2 x0.5's step). Broadcasting such an operand over the leading
//! dimensions first (`[N, C, 1, 1]`, N·C values) makes it a by-scalar operand.
//!
//! **Comparison masks.** The gradients of ReLU and Clip pass dY where the output lies
//! inside the bounds: `dY · Cast(y > lo [and y < hi])`, the form ONNX Runtime runs
//! fastest. tract runs comparisons and `And` in its generic broadcasting loop and the
//! cast element by element: four to six passes at several nanoseconds an element. They
//! become one [`PassInside`] pass.
//!
//! **Convolution padding.** tract's im2col writes a padded 2-D convolution's patches a
//! piece at a time (the padding element by element, the rest in runs of one output row
//! clipped to the input); a convolution without padding has whole rows. An explicit
//! zero `Pad` before the convolution (a copy of the input, against the nine copies the
//! patches are for a 3×3 kernel) took ResNet-20's im2col from 175 to 107 ms a step at
//! batch 32. Depthwise convolutions have their own kernel in tract, which an explicit
//! pad made slower: they keep theirs.
//!
//! **Batch along the width.** tract has a direct convolution kernel (a filter along each
//! output row, four output channels at a time) that it takes only for rows of at least
//! 128 points; shorter rows go to im2col and a matrix product, and im2col, writing every
//! input value once per kernel tap, is most of the time of a small-map convolution
//! (ResNet-20's 16-channel 28×28 layers: two thirds). A convolution without padding over
//! `[N, C, H, W]` reads the same taps when its N images lie side by side in one row,
//! `[1, C, H, N·W]`: an output point reads only its own image's columns, and the points
//! straddling two images are dropped. Moving the batch next to the width, with the
//! padding, and back ([`BatchToWidth`], [`WidthToBatch`]) costs one copy of the input and
//! one of the output, against the kernel-volume copies of im2col.
//!
//! **Transposed operands of products.** A convolution's weight gradient multiplies dY by
//! each kernel offset's slice of the input transposed (`[N, M, P] · [N, P, C]`), the form
//! ONNX Runtime runs fastest: it fuses the `Transpose` into the product. tract runs the
//! `Transpose` as a copy of every slice (124 of them, a fifth of ResNet-20's step), though
//! its matrix product packs its operands from any axis order. The move of axes is folded
//! into the product's axes ([`fold_transposes_into_products`]), and the product reads the
//! slice as it is.
//!
//! **Scatters.** The max-pool gradient adds dY into zeros at its argmax with one
//! `ScatterElements`. tract's runs an n-dimensional index per element (a quarter of
//! LeNet-5's and of M5's step); [`ScatterRows`] does the same additions, in the same
//! order, by offsets into contiguous rows.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::axes::AxesMapping;
use tract_onnx::tract_core::internal::{
    EvalContext, EvalOp, Op, StaticName, args_1, args_2, args_3, as_op, op_as_typed_op, op_out_of_plan,
};
use tract_onnx::tract_core::ops::array::{MultiBroadcastTo, Pad, PadMode, ScatterElements, ScatterReduction};
use tract_onnx::tract_core::ops::binary::TypedBinOp;
use tract_onnx::tract_core::ops::cast::Cast;
use tract_onnx::tract_core::ops::change_axes::AxisOp;
use tract_onnx::tract_core::ops::cnn::{Conv, PaddingSpec};
use tract_onnx::tract_core::ops::einsum::EinSum;
use tract_onnx::tract_core::ops::nn::DataFormat;

/// Replaces node `id`, of one output, by what `wire` builds in a patch from the taps of
/// `inputs`, and applies the patch: the one way every rewrite here lands.
fn replace_node(
    model: &mut TypedModel,
    id: usize,
    inputs: &[OutletId],
    wire: impl FnOnce(&mut TypedModelPatch, TVec<OutletId>) -> TractResult<OutletId>,
) -> TractResult<()> {
    let mut patch = TypedModelPatch::default();
    let taps = patch.taps(model, inputs)?;
    let out = wire(&mut patch, taps)?;
    patch.shunt_outside(model, id.into(), out)?;
    patch.apply(model)
}

/// The binary ops tract has vectorised by-scalar and unicast kernels for.
const VECTORISED: [&str; 5] = ["Add", "Sub", "Mul", "Min", "Max"];

/// Gives every padded, ungrouped float 2-D convolution an explicit zero `Pad` before it
/// and no padding of its own (module doc). Returns how many it changed. Run after
/// decluttering, which would fold the `Pad` back into the convolution.
pub fn pad_convolutions_explicitly(model: &mut TypedModel) -> TractResult<usize> {
    let mut padded = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(conv) = node.op_as::<Conv>() else { continue };
        let PaddingSpec::Explicit(before, after) = &conv.pool_spec.padding else { continue };
        let x = model.outlet_fact(node.inputs[0])?;
        if conv.group != 1
            || conv.q_params.is_some()
            || x.datum_type != f32::datum_type()
            || before.len() != 2
            || before.iter().chain(after).all(|&p| p == 0)
        {
            continue;
        }
        let shape = conv.pool_spec.data_format.shape(x.shape.to_tvec())?;
        let mut pads = vec![(0, 0); x.rank()];
        for ((axis, &b), &a) in shape.hw_axes().zip(before).zip(after) {
            pads[axis] = (b, a);
        }
        let mut unpadded = conv.clone();
        unpadded.pool_spec.padding = PaddingSpec::Valid;
        let (name, inputs) = (node.name.clone(), node.inputs.clone());
        replace_node(model, id, &inputs, |patch, mut taps| {
            let zero = PadMode::Constant(rctensor0(0f32));
            taps[0] = patch.wire_node(format!("{name}.pad"), Pad { pads, mode: zero }, &[taps[0]])?[0];
            Ok(patch.wire_node(&name, unpadded, &taps)?[0])
        })?;
        padded += 1;
    }
    Ok(padded)
}

/// tract's direct convolution takes output rows of at least this many points (its
/// `MIN_DIRECT_SPATIAL_W`, private to it).
const DIRECT_ROW: usize = 128;

/// How many points at the end of a row tract's direct kernel may compute one at a time
/// (x86-64: fewer than 9; aarch64: fewer than 5), with a margin.
const DIRECT_TAIL: usize = 16;

/// The largest input channels × kernel taps [`lay_batch_along_width`] takes: tract's
/// direct kernel takes up to 576, but from 64 channels of a 3×3 kernel on, its matrix
/// product beats the direct filter by more than im2col costs it (docs/results.md).
const DIRECT_TAPS: usize = 300;

/// Lays the batch of every ungrouped float 2-D NCHW convolution whose rows are too short
/// for tract's direct kernel along the width instead (module doc), where the batch makes
/// the row long enough: [`BatchToWidth`] (with the convolution's padding), the
/// convolution unpadded, [`WidthToBatch`]. Returns how many it changed. Run before
/// [`pad_convolutions_explicitly`], which would pad these a second time.
pub fn lay_batch_along_width(model: &mut TypedModel) -> TractResult<usize> {
    use tract_onnx::tract_core::tract_linalg::routines;
    // The kernels tract's direct convolution needs on this host: four output channels at
    // a time, and one at a time for the channels left over.
    let (four, one) = (routines::conv_w4_f32().is_some(), routines::depthwise_w_f32().is_some());
    if !four {
        return Ok(0);
    }
    let mut laid = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(conv) = node.op_as::<Conv>() else { continue };
        let x = model.outlet_fact(node.inputs[0])?;
        let ((top, left), (bottom, right)) = match &conv.pool_spec.padding {
            PaddingSpec::Valid => ((0, 0), (0, 0)),
            PaddingSpec::Explicit(b, a) if b.len() == 2 && a.len() == 2 => ((b[0], b[1]), (a[0], a[1])),
            _ => continue,
        };
        let Some(&[n, c, _, w]) = x.shape.as_concrete() else { continue };
        let spec = &conv.pool_spec;
        let taps: usize = spec.kernel_shape.iter().product();
        if conv.group != 1
            || conv.q_params.is_some()
            || x.datum_type != f32::datum_type()
            || spec.data_format != DataFormat::NCHW
            || spec.kernel_shape.len() != 2
            || taps < 2
            || c * taps > DIRECT_TAPS
            || (!spec.output_channels.is_multiple_of(4) && !one)
        {
            continue;
        }
        let (kw, sw) = (spec.kernel_shape[1], spec.strides.as_ref().map_or(1, |s| s[1]));
        let dw = spec.dilations.as_ref().map_or(1, |d| d[1]);
        let (reach, w) = (dw * (kw - 1) + 1, left + w + right);
        if w < reach {
            continue;
        }
        let out_w = (w - reach) / sw + 1;
        if out_w >= DIRECT_ROW {
            continue;
        }
        // Each image's columns padded to a multiple of the stride, so that every image's
        // first output point starts on the stride, `per_image` points after the previous
        // image's; the points between one image's last and the next one's first are dropped.
        let image_w = w.div_ceil(sw) * sw;
        let per_image = image_w / sw;
        // Zeros after the last image, so that the row is long enough for the direct kernel
        // whatever the batch, and so that the kernel's last points, which it computes one at
        // a time with a separate product and sum where the others have a fused
        // multiply-add, are all past the last image: every image's points are then the same
        // bits at any batch size and place in the batch (a resumed run must repeat its
        // steps bit for bit, and a last batch of an epoch is smaller).
        let points = DIRECT_ROW.max((n - 1) * per_image + out_w + DIRECT_TAIL);
        let row = (n * image_w).max(DIRECT_ROW).max((points - 1) * sw + reach);
        let to_width = BatchToWidth { top, bottom, left, image_w, row };
        let to_batch = WidthToBatch { batch: n, per_image, width: out_w };
        let mut wide = conv.clone();
        wide.pool_spec.padding = PaddingSpec::Valid;
        let (name, inputs) = (node.name.clone(), node.inputs.clone());
        let before = model.outlet_fact(id.into())?.shape.to_tvec();
        replace_node(model, id, &inputs, |patch, mut taps| {
            taps[0] = patch.wire_node(format!("{name}.batch_to_width"), to_width, &[taps[0]])?[0];
            let y = patch.wire_node(&name, wide, &taps)?[0];
            let y = patch.wire_node(format!("{name}.width_to_batch"), to_batch, &[y])?[0];
            // The convolution's own output, images in their places.
            if patch.outlet_fact(y)?.shape.to_tvec() != before {
                return Err(TractError::msg(format!("{name}: laid along the width, the output is not {before:?}")));
            }
            Ok(y)
        })?;
        laid += 1;
    }
    Ok(laid)
}

/// `[N, C, H, W]` → `[1, C, top + H + bottom, row]`: image n's row at columns
/// `n · image_w + left ..`, zeros around it, in one pass (a `Pad` and a transpose would
/// copy twice).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchToWidth {
    /// Rows of zeros above each image.
    pub top: usize,
    /// Rows of zeros below each image.
    pub bottom: usize,
    /// Columns of zeros before each image's row.
    pub left: usize,
    /// Columns each image takes in the wide row: zeros, its row, zeros.
    pub image_w: usize,
    /// Columns of the wide row, at least N · image_w: zeros after the last image.
    pub row: usize,
}

/// `[1, C, H, ≥ (N - 1) · per_image + width]` → `[N, C, H, width]`: image n's row from
/// column `n · per_image`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WidthToBatch {
    /// The images, N.
    pub batch: usize,
    /// Columns from one image's row to the next one's.
    pub per_image: usize,
    /// Columns of each image's row.
    pub width: usize,
}

impl Op for BatchToWidth {
    fn name(&self) -> StaticName {
        "BatchToWidth".into()
    }

    op_as_typed_op!();
}

impl Op for WidthToBatch {
    fn name(&self) -> StaticName {
        "WidthToBatch".into()
    }

    op_as_typed_op!();
}

/// The four dimensions of a float32 NCHW tensor, or an error naming the op.
fn four_dims(op: &str, t: &Tensor) -> TractResult<[usize; 4]> {
    match t.shape() {
        &[n, c, h, w] if t.datum_type() == f32::datum_type() => Ok([n, c, h, w]),
        shape => {
            Err(TractError::msg(format!("{op}: float32 [N, C, H, W] expected, got {:?} {shape:?}", t.datum_type())))
        }
    }
}

impl EvalOp for BatchToWidth {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let x = args_1!(inputs);
        let [n, c, h, w] = four_dims("BatchToWidth", &x)?;
        if self.left + w > self.image_w || n * self.image_w > self.row {
            return Err(TractError::msg("BatchToWidth: the images are wider than their places"));
        }
        let x = x.to_plain_array_view::<f32>()?;
        let x = x.as_standard_layout();
        let x = x.as_slice().expect("standard layout");
        let (rows, wide) = (self.top + h + self.bottom, self.row);
        let mut out = Tensor::zero::<f32>(&[1, c, rows, wide])?;
        let mut view = out.to_plain_array_view_mut::<f32>()?;
        let o = view.as_slice_mut().expect("a new tensor");
        for (ci, plane) in o.chunks_exact_mut(rows * wide).enumerate() {
            for y in 0..h {
                let row = &mut plane[(self.top + y) * wide..][..wide];
                for i in 0..n {
                    let from = &x[((i * c + ci) * h + y) * w..][..w];
                    row[i * self.image_w + self.left..][..w].copy_from_slice(from);
                }
            }
        }
        drop(view);
        Ok(tvec!(out.into_tvalue()))
    }
}

impl EvalOp for WidthToBatch {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let y = args_1!(inputs);
        let [one, c, h, wide] = four_dims("WidthToBatch", &y)?;
        if one != 1 || self.batch == 0 || (self.batch - 1) * self.per_image + self.width > wide {
            return Err(TractError::msg("WidthToBatch: the row is too short for its images"));
        }
        let y = y.to_plain_array_view::<f32>()?;
        let y = y.as_standard_layout();
        let y = y.as_slice().expect("standard layout");
        // SAFETY: the loop below writes every element before the tensor is read.
        let mut out = unsafe { Tensor::uninitialized::<f32>(&[self.batch, c, h, self.width])? };
        let mut view = out.to_plain_array_view_mut::<f32>()?;
        let o = view.as_slice_mut().expect("a new tensor");
        for (row, dst) in o.chunks_exact_mut(self.width).enumerate() {
            let (i, cy) = (row / (c * h), row % (c * h));
            dst.copy_from_slice(&y[cy * wide + i * self.per_image..][..self.width]);
        }
        drop(view);
        Ok(tvec!(out.into_tvalue()))
    }
}

impl TypedOp for BatchToWidth {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let Some(&[_, c, h, _]) = inputs[0].shape.as_concrete() else {
            return Err(TractError::msg("BatchToWidth: concrete [N, C, H, W] input expected"));
        };
        Ok(tvec!(f32::fact([1, c, self.top + h + self.bottom, self.row])))
    }

    as_op!();
}

impl TypedOp for WidthToBatch {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let Some(&[_, c, h, _]) = inputs[0].shape.as_concrete() else {
            return Err(TractError::msg("WidthToBatch: concrete [1, C, H, W] input expected"));
        };
        Ok(tvec!(f32::fact([self.batch, c, h, self.width])))
    }

    as_op!();
}

/// Folds every permutation of axes (an ONNX `Transpose`, which tract keeps as axis
/// moves, with the reshapes around it that decluttering leaves) whose only reader is a
/// matrix product into that product's axes: the product then reads the permutation's
/// input as it is (module doc). Returns how many operands it folded.
pub fn fold_transposes_into_products(model: &mut TypedModel) -> TractResult<usize> {
    let mut folded = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(einsum) = node.op_as::<EinSum>() else { continue };
        if einsum.q_params.is_some() {
            continue;
        }
        let (mut labels, outputs) = einsum.axes.to_strs();
        let mut inputs = node.inputs.clone();
        let mut moved = 0;
        for (slot, input) in inputs.iter_mut().enumerate() {
            let Some((source, perm)) = permutation_behind(model, *input)? else { continue };
            // Axis i of the operand is axis perm[i] of the source: the source's axes carry
            // the operand's labels in that order.
            let operand: Vec<char> = labels[slot].chars().collect();
            let mut of_source = vec![' '; operand.len()];
            for (i, &p) in perm.iter().enumerate() {
                of_source[p] = operand[i];
            }
            labels[slot] = of_source.into_iter().collect();
            *input = source;
            moved += 1;
        }
        if moved == 0 {
            continue;
        }
        let op = EinSum { axes: AxesMapping::from_strs(&labels, &outputs)?, ..einsum.clone() };
        let name = node.name.clone();
        replace_node(model, id, &inputs, |patch, taps| Ok(patch.wire_node(&name, op, &taps)?[0]))?;
        folded += moved;
    }
    Ok(folded)
}

/// The source and permutation behind `outlet` when it is a chain of axis moves and
/// reshapes (each read only by the next) that, taken together, only permutes its
/// source's axes: `(source, perm)` with axis i of `outlet` being axis `perm[i]` of the
/// source. Of such chains, the longest that has a move; `None` when there is none (no
/// move, or reshapes that do more than merge axes and split them back).
fn permutation_behind(model: &TypedModel, outlet: OutletId) -> TractResult<Option<(OutletId, Vec<usize>)>> {
    // The ops from `outlet` back, with the value each reads.
    let mut chain: Vec<(AxisOp, OutletId)> = Vec::new();
    let mut at = outlet;
    loop {
        let node = model.node(at.node);
        let Some(op) = node.op_as::<AxisOp>() else { break };
        if !matches!(op, AxisOp::Move(..) | AxisOp::Reshape(..)) || model.outlet_successors(at).len() != 1 {
            break;
        }
        chain.push((op.clone(), node.inputs[0]));
        at = node.inputs[0];
    }
    for len in (1..=chain.len()).rev() {
        let ops = &chain[..len];
        if !ops.iter().any(|(op, _)| matches!(op, AxisOp::Move(..))) {
            return Ok(None);
        }
        let source = ops[len - 1].1;
        if let Some(perm) = permutation_of(model, source, ops.iter().rev().map(|(op, _)| op))? {
            return Ok(Some((source, perm)));
        }
    }
    Ok(None)
}

/// The permutation of `source`'s axes that `ops` (in the order they apply) amount to, if
/// they are moves and reshapes that only merge axes and split them back.
fn permutation_of<'a>(
    model: &TypedModel,
    source: OutletId,
    ops: impl Iterator<Item = &'a AxisOp>,
) -> TractResult<Option<Vec<usize>>> {
    let Some(dims) = model.outlet_fact(source)?.shape.as_concrete().map(|d| d.to_vec()) else { return Ok(None) };
    // Each axis of the value so far as the source axes it flattens, in order.
    let mut groups: Vec<Vec<usize>> = (0..dims.len()).map(|a| vec![a]).collect();
    for op in ops {
        match op {
            AxisOp::Move(from, to) => {
                if *from >= groups.len() || *to >= groups.len() {
                    return Ok(None);
                }
                let g = groups.remove(*from);
                groups.insert(*to, g);
            }
            AxisOp::Reshape(start, from, to) => {
                if start + from.len() > groups.len() {
                    return Ok(None);
                }
                let replaced: Vec<usize> = groups.drain(*start..start + from.len()).flatten().collect();
                let split_back = to.len() == replaced.len()
                    && to.iter().zip(&replaced).all(|(d, &a)| d.as_i64() == Some(dims[a] as i64));
                if split_back {
                    for (k, a) in replaced.into_iter().enumerate() {
                        groups.insert(start + k, vec![a]);
                    }
                } else if to.len() == 1 {
                    groups.insert(*start, replaced);
                } else {
                    return Ok(None);
                }
            }
            _ => return Ok(None),
        }
    }
    if groups.len() != dims.len() || groups.iter().any(|g| g.len() != 1) {
        return Ok(None);
    }
    Ok(Some(groups.into_iter().map(|g| g[0]).collect()))
}

/// Replaces every float32 `ScatterElements` that adds or writes (no other reduction) and
/// whose updates have the data's shape but along its axis by [`ScatterRows`] (module
/// doc). Returns how many it replaced.
pub fn scatter_by_rows(model: &mut TypedModel) -> TractResult<usize> {
    let mut replaced = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(op) = node.op_as::<ScatterElements>() else { continue };
        let add = match op.reduction {
            ScatterReduction::Add => true,
            ScatterReduction::None => false,
            _ => continue,
        };
        let facts = model.node_input_facts(id)?;
        let (Some(data), Some(indices), Some(updates)) =
            (facts[0].shape.as_concrete(), facts[1].shape.as_concrete(), facts[2].shape.as_concrete())
        else {
            continue;
        };
        let same_but_axis = data.len() == updates.len()
            && data.iter().zip(updates).enumerate().all(|(axis, (d, u))| axis == op.axis || d == u);
        if facts[0].datum_type != f32::datum_type()
            || facts[2].datum_type != f32::datum_type()
            || !matches!(facts[1].datum_type, DatumType::I64 | DatumType::I32)
            || indices != updates
            || !same_but_axis
        {
            continue;
        }
        let scatter = ScatterRows { axis: op.axis, add };
        drop(facts);
        let (name, inputs) = (node.name.clone(), node.inputs.clone());
        replace_node(model, id, &inputs, |patch, taps| Ok(patch.wire_node(&name, scatter, &taps)?[0]))?;
        replaced += 1;
    }
    Ok(replaced)
}

/// ONNX `ScatterElements` of float32 along `axis`, adding (or writing, `add` false) each
/// update at its index, for updates of the data's shape but along the axis: the updates
/// in row-major order, as tract's own op takes them (so additions at one index happen in
/// its order), each at an offset into the data's contiguous rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScatterRows {
    /// The axis the indices index.
    pub axis: usize,
    /// Whether updates add to the data (`reduction="add"`) or replace it.
    pub add: bool,
}

impl Op for ScatterRows {
    fn name(&self) -> StaticName {
        "ScatterRows".into()
    }

    op_as_typed_op!();
}

impl EvalOp for ScatterRows {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (data, indices, updates) = args_3!(inputs);
        let (shape, along) = (data.shape().to_vec(), updates.shape().to_vec());
        if indices.shape() != along.as_slice() || shape.len() != along.len() || self.axis >= shape.len() {
            return Err(TractError::msg("ScatterRows: indices and updates differ in shape"));
        }
        if along.contains(&0) {
            return Ok(tvec!(data));
        }
        let indices = indices.cast_to::<i64>()?;
        let indices = indices.to_plain_array_view::<i64>()?;
        let indices = indices.as_standard_layout();
        let indices = indices.as_slice().expect("standard layout");
        let updates = updates.to_plain_array_view::<f32>()?;
        let updates = updates.as_standard_layout();
        let updates = updates.as_slice().expect("standard layout");
        let mut out = data.into_tensor();
        let mut view = out.to_plain_array_view_mut::<f32>()?;
        let Some(o) = view.as_slice_mut() else {
            return Err(TractError::msg("ScatterRows: the data is not contiguous"));
        };
        // updates [outer, k, inner] into data [outer, d, inner].
        let (d, k) = (shape[self.axis] as i64, along[self.axis]);
        let inner: usize = shape[self.axis + 1..].iter().product();
        for (block, (idx, upd)) in indices.chunks_exact(k * inner).zip(updates.chunks_exact(k * inner)).enumerate() {
            let row = block * d as usize * inner;
            for (idx, upd) in idx.chunks_exact(inner).zip(upd.chunks_exact(inner)) {
                for (j, (&i, &u)) in idx.iter().zip(upd).enumerate() {
                    let at = if i < 0 { i + d } else { i };
                    if !(0..d).contains(&at) {
                        return Err(TractError::msg(format!("ScatterRows: index {i} outside an axis of {d}")));
                    }
                    let cell = &mut o[row + at as usize * inner + j];
                    *cell = if self.add { *cell + u } else { u };
                }
            }
        }
        drop(view);
        Ok(tvec!(out.into_tvalue()))
    }
}

impl TypedOp for ScatterRows {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(f32::fact(inputs[0].shape.clone())))
    }

    as_op!();
}

/// Broadcasts the per-channel operand of every element-wise op that would fall to tract's
/// generic loop over the other operand's leading dimensions (module doc). Returns how
/// many operands it widened.
pub fn widen_per_channel_operands(model: &mut TypedModel) -> TractResult<usize> {
    let mut widened = 0;
    for id in model.eval_order()? {
        let Some(op) = model.node(id).op_as::<TypedBinOp>() else { continue };
        if !VECTORISED.contains(&op.0.name()) {
            continue;
        }
        let facts = model.node_input_facts(id)?;
        let (Some(a), Some(b)) = (facts[0].shape.as_concrete(), facts[1].shape.as_concrete()) else { continue };
        let Some((small, target)) = by_scalar_target(a, b) else { continue };
        drop(facts);
        let node = model.node(id);
        let (name, op, inputs) = (node.name.clone(), node.op.clone(), node.inputs.clone());
        let shape: TVec<TDim> = target.iter().map(|&d| d.into()).collect();
        replace_node(model, id, &inputs, |patch, mut taps| {
            let broadcast = MultiBroadcastTo { shape: shape.into() };
            taps[small] = patch.wire_node(format!("{name}.per_channel"), broadcast, &[taps[small]])?[0];
            Ok(patch.wire_node(&name, op, &taps)?[0])
        })?;
        widened += 1;
    }
    Ok(widened)
}

/// One bound of a [`PassInside`] mask: its value's bits (so that the op can be compared
/// and hashed as tract's optimiser needs), and whether the value itself is outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bound {
    /// The bound's value, as `f32::to_bits`.
    pub bits: u32,
    /// `y > lo` (or `y < hi`) rather than `y ≥ lo` (`y ≤ hi`).
    pub strict: bool,
}

/// Which side of `y` a comparison bounds.
enum Side {
    Lower(Bound),
    Upper(Bound),
}

impl Side {
    /// The bound a tract comparison (`GT`, `GTE`, `LT`, `LTE`) of `y` against the constant
    /// `c` sets, with `y` on the left (`flipped`: on the right).
    fn of(comparison: &str, c: f32, flipped: bool) -> Option<Side> {
        let bound = |strict| Bound { bits: c.to_bits(), strict };
        Some(match (comparison, flipped) {
            ("GT", false) | ("LT", true) => Side::Lower(bound(true)),
            ("GTE", false) | ("LTE", true) => Side::Lower(bound(false)),
            ("LT", false) | ("GT", true) => Side::Upper(bound(true)),
            ("LTE", false) | ("GTE", true) => Side::Upper(bound(false)),
            _ => return None,
        })
    }
}

/// `x · Cast(lo < y < hi)` (each bound strict or not, either absent) in one pass over
/// float32 `x` and `y` of the same shape: `x` where y is inside, `x · 0` elsewhere, the
/// bits the product gives. NaN is inside no bounds, as in the comparisons.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PassInside {
    /// The lower bound, if any.
    pub lower: Option<Bound>,
    /// The upper bound, if any.
    pub upper: Option<Bound>,
}

impl Op for PassInside {
    fn name(&self) -> StaticName {
        "PassInside".into()
    }

    op_as_typed_op!();
}

/// One pass of [`PassInside`], its bounds' strictness fixed at compile time so that the
/// loop is a comparison, an and and a blend per vector. An absent bound is ±∞ taken
/// inclusively: every value but NaN meets it, and NaN fails the other bound anyway.
fn pass_inside<const LO_STRICT: bool, const HI_STRICT: bool>(lo: f32, hi: f32, x: &[f32], y: &[f32], out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
        let above = if LO_STRICT { y > lo } else { y >= lo };
        let below = if HI_STRICT { y < hi } else { y <= hi };
        *o = if above & below { x } else { x * 0.0 };
    }
}

impl EvalOp for PassInside {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, y) = args_2!(inputs);
        if x.shape() != y.shape() {
            return Err(TractError::msg("PassInside: x and y differ in shape"));
        }
        let (x, y) = (x.to_plain_array_view::<f32>()?, y.to_plain_array_view::<f32>()?);
        // SAFETY: both branches below write every element before the tensor is read.
        let mut out = unsafe { Tensor::uninitialized::<f32>(x.shape())? };
        let mut view = out.to_plain_array_view_mut::<f32>()?;
        let lo = self.lower.unwrap_or(Bound { bits: f32::NEG_INFINITY.to_bits(), strict: false });
        let hi = self.upper.unwrap_or(Bound { bits: f32::INFINITY.to_bits(), strict: false });
        let (lo_v, hi_v) = (f32::from_bits(lo.bits), f32::from_bits(hi.bits));
        if let (Some(x), Some(y), Some(o)) = (x.as_slice(), y.as_slice(), view.as_slice_mut()) {
            match (lo.strict, hi.strict) {
                (true, true) => pass_inside::<true, true>(lo_v, hi_v, x, y, o),
                (true, false) => pass_inside::<true, false>(lo_v, hi_v, x, y, o),
                (false, true) => pass_inside::<false, true>(lo_v, hi_v, x, y, o),
                (false, false) => pass_inside::<false, false>(lo_v, hi_v, x, y, o),
            }
        } else {
            // Not in memory order (a view tract made without copying): element by element.
            tract_ndarray::Zip::from(&mut view).and(&x).and(&y).for_each(|o, &x, &y| {
                let above = if lo.strict { y > lo_v } else { y >= lo_v };
                let below = if hi.strict { y < hi_v } else { y <= hi_v };
                *o = if above && below { x } else { x * 0.0 };
            });
        }
        drop(view);
        Ok(tvec!(out.into_tvalue()))
    }
}

impl TypedOp for PassInside {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(f32::fact(inputs[0].shape.clone())))
    }

    as_op!();
}

/// Replaces every `x · Cast<f32>(mask)` whose mask is a comparison of one value `y` with
/// a scalar constant, or an `And` of two such comparisons of the same `y`, by
/// [`PassInside`] (module doc). `x`, `y` and the product must be float32 of one concrete
/// shape. Returns how many products it replaced.
pub fn fuse_comparison_masks(model: &mut TypedModel) -> TractResult<usize> {
    let mut fused = 0;
    for id in model.eval_order()? {
        let Some(op) = model.node(id).op_as::<TypedBinOp>() else { continue };
        if op.0.name() != "Mul" {
            continue;
        }
        let inputs = model.node(id).inputs.clone();
        let Some((x, y, pass)) =
            (0..2).find_map(|i| mask_of(model, inputs[1 - i]).map(|(y, pass)| (inputs[i], y, pass)))
        else {
            continue;
        };
        let facts = [x, y, id.into()].map(|o| model.outlet_fact(o).cloned());
        let [Ok(xf), Ok(yf), Ok(of)] = facts else { continue };
        let same = |f: &TypedFact| f.datum_type == f32::datum_type() && f.shape.as_concrete() == of.shape.as_concrete();
        if of.shape.as_concrete().is_none() || !same(&xf) || !same(&yf) || !same(&of) {
            continue;
        }
        let name = model.node(id).name.clone();
        replace_node(model, id, &[x, y], |patch, taps| Ok(patch.wire_node(&name, pass, &taps)?[0]))?;
        fused += 1;
    }
    Ok(fused)
}

/// Where `outlet` is `Cast<f32>` of a mask [`fuse_comparison_masks`] fuses: the value
/// compared, and the op that passes what is inside the mask.
fn mask_of(model: &TypedModel, outlet: OutletId) -> Option<(OutletId, PassInside)> {
    let cast = model.node(outlet.node);
    if cast.op_as::<Cast>()?.to != f32::datum_type() {
        return None;
    }
    let mask = model.node(cast.inputs[0].node);
    let op = mask.op_as::<TypedBinOp>()?;
    let sides = if op.0.name() == "And" {
        let (y, first) = comparison_of(model, mask.inputs[0])?;
        let (y2, second) = comparison_of(model, mask.inputs[1])?;
        if y != y2 {
            return None;
        }
        (y, vec![first, second])
    } else {
        let (y, side) = comparison_of(model, cast.inputs[0])?;
        (y, vec![side])
    };
    let mut pass = PassInside { lower: None, upper: None };
    for side in sides.1 {
        let slot = match side {
            Side::Lower(b) => (&mut pass.lower, b),
            Side::Upper(b) => (&mut pass.upper, b),
        };
        // Two bounds on one side (y > 0 and y > 1) are left to tract.
        if slot.0.replace(slot.1).is_some() {
            return None;
        }
    }
    Some((sides.0, pass))
}

/// Where `outlet` is a comparison of a value with a float32 scalar constant: the value,
/// and the bound the comparison sets on it.
fn comparison_of(model: &TypedModel, outlet: OutletId) -> Option<(OutletId, Side)> {
    let node = model.node(outlet.node);
    let op = node.op_as::<TypedBinOp>()?;
    let scalar = |o: OutletId| -> Option<f32> {
        let k = model.outlet_fact(o).ok()?.konst.clone()?;
        (k.datum_type() == f32::datum_type() && k.len() == 1).then(|| k.cast_to_scalar::<f32>().ok()).flatten()
    };
    match (scalar(node.inputs[0]), scalar(node.inputs[1])) {
        (None, Some(c)) => Some((node.inputs[0], Side::of(op.0.name(), c, false)?)),
        (Some(c), None) => Some((node.inputs[1], Side::of(op.0.name(), c, true)?)),
        _ => None,
    }
}

/// For operands of shapes `a` and `b` (same rank), where one (the "small" one) broadcasts
/// into the other with a one somewhere before its last dimension that is not one, and
/// ones after it: the small operand's index and the shape to broadcast it to first, the
/// large operand's dimensions up to that last one and the small one's (ones) after it.
/// `None` where tract's kernels take the operands as they are, or where the small one
/// does not broadcast into the other.
fn by_scalar_target(a: &[usize], b: &[usize]) -> Option<(usize, TVec<usize>)> {
    if a.len() != b.len() {
        return None;
    }
    let volume = |s: &[usize]| s.iter().product::<usize>();
    let (small, large, index) = if volume(b) <= volume(a) { (b, a, 1) } else { (a, b, 0) };
    if small.iter().zip(large).any(|(&s, &l)| s != 1 && s != l) {
        return None;
    }
    // The last dimension that is not one: trailing ones after it, a one before it.
    let last = small.iter().rposition(|&d| d != 1)?;
    if last + 1 == small.len() || small[..last].iter().zip(large).all(|(&s, &l)| s == l) {
        return None;
    }
    let mut target: TVec<usize> = large[..=last].into();
    target.extend(small[last + 1..].iter().copied());
    Some((index, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_operands_get_the_leading_dimensions() {
        // BatchNormalization's statistics against an NCHW activation, either side.
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[1, 48, 1, 1]), Some((1, [32, 48, 1, 1].into())));
        assert_eq!(by_scalar_target(&[1, 48, 1, 1], &[32, 48, 7, 7]), Some((0, [32, 48, 1, 1].into())));
        // 1×1 spatial: the widened operand is as large as the other, which makes the op
        // unicast (equal shapes) instead of generic.
        assert_eq!(by_scalar_target(&[32, 480, 1, 1], &[1, 480, 1, 1]), Some((1, [32, 480, 1, 1].into())));
        // Channels-last per-channel operands and the leading-ones form are unicast already.
        assert_eq!(by_scalar_target(&[32, 7, 7, 48], &[1, 1, 1, 48]), None);
        // By scalar already (one value per (n, c)), same shapes, a scalar.
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[32, 48, 1, 1]), None);
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[32, 48, 7, 7]), None);
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[1, 1, 1, 1]), None);
        // Not a broadcast of one into the other, or of different ranks.
        assert_eq!(by_scalar_target(&[32, 48, 7, 1], &[1, 1, 1, 5]), None);
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[48, 1, 1]), None);
    }
}
