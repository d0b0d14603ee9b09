//! Shape rules of convolution and pooling.

use super::{Cx, Outputs};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{Dim, Node, Shape};

/// Geometry of a sliding-window op along its spatial axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Kernel size per spatial axis.
    pub kernel: Vec<usize>,
    /// Strides.
    pub strides: Vec<usize>,
    /// Dilations.
    pub dilations: Vec<usize>,
    /// Padding at the start of each axis.
    pub pads_begin: Vec<usize>,
    /// Padding at the end of each axis.
    pub pads_end: Vec<usize>,
    /// Pooling's `ceil_mode`.
    pub ceil_mode: bool,
}

impl Window {
    /// Reads a node's window attributes for an input with the given spatial sizes; the
    /// kernel comes from `kernel_shape` or, for Conv, from the weight.
    pub fn from_node(node: &Node, spatial: &[Dim], weight_kernel: Option<&[Dim]>) -> Result<Window> {
        let err = |m: String| crate::error::GraphError::node(node, m);
        let n = spatial.len();
        let kernel: Vec<usize> = match node.attr_ints("kernel_shape")? {
            Some(k) => k.iter().map(|&v| v.max(0) as usize).collect(),
            None => weight_kernel
                .ok_or_else(|| err("attribute \"kernel_shape\" is required".into()))?
                .iter()
                .map(|d| d.fixed().ok_or_else(|| err("the kernel size must be known".into())))
                .collect::<Result<_>>()?,
        };
        if kernel.contains(&0) || kernel.iter().any(|&k| k > 1 << 20) {
            return Err(err(format!("kernel size {kernel:?} is not valid")));
        }
        if kernel.len() != n {
            return Err(err(format!("kernel has {} axes but the input has {n} spatial axes", kernel.len())));
        }
        let list = |name: &str, default: usize| -> Result<Vec<usize>> {
            match node.attr_ints(name)? {
                Some(v) if v.len() == n && v.iter().all(|&x| (1..=1 << 20).contains(&x)) => {
                    Ok(v.iter().map(|&x| x as usize).collect())
                }
                Some(v) => Err(err(format!("attribute {name:?} = {v:?} does not fit {n} spatial axes"))),
                None => Ok(vec![default; n]),
            }
        };
        let strides = list("strides", 1)?;
        let dilations = list("dilations", 1)?;
        let ceil_mode = node.attr_int("ceil_mode", 0)? != 0;
        let auto_pad = node.attr_string("auto_pad", "NOTSET")?;
        let (pads_begin, pads_end) = match auto_pad.as_str() {
            "NOTSET" => match node.attr_ints("pads")? {
                Some(p) if p.len() == 2 * n && p.iter().all(|&x| (0..=1 << 20).contains(&x)) => {
                    (p[..n].iter().map(|&x| x as usize).collect(), p[n..].iter().map(|&x| x as usize).collect())
                }
                Some(p) => return Err(err(format!("attribute \"pads\" = {p:?} does not fit {n} spatial axes"))),
                None => (vec![0; n], vec![0; n]),
            },
            "VALID" => (vec![0; n], vec![0; n]),
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut begin = vec![0; n];
                let mut end = vec![0; n];
                for axis in 0..n {
                    let size = spatial[axis]
                        .fixed()
                        .filter(|&s| s > 0)
                        .ok_or_else(|| err("auto_pad SAME needs known, non-empty spatial sizes".into()))?;
                    let out = size.div_ceil(strides[axis]);
                    let effective = (kernel[axis] - 1) * dilations[axis] + 1;
                    let total = ((out - 1) * strides[axis] + effective).saturating_sub(size);
                    let small = total / 2;
                    if auto_pad == "SAME_UPPER" {
                        (begin[axis], end[axis]) = (small, total - small);
                    } else {
                        (begin[axis], end[axis]) = (total - small, small);
                    }
                }
                (begin, end)
            }
            other => return Err(err(format!("unknown auto_pad {other:?}"))),
        };
        Ok(Window { kernel, strides, dilations, pads_begin, pads_end, ceil_mode })
    }

    /// Output size along each spatial axis.
    pub fn output(&self, node: &Node, spatial: &[Dim]) -> Result<Vec<Dim>> {
        spatial
            .iter()
            .enumerate()
            .map(|(axis, d)| {
                let Some(size) = d.fixed() else { return Ok(Dim::Unknown) };
                let effective = (self.kernel[axis] - 1) * self.dilations[axis] + 1;
                let padded = size + self.pads_begin[axis] + self.pads_end[axis];
                if padded < effective {
                    return Err(crate::error::GraphError::node(
                        node,
                        format!(
                            "kernel {} (dilated {effective}) is larger than the padded input {padded}",
                            self.kernel[axis]
                        ),
                    ));
                }
                let stride = self.strides[axis];
                let span = padded - effective;
                let mut out = if self.ceil_mode { span.div_ceil(stride) + 1 } else { span / stride + 1 };
                // A window that would start inside the end padding is dropped.
                if self.ceil_mode && (out - 1) * stride >= size + self.pads_begin[axis] {
                    out -= 1;
                }
                Ok(Dim::Fixed(out))
            })
            .collect()
    }
}

/// The input of a sliding-window op: N×C×spatial....
fn windowed_input(cx: &Cx<'_>) -> Result<(DataType, Shape)> {
    let (dtype, x) = cx.input(0)?;
    if x.len() < 3 {
        return Err(cx.err(format!("input must be N×C×spatial..., got rank {}", x.len())));
    }
    Ok((dtype, x))
}

/// The weight of a convolution, of the input's rank.
fn weight_shape(cx: &Cx<'_>, x: &[Dim]) -> Result<Shape> {
    let (_, w) = cx.input(1)?;
    if w.len() != x.len() {
        return Err(cx.err(format!("weight rank {} differs from input rank {}", w.len(), x.len())));
    }
    Ok(w)
}

pub(crate) fn global_pool(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = windowed_input(cx)?;
    let spatial = &x[2..];
    let mut out = x[..2].to_vec();
    out.extend(std::iter::repeat_n(Dim::Fixed(1), spatial.len()));
    Ok(vec![(dtype, out)])
}

pub(crate) fn conv_transpose(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = windowed_input(cx)?;
    let spatial = &x[2..];
    let w = weight_shape(cx, &x)?;
    let group = cx.node.attr_int("group", 1)?.max(1) as usize;
    let window = Window::from_node(cx.node, spatial, Some(&w[2..]))?;
    let output_padding = cx.node.attr_ints("output_padding")?.map(|p| p.to_vec()).unwrap_or(vec![0; spatial.len()]);
    if output_padding.len() != spatial.len() || output_padding.iter().any(|&p| !(0..1 << 20).contains(&p)) {
        return Err(cx.err(format!("output_padding {output_padding:?} does not fit the input")));
    }
    let mut out = vec![x[0].clone(), w[1].fixed().map_or(Dim::Unknown, |c| Dim::Fixed(c * group))];
    for (axis, d) in spatial.iter().enumerate() {
        out.push(match d.fixed() {
            Some(n) if n > 0 => {
                let full = window.strides[axis] * (n - 1)
                    + output_padding[axis] as usize
                    + (window.kernel[axis] - 1) * window.dilations[axis]
                    + 1;
                let pads = window.pads_begin[axis] + window.pads_end[axis];
                if full < pads {
                    return Err(cx.err("the padding is larger than the output"));
                }
                Dim::Fixed(full - pads)
            }
            _ => Dim::Unknown,
        });
    }
    Ok(vec![(dtype, out)])
}

pub(crate) fn conv(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = windowed_input(cx)?;
    let spatial = &x[2..];
    let w = weight_shape(cx, &x)?;
    let group = cx.node.attr_int("group", 1)?.max(1) as usize;
    if let (Some(c), Some(wc)) = (x[1].fixed(), w[1].fixed())
        && c != wc * group
    {
        return Err(cx.err(format!("input has {c} channels but weight expects {wc} × group {group}")));
    }
    if cx.has_input(2) {
        let (_, b) = cx.input(2)?;
        if b.len() != 1 || (b[0].fixed().is_some() && w[0].fixed().is_some() && b[0] != w[0]) {
            // torch.onnx.export(dynamo=True) writes a Conv3d without a bias with a zero
            // bias shaped [out_channels, 2], which ONNX Runtime refuses too.
            let hint = if spatial.len() == 3 && b.len() == 2 {
                " (got a matrix: the dynamo exporter writes one for a Conv3d without bias, which ONNX Runtime \
                 refuses as well; export with dynamo=False)"
            } else {
                ""
            };
            return Err(cx.err(format!("bias must be a vector with one value per output channel{hint}")));
        }
    }
    let window = Window::from_node(cx.node, spatial, Some(&w[2..]))?;
    let mut out = vec![x[0].clone(), w[0].clone()];
    out.extend(window.output(cx.node, spatial)?);
    Ok(vec![(dtype, out)])
}

pub(crate) fn pool(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = windowed_input(cx)?;
    let spatial = &x[2..];
    let window = Window::from_node(cx.node, spatial, None)?;
    let mut out = x[..2].to_vec();
    out.extend(window.output(cx.node, spatial)?);
    Ok(vec![(dtype, out.clone()), (DataType::Int64, out)])
}
