"""Evaluates a converted gradient graph (``grad.onnx``) in float64, to check the gradient
rules apart from float32 rounding: if every rule is right, the float64 evaluation of our
graph matches PyTorch's float64 gradients to float64 rounding (about 1e-10 relative or
below), whether or not the model is smooth at the batch.

``to_double`` rewrites the graph to float64: float32 initializers, ``Constant`` and
``ConstantOfShape`` values, ``Cast`` targets, and the element types of inputs, outputs and
value_info. ONNX Runtime's CPU kernels have no float64 ``Conv``/``ConvTranspose``, so the
graph runs on the ONNX reference evaluator (numpy, float64 throughout), with its ``Conv`` and
``ConvTranspose`` computed by PyTorch's float64 kernels (exact float64 arithmetic, only
faster than the reference's loops; attributes the override does not handle fall back to the
reference implementation).

Used by ``tools/zoo_sweep.py --f64-check``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_conv import Conv as RefConv
from onnx.reference.ops.op_conv_transpose import ConvTranspose as RefConvTranspose

FLOAT, DOUBLE = TensorProto.FLOAT, TensorProto.DOUBLE


def _double_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type != FLOAT:
        return t
    return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name)


def _double_type(vi: onnx.ValueInfoProto):
    tt = vi.type.tensor_type
    if tt.elem_type == FLOAT:
        tt.elem_type = DOUBLE


def to_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph computing in float64 (a copy)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for i, t in enumerate(g.initializer):
        g.initializer[i].CopyFrom(_double_tensor(t))
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        _double_type(vi)
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(_double_tensor(a.t))
            elif node.op_type in ("Cast", "EyeLike", "RandomUniformLike", "RandomNormalLike") and a.name in ("to", "dtype") \
                    and a.i == FLOAT:
                a.i = DOUBLE
            elif a.type == onnx.AttributeProto.FLOAT and node.op_type == "Constant":
                raise ValueError(f"{node.name}: a value_float Constant; rewrite it as a tensor")
    return m


def _ints(v, n, default):
    return list(v) if v is not None and len(v) else [default] * n


class TorchConv(RefConv):
    """``Conv`` by ``torch.nn.functional.conv{1,2,3}d`` in float64 (explicit pads)."""

    def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None,
             strides=None):
        import torch
        import torch.nn.functional as F

        n = X.ndim - 2
        if (auto_pad not in (None, "NOTSET", b"NOTSET")) or n not in (1, 2, 3):
            return super()._run(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides)
        pads = _ints(pads, 2 * n, 0)
        x = torch.from_numpy(np.ascontiguousarray(X))
        # F.pad takes (last axis begin, end, previous axis...); ONNX pads are (begins..., ends...).
        x = F.pad(x, [p for a in reversed(range(n)) for p in (pads[a], pads[a + n])])
        conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
        y = conv(x, torch.from_numpy(np.ascontiguousarray(W)),
                 None if B is None else torch.from_numpy(np.ascontiguousarray(B)),
                 stride=_ints(strides, n, 1), dilation=_ints(dilations, n, 1), groups=int(group or 1))
        return (y.numpy(),)


class TorchConvTranspose(RefConvTranspose):
    """``ConvTranspose`` by ``torch.nn.functional.conv_transpose{1,2,3}d`` in float64: the full
    output, then the pads cropped (ONNX pads may differ at the two ends)."""

    def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None,
             output_padding=None, output_shape=None, pads=None, strides=None):
        import torch
        import torch.nn.functional as F

        n = X.ndim - 2
        strides_, dil = _ints(strides, n, 1), _ints(dilations, n, 1)
        out_pad = _ints(output_padding, n, 0)
        if (auto_pad not in (None, "NOTSET", b"NOTSET")) or output_shape is not None or n not in (1, 2, 3) \
                or any(p >= max(s, d) for p, s, d in zip(out_pad, strides_, dil)):
            return super()._run(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, output_padding=output_padding,
                                output_shape=output_shape, pads=pads, strides=strides)
        pads = _ints(pads, 2 * n, 0)
        conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[n - 1]
        y = conv(torch.from_numpy(np.ascontiguousarray(X)), torch.from_numpy(np.ascontiguousarray(W)),
                 None if B is None else torch.from_numpy(np.ascontiguousarray(B)), stride=strides_,
                 output_padding=out_pad, groups=int(group or 1), dilation=dil)
        index = [slice(None), slice(None)] + [slice(pads[a], y.shape[2 + a] - pads[a + n]) for a in range(n)]
        return (y[tuple(index)].numpy(),)


def run_double(model: onnx.ModelProto, feeds: dict) -> dict:
    """Outputs by name of the float64 version of `model` on the feeds (float arrays are
    given in float64)."""
    double = to_double(model)
    evaluator = ReferenceEvaluator(double, new_ops=[TorchConv, TorchConvTranspose])
    names = [i.name for i in double.graph.input]
    inputs = {}
    for name in names:
        v = np.asarray(feeds[name])
        inputs[name] = v.astype(np.float64) if v.dtype.kind == "f" else v
    outs = evaluator.run(None, inputs)
    return dict(zip([o.name for o in double.graph.output], outs))
