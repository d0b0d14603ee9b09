"""Float32's branch decisions imposed on float64: the gradient check for models that are not
smooth at the batch (used by ``tools/zoo_sweep.py --branch-check``).

A ReLU, ReLU6 or max-pool picks a branch per element or window: the sign of a ReLU input,
the band of a ReLU6 input (below 0, between, above 6), the position of a window's maximum.
Where an input lies within float32 rounding of a kink, float32 and float64 pick different
branches, and the gradients of the two branches differ by far more than rounding: no
float32 evaluation, PyTorch's included, can then match float64. What can be checked is
that our float32 gradient is the right gradient *of the branch it took*:

1. run ``grad.onnx`` on ONNX Runtime with the input of every forward ``Relu``, ``Clip``
   and ``MaxPool`` node as extra graph outputs: the loss, the gradients and the float32
   values the branches were decided on, all from one run;
2. decide each branch from those values as the engines do (ReLU: ``x > 0``; ReLU6:
   ``min < x < max``; max-pool: the first maximum of the window in row-major order);
3. replace PyTorch's ``nn.ReLU``, ``nn.ReLU6``/``nn.Hardtanh`` and ``nn.MaxPool2d`` modules by
   ones that apply those decisions (a fixed mask, fixed bands, a gather at the fixed
   positions), in call order, checking that each call's input has the shape of the ONNX
   node's; run that model in float64 (the truth for this branch) and in float32 (PyTorch's
   own float32 error on it);
4. hold each of our gradients to the sweep's rule against the imposed float64 gradients.

A smooth model makes the same decisions in float32 and float64, so imposing them changes
nothing: the check then agrees with the plain comparison (the sanity rows of
docs/coverage.md).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

# PyTorch module kinds and the ONNX op each exports as.
ONNX_OP = {"relu": "Relu", "clip": "Clip", "maxpool": "MaxPool"}


def kind_of(module: nn.Module):
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.Hardtanh):  # nn.ReLU6 is one
        return "clip"
    if isinstance(module, nn.MaxPool2d):
        return "maxpool"
    return None


def branch_inputs(model_path: str):
    """(ONNX op, input value) of the forward Relu, Clip and MaxPool nodes, in graph order."""
    graph = onnx.load(model_path, load_external_data=False).graph
    return [(n.op_type, n.input[0]) for n in graph.node if n.op_type in ONNX_OP.values()]


def run_with_branch_inputs(conv_dir: str, feeds_for, values):
    """Runs grad.onnx with `values` as extra outputs; returns (outputs by name)."""
    grad = onnx.load(os.path.join(conv_dir, "grad.onnx"))
    produced = {o for n in grad.graph.node for o in n.output} | {i.name for i in grad.graph.input}
    missing = [v for v in values if v not in produced]
    if missing:
        raise ValueError(f"grad.onnx has no value named like the forward's {missing[:3]} ({len(missing)} in all)")
    present = {o.name for o in grad.graph.output}
    for v in dict.fromkeys(values):
        if v not in present:
            grad.graph.output.append(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = feeds_for([i.name for i in sess.get_inputs()])
    outs = sess.run(None, feeds)
    return dict(zip([o.name for o in sess.get_outputs()], outs))


def pool_positions(module: nn.MaxPool2d, x: torch.Tensor):
    """The plane position (row-major, unpadded) of each window's first maximum of `x`
    [N, C, H, W], and the pool's output shape."""
    k, s, p, d = (nn.modules.utils._pair(v) for v in (module.kernel_size, module.stride or module.kernel_size,
                                                      module.padding, module.dilation))
    n, c, h, w = x.shape
    out_shape = tuple(F.max_pool2d(x[:1, :1], k, s, p, d, module.ceil_mode).shape[2:])
    pads = []
    for axis, out in ((1, out_shape[1]), (0, out_shape[0])):  # F.pad's order: last axis first
        size = x.shape[2 + axis]
        reach = d[axis] * (k[axis] - 1) + 1
        pads += [p[axis], max(0, (out - 1) * s[axis] + reach - size - 2 * p[axis]) + p[axis]]
    x64 = x.to(torch.float64)
    cols = F.unfold(F.pad(x64, pads, value=float("-inf")), k, dilation=d, stride=s)
    cols = cols.reshape(n, c, k[0] * k[1], -1)
    ids = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
    id_cols = F.unfold(F.pad(ids, pads, value=-1.0), k, dilation=d, stride=s).reshape(1, 1, k[0] * k[1], -1)
    first = cols.argmax(dim=2, keepdim=True)  # torch.argmax returns the first maximum
    positions = id_cols.expand(n, c, -1, -1).gather(2, first).squeeze(2).to(torch.int64)
    assert int(positions.min()) >= 0, "a window's maximum in the padding"
    assert positions.shape[2] == out_shape[0] * out_shape[1]
    return positions, out_shape


def decide(kind: str, module: nn.Module, x: torch.Tensor):
    """The branch decisions of `module` on input `x`, as the engines make them."""
    if kind == "relu":
        return x > 0
    if kind == "clip":
        lo, hi = float(module.min_val), float(module.max_val)
        lo_t, hi_t = torch.tensor(lo, dtype=x.dtype), torch.tensor(hi, dtype=x.dtype)
        band = torch.ones(x.shape, dtype=torch.int8)
        band[x <= lo_t] = 0
        band[x >= hi_t] = 2
        return band
    return pool_positions(module, x)


def differing(kind: str, a, b) -> int:
    """How many elements (windows) decide differently."""
    if kind == "maxpool":
        return int((a[0] != b[0]).sum())
    return int((a != b).sum())


def size(kind: str, decision) -> int:
    return int(decision[0].numel()) if kind == "maxpool" else int(decision.numel())


class Decisions:
    """The decisions of the forward's branch nodes, handed out in call order."""

    def __init__(self, entries):
        self.entries, self.next = entries, 0

    def __deepcopy__(self, memo):
        # The sweep's `torch_grads` runs a deep copy of the model: its modules must count
        # their calls here.
        return self

    def take(self, kind: str, shape):
        if self.next >= len(self.entries):
            raise ValueError(f"the model calls more branch modules than the ONNX graph has nodes ({len(self.entries)})")
        want_kind, want_shape, decision = self.entries[self.next]
        if want_kind != kind or tuple(want_shape) != tuple(shape):
            raise ValueError(f"branch call {self.next}: the model calls a {kind} on {tuple(shape)}, the ONNX graph's "
                             f"node is a {ONNX_OP[want_kind]} of {tuple(want_shape)}")
        self.next += 1
        return decision


class Imposed(nn.Module):
    """A ReLU, ReLU6 or max-pool that applies given decisions instead of making its own."""

    def __init__(self, kind: str, original: nn.Module, decisions: Decisions):
        super().__init__()
        self.kind, self.original, self.decisions = kind, original, decisions

    def forward(self, x):
        d = self.decisions.take(self.kind, x.shape)
        if self.kind == "relu":
            return x * d.to(x.dtype)
        if self.kind == "clip":
            lo = torch.full_like(x, float(self.original.min_val))
            hi = torch.full_like(x, float(self.original.max_val))
            return torch.where(d == 1, x, torch.where(d == 2, hi, lo))
        positions, out_shape = d
        n, c = x.shape[:2]
        return x.flatten(2).gather(2, positions).reshape(n, c, *out_shape)


def replace_branches(model: nn.Module, decisions: Decisions) -> nn.Module:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            kind = kind_of(child)
            if kind:
                setattr(parent, name, Imposed(kind, child, decisions))
    return model


def natural_decisions(model: nn.Module, x: torch.Tensor, dtype):
    """(kind, input shape, decision, module) of every branch-module call of the model in
    `dtype` (the module a copy's: `decide` reads only its bounds or geometry)."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    seen = []

    def hook(module, inputs, _output):
        kind = kind_of(module)
        a = inputs[0].detach()
        seen.append((kind, tuple(a.shape), decide(kind, module, a), module))

    for mod in m.modules():
        if kind_of(mod):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        m(x if x.dtype == torch.int64 else x.to(dtype))
    return seen


def imposed_grads(model: nn.Module, entries, x, y, dtype, torch_grads):
    decisions = Decisions(entries)
    m = replace_branches(copy.deepcopy(model), decisions)
    loss, grads = torch_grads(m, x, y, dtype)
    if decisions.next != len(entries):
        raise ValueError(f"the model made {decisions.next} branch calls, the ONNX graph has {len(entries)} nodes")
    return loss, grads


def branch_check(conv_dir, model_path, model, x, y, feeds_for, grads_from, torch_grads, compare):
    """Our float32 loss and gradients against float64 with our float32 run's decisions
    imposed. `feeds_for(input names)` gives grad.onnx's feeds; `grads_from(outputs)` our
    gradients by PyTorch name; `torch_grads` and `compare` are the sweep's. Returns a dict:
    decisions and how many of them float64 makes differently (per kind), the per-tensor
    rows of `compare`, failing count and the worst row."""
    nodes = branch_inputs(model_path)
    outs = run_with_branch_inputs(conv_dir, feeds_for, [v for _, v in nodes])
    natural = natural_decisions(model, x, torch.float64)
    if len(natural) != len(nodes):
        raise ValueError(f"the model makes {len(natural)} branch-module calls, the ONNX graph has {len(nodes)} "
                         "Relu/Clip/MaxPool nodes: the two cannot be paired")
    entries, counts = [], {}
    for (op, value), (kind, shape, nat, module) in zip(nodes, natural):
        if ONNX_OP[kind] != op:
            raise ValueError(f"branch {len(entries)}: the model calls a {kind}, the ONNX graph has a {op} ({value})")
        x32 = torch.from_numpy(np.asarray(outs[value]))
        if tuple(x32.shape) != shape:
            raise ValueError(f"{value}: shape {tuple(x32.shape)} in grad.onnx, {shape} in the model")
        ours = decide(kind, module, x32)
        total, diff = counts.get(kind, (0, 0))
        counts[kind] = (total + size(kind, ours), diff + differing(kind, ours, nat))
        entries.append((kind, shape, ours))
    loss = float(outs["loss"])
    grads = grads_from(outs)
    loss64, g64 = imposed_grads(model, entries, x, y, torch.float64, torch_grads)
    loss32, g32 = imposed_grads(model, entries, x, y, torch.float32, torch_grads)
    rows = compare(loss, grads, loss64, g64, loss32, g32)
    failing = [r for r in rows if not r[1] <= r[2]]
    worst = max(rows, key=lambda r: r[1] / r[2] if r[2] > 0 else float("inf"))
    return {
        "decisions": {k: {"total": t, "differ": d} for k, (t, d) in counts.items()},
        "tensors": len(rows),
        "failing": len(failing),
        "failing_tensors": [r[0] for r in failing][:12],
        "worst": {"tensor": worst[0], "error": worst[1], "tolerance": worst[2]},
    }
