#!/usr/bin/env python3
"""Export the edgefreeze reference models to ONNX with PyTorch's own exporters.

Usage:
    pip install -r tools/requirements.txt
    python3 tools/export_models.py --out models

For every model this writes ``<out>/<name>.onnx`` (a single self-contained file)
and ``<out>/<name>.json`` (a sidecar describing the network, read by the Rust
tests).  Every model is exported with the TorchScript exporter (opset 17,
``do_constant_folding=False`` so that BatchNormalization stays a separate node);
``lenet5``, ``resnet20_28`` and ``transformer_text`` are also exported with the
dynamo (torch.export based) exporter as ``<name>_dynamo.onnx`` (opset 18,
``optimize=False``: the default onnxscript optimizer would fuse BatchNorm into
Conv and turn Linear weights into anonymous pre-transposed initializers).  One
external-data fixture, ``mlp_external.onnx`` + ``mlp_external.onnx.data``, is
written as well.  Finally ``<out>/README.md`` is regenerated.

Every file is checked with ``onnx.checker.check_model(full_check=True)`` and
run with onnxruntime (CPUExecutionProvider) on a random batch of 3; the result
must match PyTorch within 1e-4 (max abs diff).

All weights are random (``torch.manual_seed(0)``); nothing is downloaded.
Because the default initialisation of BatchNorm/LayerNorm is constant
(weight=1, bias=0, running_mean=0, running_var=1) -- which both hides bugs in
a consumer and makes the TorchScript exporter de-duplicate equal initializers
into ``Identity`` nodes (e.g. ``running_var = Identity(weight)``) -- the affine
parameters and running statistics of every norm layer are re-drawn from the
same seeded generator.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import torchvision
    from torchvision.models import mobilenet_v2
    from torchvision.models.mobilenetv2 import InvertedResidual
except ImportError as exc:  # pragma: no cover - hard requirement
    raise SystemExit(f"torchvision is required (pip install -r tools/requirements.txt): {exc}")

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")

TS_OPSET = 17
DYNAMO_OPSET = 18
ATOL = 1e-4
MAX_FILE_BYTES = 5 * 1024 * 1024

# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------


def make_mlp() -> nn.Module:
    return nn.Sequential(
        collections.OrderedDict(
            [
                ("flatten", nn.Flatten()),
                ("fc1", nn.Linear(784, 256)),
                ("relu1", nn.ReLU()),
                ("fc2", nn.Linear(256, 128)),
                ("relu2", nn.ReLU()),
                ("fc3", nn.Linear(128, 10)),
            ]
        )
    )


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) adapted to 1x28x28 inputs (conv1 padding 2)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(120, 84)
        self.relu4 = nn.ReLU()
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu3(self.fc1(x))
        x = self.relu4(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN + shortcut, ReLU after the add.

    The projection shortcut (when the shape changes) is a 1x1 conv + BN
    (option B of He et al. 2016)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu2 = nn.ReLU()
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )
        else:
            self.downsample = None

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


class ResNet20(nn.Module):
    """CIFAR ResNet-20 (He et al. 2016, sec. 4.2): 16/32/64 channels, 3x3 BasicBlocks."""

    def __init__(self, in_ch: int = 3, num_classes: int = 10, blocks_per_stage: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.layer1 = self._stage(16, 16, blocks_per_stage, stride=1)
        self.layer2 = self._stage(16, 32, blocks_per_stage, stride=2)
        self.layer3 = self._stage(32, 64, blocks_per_stage, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    @staticmethod
    def _stage(in_ch, out_ch, n, stride):
        layers = [BasicBlock(in_ch, out_ch, stride)]
        layers += [BasicBlock(out_ch, out_ch, 1) for _ in range(n - 1)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def make_mobilenetv2_05() -> nn.Module:
    return mobilenet_v2(weights=None, width_mult=0.5, num_classes=10)


def make_mobilenetv2_05_28() -> nn.Module:
    """MobileNetV2 x0.5 for 1x28x28 (Fashion-MNIST): the stem convolution takes one
    channel; 28x28 halves five times to 1x1 like 32x32 does."""
    m = make_mobilenetv2_05()
    stem = m.features[0][0]
    m.features[0][0] = nn.Conv2d(1, stem.out_channels, stem.kernel_size, stem.stride, stem.padding, bias=False)
    return m


# Transformer text classifier -------------------------------------------------

SEQ_LEN = 64
VOCAB = 4096
D_MODEL = 64
N_HEADS = 4
HEAD_DIM = D_MODEL // N_HEADS
D_FF = 128


class SelfAttention(nn.Module):
    def __init__(self, d: int = D_MODEL, heads: int = N_HEADS):
        super().__init__()
        self.heads = heads
        self.head_dim = d // heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def _split(self, t):  # [B, T, D] -> [B, H, T, Dh]
        # reshape with a literal -1 batch and constant T/H/Dh: the TorchScript
        # exporter then writes a plain Reshape with a constant shape, whereas
        # unflatten(-1, (H, Dh)) exports as Shape/Slice/Mod/Concat arithmetic.
        return t.reshape(-1, SEQ_LEN, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        q = self._split(self.q(x))
        k = self._split(self.k(x))
        v = self._split(self.v(x))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v)  # [B, H, T, Dh]
        y = y.transpose(1, 2).reshape(-1, SEQ_LEN, self.heads * self.head_dim)  # [B, T, D]
        return self.out(y)


class FeedForward(nn.Module):
    def __init__(self, d: int = D_MODEL, d_ff: int = D_FF):
        super().__init__()
        self.fc1 = nn.Linear(d, d_ff)
        self.act = nn.GELU()  # exact (erf) GELU
        self.fc2 = nn.Linear(d_ff, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PreNormResidual(nn.Module):
    """x + f(LayerNorm(x)): one residual block of a pre-LN Transformer layer."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.ln = nn.LayerNorm(D_MODEL)
        self.inner = inner

    def forward(self, x):
        return x + self.inner(self.ln(x))


class EncoderLayer(nn.Module):
    """Pre-LN Transformer encoder layer: an attention block, then a feed-forward block.

    Each block is a residual unit of its own: exactly one tensor crosses between them.
    """

    def __init__(self):
        super().__init__()
        self.attn = PreNormResidual(SelfAttention())
        self.mlp = PreNormResidual(FeedForward())

    def forward(self, x):
        return self.mlp(self.attn(x))


class TransformerText(nn.Module):
    def __init__(self, num_layers: int = 2, num_classes: int = 2):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, D_MODEL)
        self.pos_emb = nn.Embedding(SEQ_LEN, D_MODEL)
        # constant position indices [1, T] (non-persistent: not in state_dict)
        self.register_buffer("pos_ids", torch.arange(SEQ_LEN, dtype=torch.int64).unsqueeze(0), persistent=False)
        self.layers = nn.ModuleList([EncoderLayer() for _ in range(num_layers)])
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, num_classes)

    def forward(self, tokens):  # [B, T] int64
        x = self.tok_emb(tokens) + self.pos_emb(self.pos_ids)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        x = x.mean(dim=1)
        return self.head(x)


# Keyword spotting M5 -----------------------------------------------------------


class M5(nn.Module):
    """M5 raw-waveform CNN (Dai et al. 2017) with 32 base channels, 35 keywords."""

    def __init__(self, n_input: int = 1, n_output: int = 35, n_channel: int = 32, stride: int = 16):
        super().__init__()
        self.conv1 = nn.Conv1d(n_input, n_channel, kernel_size=80, stride=stride)
        self.bn1 = nn.BatchNorm1d(n_channel)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool1d(4)
        self.conv2 = nn.Conv1d(n_channel, n_channel, kernel_size=3)
        self.bn2 = nn.BatchNorm1d(n_channel)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool1d(4)
        self.conv3 = nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3)
        self.bn3 = nn.BatchNorm1d(2 * n_channel)
        self.relu3 = nn.ReLU()
        self.pool3 = nn.MaxPool1d(4)
        self.conv4 = nn.Conv1d(2 * n_channel, 2 * n_channel, kernel_size=3)
        self.bn4 = nn.BatchNorm1d(2 * n_channel)
        self.relu4 = nn.ReLU()
        self.pool4 = nn.MaxPool1d(4)
        self.fc1 = nn.Linear(2 * n_channel, n_output)

    def forward(self, x):
        x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        x = self.pool2(self.relu2(self.bn2(self.conv2(x))))
        x = self.pool3(self.relu3(self.bn3(self.conv3(x))))
        x = self.pool4(self.relu4(self.bn4(self.conv4(x))))
        x = F.adaptive_avg_pool1d(x, 1)
        x = torch.flatten(x, 1)
        return self.fc1(x)


# Segmentation FCN --------------------------------------------------------------

FCN_CLASSES = 11  # the 10 Fashion-MNIST classes + background (class 10)


class FCNDecoder(nn.Module):
    """FCN28's decoder: conv-BN-ReLU at 7x7 (stride 2 from the 14x14 features) and 7x7, a
    1x1 score conv, bilinear x2 to 14x14 plus a 1x1 score conv of the 14x14 features (the
    FCN-16s skip), bilinear x2 to 28x28 (align_corners=False). The skip rejoins at the
    add, so no single tensor can be cut inside: one unit, like a residual block."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.conv3 = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(64)
        self.relu3 = nn.ReLU()
        self.conv4 = nn.Conv2d(64, 64, 3, stride=1, padding=1, bias=False)
        self.bn4 = nn.BatchNorm2d(64)
        self.relu4 = nn.ReLU()
        self.score = nn.Conv2d(64, num_classes, 1)
        self.score_skip = nn.Conv2d(32, num_classes, 1)

    def forward(self, skip):
        x = self.relu3(self.bn3(self.conv3(skip)))  # 64 x 7 x 7
        x = self.relu4(self.bn4(self.conv4(x)))  # 64 x 7 x 7
        x = F.interpolate(self.score(x), scale_factor=2.0, mode="bilinear", align_corners=False)  # 11 x 14 x 14
        x = x + self.score_skip(skip)
        return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)  # 11 x 28 x 28


class FCN28(nn.Module):
    """A small fully convolutional segmentation network (Long et al. 2015) for 1x28x28:
    per-pixel class maps [N, 11, 28, 28]. conv-BN-ReLU at 28x28 and 14x14 (stride 2), then
    the decoder (FCNDecoder) with its skip from the 14x14 features."""

    def __init__(self, num_classes: int = FCN_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.decoder = FCNDecoder(num_classes)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))  # 16 x 28 x 28
        skip = self.relu2(self.bn2(self.conv2(x)))  # 32 x 14 x 14
        return self.decoder(skip)


# ---------------------------------------------------------------------------
# Model table
# ---------------------------------------------------------------------------


@dataclass
class Spec:
    name: str
    build: Callable[[], nn.Module]
    architecture: str
    input_shape: tuple  # per-sample
    input_dtype: str  # "float32" | "int64"
    num_classes: int
    dynamo: bool = False
    notes: list = field(default_factory=list)
    # per-sample output shape; None: (num_classes,), a classifier's
    output_shape: tuple | None = None

    @property
    def logits_shape(self) -> tuple:
        return tuple(self.output_shape) if self.output_shape is not None else (self.num_classes,)


SPECS = [
    Spec("mlp", make_mlp, "MLP 784-256-128-10 (ReLU), Flatten input", (1, 28, 28), "float32", 10),
    Spec("lenet5", LeNet5, "LeNet-5 (LeCun et al. 1998), conv 6@5x5 pad 2 / 16@5x5, FC 120-84-10, for 1x28x28",
         (1, 28, 28), "float32", 10, dynamo=True),
    Spec("resnet20_28", lambda: ResNet20(in_ch=1), "ResNet-20 (He et al. 2016), CIFAR-style, for 1x28x28",
         (1, 28, 28), "float32", 10, dynamo=True),
    Spec("resnet20_32", lambda: ResNet20(in_ch=3), "ResNet-20 (He et al. 2016), CIFAR-style, for 3x32x32",
         (3, 32, 32), "float32", 10),
    Spec("mobilenetv2_05", make_mobilenetv2_05,
         f"MobileNetV2 (Sandler et al. 2018), torchvision {torchvision.__version__.split('+')[0]} "
         "mobilenet_v2(width_mult=0.5, num_classes=10), for 3x32x32",
         (3, 32, 32), "float32", 10),
    Spec("mobilenetv2_05_28", make_mobilenetv2_05_28,
         f"MobileNetV2 (Sandler et al. 2018), torchvision {torchvision.__version__.split('+')[0]} "
         "mobilenet_v2(width_mult=0.5, num_classes=10) with a 1-channel stem, for 1x28x28",
         (1, 28, 28), "float32", 10),
    Spec("transformer_text", TransformerText,
         "Pre-LN Transformer encoder text classifier: vocab 4096, seq 64, d 64, 4 heads, FF 128 (GELU), "
         "2 layers, mean pool, 2 classes",
         (SEQ_LEN,), "int64", 2, dynamo=True),
    Spec("kws_m5", M5, "M5 raw-audio CNN (Dai et al. 2017), 32 channels, 35 keywords, for 1x16000",
         (1, 16000), "float32", 35),
    Spec("fcn_28", FCN28,
         "FCN segmentation net (Long et al. 2015), conv-BN-ReLU 16@28x28 / 32@14x14 / 64@7x7 / 64@7x7, "
         "1x1 score conv, bilinear x2 + 1x1 score conv of the 14x14 features (FCN-16s skip), bilinear x2; "
         "per-pixel logits [batch, 11, 28, 28] (10 Fashion-MNIST classes + background = class 10), for 1x28x28",
         (1, 28, 28), "float32", FCN_CLASSES, output_shape=(FCN_CLASSES, 28, 28)),
]

# Larger torchvision models for `edgefreeze bench` only (issue 9's ResNet-18 and
# EfficientNet-B0 at 64x64): tens of MB each, so they are not committed to models/;
# `--bench --out DIR` exports them, and tools/bench_pytorch.py knows them by name.
def with_random_biases(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """torchvision initialises some biases to zero, and the TorchScript exporter merges
    initializers with equal values into one, which would tie those parameters together."""

    def build_it() -> nn.Module:
        model = make()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.01)
        return model

    return build_it


BENCH_SPECS = [
    Spec("resnet18_64", with_random_biases(lambda: torchvision.models.resnet18(num_classes=10)),
         f"ResNet-18, torchvision {torchvision.__version__.split('+')[0]} resnet18(num_classes=10), for 3x64x64",
         (3, 64, 64), "float32", 10),
    Spec("efficientnet_b0_64", with_random_biases(lambda: torchvision.models.efficientnet_b0(num_classes=10)),
         f"EfficientNet-B0, torchvision {torchvision.__version__.split('+')[0]} efficientnet_b0(num_classes=10), "
         "for 3x64x64 (exported in eval mode: no Dropout or stochastic depth in the ONNX graph)",
         (3, 64, 64), "float32", 10),
]

LEAF_TYPES = (nn.Conv1d, nn.Conv2d, nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.Embedding)
BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)


def is_residual_block(m: nn.Module) -> bool:
    if isinstance(m, (BasicBlock, PreNormResidual, FCNDecoder)):
        return True
    return isinstance(m, InvertedResidual) and bool(m.use_res_connect)


def randomize_norms(model: nn.Module) -> None:
    """Draw non-trivial affine params / running stats for every norm layer
    (uses the global, already seeded RNG)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, BN_TYPES):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
            elif isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)


def build(spec: Spec) -> nn.Module:
    torch.manual_seed(0)
    model = spec.build()
    randomize_norms(model)
    model.eval()
    return model


def make_input(spec: Spec, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (batch,) + tuple(spec.input_shape)
    if spec.input_dtype == "int64":
        return torch.randint(0, VOCAB, shape, generator=g, dtype=torch.int64)
    return torch.randn(shape, generator=g, dtype=torch.float32)


# ---------------------------------------------------------------------------
# Units (freezing / partitioning granularity)
# ---------------------------------------------------------------------------


def compute_units(model: nn.Module, spec: Spec) -> list:
    named = dict(model.named_modules())
    units = []  # (name, module, kind)
    covered = set()
    for name, m in model.named_modules():
        if name in covered:
            continue
        if name and is_residual_block(m):
            units.append((name, m, "residual"))
            covered.update(f"{name}.{sub}" if sub else name for sub, _ in m.named_modules())
        elif isinstance(m, LEAF_TYPES):
            units.append((name, m, type(m).__name__))
            covered.add(name)
    # every module that owns parameters directly must be covered by a unit
    for name, m in named.items():
        own = sum(p.numel() for p in m.parameters(recurse=False))
        if own and name not in covered:
            raise AssertionError(f"{spec.name}: module {name!r} ({type(m).__name__}) has parameters but no unit")

    def run_hooks(batch: int):
        order, shapes, handles = {}, {}, []
        for uname, mod, _ in units:
            def pre(_m, _inp, uname=uname):
                order.setdefault(uname, len(order))

            def post(_m, _inp, out, uname=uname):
                shapes.setdefault(uname, tuple(out.shape))

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
        try:
            with torch.no_grad():
                model(make_input(spec, batch, seed=99))
        finally:
            for h in handles:
                h.remove()
        return order, shapes

    order1, shapes1 = run_hooks(1)
    _, shapes2 = run_hooks(2)
    missing = [u[0] for u in units if u[0] not in order1]
    if missing:
        raise AssertionError(f"{spec.name}: units never called in forward: {missing}")
    out = []
    for uname, mod, kind in sorted(units, key=lambda u: order1[u[0]]):
        s1, s2 = shapes1[uname], shapes2[uname]
        # the leading dim must be the batch dim (checked with batch 1 and 2); a
        # batch-independent output (pos_emb of the constant [1, T] ids) has a
        # leading 1 that broadcasts over the batch
        assert s1[0] == 1 and s2[0] in (1, 2) and s1[1:] == s2[1:], (spec.name, uname, s1, s2)
        out.append(
            {
                "name": uname,
                "kind": kind,
                "parameters": int(sum(p.numel() for p in mod.parameters())),
                "output_shape": list(s1[1:]),
            }
        )
    total = sum(p.numel() for p in model.parameters())
    assert sum(u["parameters"] for u in out) == total, (spec.name, sum(u["parameters"] for u in out), total)
    return out


def count_buffers(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        if isinstance(m, BN_TYPES):
            n += m.running_mean.numel() + m.running_var.numel()
    return n


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------


def export_torchscript(model: nn.Module, spec: Spec, path: str) -> None:
    x = make_input(spec, 2, seed=7)
    torch.onnx.export(
        model,
        (x,),
        path,
        dynamo=False,
        opset_version=TS_OPSET,
        do_constant_folding=False,
        export_params=True,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
    )


def export_dynamo(model: nn.Module, spec: Spec, path: str) -> None:
    x = make_input(spec, 2, seed=7)
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.onnx.export(
        model,
        (x,),
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        input_names=["input"],
        output_names=["logits"],
        dynamic_shapes=({0: batch},),
        # optimize=True (the default) runs the onnxscript optimizer, whose rewrite
        # rules fuse BatchNormalization into Conv, fold Transpose(Linear.weight)
        # into anonymous pre-transposed initializers ("val_3") and constant-fold
        # pos_emb(pos_ids) into a constant: the trainable parameters would no
        # longer be recognisable initializers.  Keep the graph as translated.
        optimize=False,
        verify=False,
        report=False,
    )
    proto = program.model_proto
    # one self-contained file (no external data)
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")
    onnx.save_model(proto, path, save_as_external_data=False)


def write_external_fixture(src: str, dst: str) -> None:
    data_name = os.path.basename(dst) + ".data"
    data_path = os.path.join(os.path.dirname(dst), data_name)
    # onnx appends to an existing data file: start from scratch
    for p in (dst, data_path):
        if os.path.exists(p):
            os.remove(p)
    m = onnx.load(src)
    onnx.save_model(m, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=0)
    os.chmod(data_path, 0o644)  # onnx creates it 0600


# ---------------------------------------------------------------------------
# Verification and sidecars
# ---------------------------------------------------------------------------


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    raise AssertionError("no ai.onnx opset import")


def dims(vi: onnx.ValueInfoProto) -> list:
    out = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_param if d.HasField("dim_param") else int(d.dim_value))
    return out


def all_nodes(model: onnx.ModelProto):
    def walk(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        yield from walk(g)

    yield from walk(model.graph)
    for f in model.functions:
        yield from f.node


def verify(path: str, model: nn.Module, spec: Spec, expect_external: bool = False) -> dict:
    size = os.path.getsize(path)
    # the committed models stay small; the benchmark-only ones are not committed
    assert size < MAX_FILE_BYTES or spec in BENCH_SPECS, f"{path} is {size} bytes"
    onnx.checker.check_model(path, full_check=True)
    m = onnx.load(path, load_external_data=False)
    external = [t.name for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if expect_external:
        assert external and len(external) == len(m.graph.initializer), "expected all initializers external"
    else:
        assert not external, f"{path}: unexpected external data {external}"

    # I/O names and dynamic batch
    assert [i.name for i in m.graph.input] == ["input"], [i.name for i in m.graph.input]
    assert [o.name for o in m.graph.output] == ["logits"], [o.name for o in m.graph.output]
    in_dims, out_dims = dims(m.graph.input[0]), dims(m.graph.output[0])
    assert in_dims == ["batch", *spec.input_shape], (path, in_dims)
    assert out_dims == ["batch", *spec.logits_shape], (path, out_dims)

    # every BatchNorm module must survive as a BatchNormalization node
    n_bn_modules = sum(isinstance(mm, BN_TYPES) for mm in model.modules())
    nodes = list(all_nodes(m))
    n_bn_nodes = sum(n.op_type == "BatchNormalization" for n in nodes)
    assert n_bn_nodes == n_bn_modules, f"{path}: {n_bn_nodes} BatchNormalization nodes for {n_bn_modules} BN modules"
    init_names = {t.name for t in m.graph.initializer}
    bn_inputs = {i for n in nodes if n.op_type == "BatchNormalization" for i in n.input}
    for bn_name, mm in model.named_modules():
        if isinstance(mm, BN_TYPES):
            for suffix in ("weight", "bias", "running_mean", "running_var"):
                tname = f"{bn_name}.{suffix}"
                assert tname in init_names and tname in bn_inputs, f"{path}: {tname} is not a BN initializer input"

    # every parameter keeps its PyTorch name as an initializer of the same size
    init_sizes = {t.name: int(np.prod(t.dims)) for t in m.graph.initializer}
    for pname, p in model.named_parameters():
        assert init_sizes.get(pname) == p.numel(), f"{path}: parameter {pname} is not an initializer"

    # onnxruntime vs torch on a random batch of 3
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = make_input(spec, 3, seed=1234)
    with torch.no_grad():
        ref = model(x).numpy()
    (got,) = sess.run(["logits"], {"input": x.numpy()})
    assert got.shape == ref.shape == (3, *spec.logits_shape), (got.shape, ref.shape)
    diff = float(np.max(np.abs(got - ref)))
    assert diff < ATOL, f"{path}: max abs diff {diff}"

    ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in nodes)
    return {
        "model": m,
        "size": size,
        "diff": diff,
        "ref_absmax": float(np.max(np.abs(ref))),
        "ops": ops,
        "opset": ai_onnx_opset(m),
        "functions": [f"{f.domain}::{f.name}" for f in m.functions],
        "opset_imports": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "identity_inits": [n.input[0] for n in m.graph.node if n.op_type == "Identity" and n.input[0] in init_names],
        "n_initializers": len(m.graph.initializer),
    }


def sidecar(name: str, file: str, spec: Spec, exporter: str, opset: int, model: nn.Module, units: list) -> dict:
    return {
        "name": name,
        "file": file,
        "architecture": spec.architecture,
        "exporter": exporter,
        "opset": opset,
        "torch_version": torch.__version__,
        "input": {"name": "input", "dtype": spec.input_dtype, "shape": ["batch", *spec.input_shape]},
        "output": {"name": "logits", "shape": ["batch", *spec.logits_shape]},
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "buffers": int(count_buffers(model)),
        "units": units,
    }


def write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_readme(out: str, rows: list) -> None:
    lines = [
        "# Reference ONNX models",
        "",
        "Small classifiers (and one segmentation model, `fcn_28`) exported with PyTorch's own ONNX exporters by",
        "[`tools/export_models.py`](../tools/export_models.py). Weights are random",
        "(`torch.manual_seed(0)`; BatchNorm/LayerNorm affine parameters and running",
        "statistics are re-drawn from the same seeded RNG so they are not the trivial",
        "1/0 defaults). All models are in eval mode, take `input` and produce `logits`,",
        "and have a dynamic batch dimension named `batch`.",
        "",
        "Each `<name>.onnx` has a `<name>.json` sidecar: architecture, exporter, opset,",
        "torch version, input/output shapes, parameter count, BN buffer count",
        "(running mean + var elements) and the list of *units* (the layers used for",
        "freezing/partitioning, in forward order; a residual block is one unit).",
        "",
        f"Exported with torch {torch.__version__}, torchvision {torchvision.__version__}, "
        f"onnx {onnx.__version__}; checked with `onnx.checker.check_model(full_check=True)` and",
        f"onnxruntime {ort.__version__} (CPU, batch of 3, max abs diff < {ATOL:g} vs PyTorch).",
        "",
        "| file | architecture / source | exporter | opset | parameters | input shape |",
        "|---|---|---|---|---:|---|",
    ]
    for r in rows:
        shape = "[" + ", ".join(str(s) for s in r["input"]["shape"]) + "]"
        lines.append(
            f"| `{r['file']}` | {r['architecture']} | {r['exporter']} | {r['opset']} | "
            f"{r['parameters']:,} | `{shape}` {r['input']['dtype']} |"
        )
    lines += [
        "",
        "Notes:",
        "",
        "- TorchScript exports use `opset_version=17, do_constant_folding=False`, so every",
        "  BatchNorm module stays a `BatchNormalization` node (not fused into the Conv)",
        "  and parameters keep their PyTorch names as initializer names.",
        "- `*_dynamo.onnx` are the same modules (same weights) exported with",
        "  `torch.onnx.export(..., dynamo=True, opset_version=18, optimize=False)` and a",
        "  `torch.export.Dim(\"batch\")` dynamic batch dimension. `optimize=False` keeps the",
        "  graph as translated (BatchNormalization nodes, parameters as named",
        "  initializers, but also `Shape`/`Squeeze`/`Concat` batch-size plumbing and, for",
        "  bias-free convs, a zero bias built with `Shape`/`Expand`/`CastLike`). The default",
        "  `optimize=True` would fuse BatchNorm into Conv, replace `Linear.weight` by",
        "  anonymous pre-transposed initializers and constant-fold the positional",
        "  embedding lookup.",
        "- Units: every Conv/Linear/BatchNorm/LayerNorm/Embedding is its own unit, except",
        "  that everything inside a residual block (ResNet BasicBlock, MobileNetV2",
        "  InvertedResidual with a skip connection, Transformer encoder layer) is one",
        "  unit of kind `residual`. Unit parameters sum to `parameters`; initializer",
        "  names are `<unit>.<...>` as in PyTorch.",
        "- MobileNetV2 keeps torchvision's ImageNet strides, so on 32x32 input the",
        "  feature map is 1x1 from `features.14` on.",
        "- `fcn_28.onnx` is a segmentation model: its `logits` are per-pixel class maps",
        "  `[batch, 11, 28, 28]` (classes 0-9 Fashion-MNIST, 10 background), for",
        "  `--loss cross-entropy[:ignore=I]` against int64 labels `[batch, 28, 28]`; its",
        "  upsampling is `Resize` (linear, `half_pixel`: bilinear with `align_corners=False`).",
        "- `mlp_external.onnx` + `mlp_external.onnx.data` is `mlp.onnx` re-saved with",
        "  `save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=0`",
        "  (all initializers in the `.data` file).",
        "",
        "Regenerate:",
        "",
        "```sh",
        "pip install -r tools/requirements.txt && python3 tools/export_models.py --out models",
        "```",
        "",
    ]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="models", help="output directory")
    ap.add_argument("--only", nargs="*", help="export only these model names")
    ap.add_argument("--ops", action="store_true", help="print op-type histograms")
    ap.add_argument("--bench", action="store_true",
                    help="export the benchmark-only models (BENCH_SPECS) instead of the bundled ones")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, onnx {onnx.__version__}, "
          f"onnxruntime {ort.__version__}")
    rows = []

    def record(name, file, spec, exporter, model, units, info):
        side = sidecar(name, file, spec, exporter, info["opset"], model, units)
        write_json(os.path.join(args.out, f"{name}.json"), side)
        rows.append(side)
        fn = f" functions={info['functions']}" if info["functions"] else ""
        idn = f" identity-initializers={info['identity_inits']}" if info["identity_inits"] else ""
        print(f"OK {file:28s} {exporter:11s} opset={info['opset']} params={side['parameters']:>7d} "
              f"units={len(units):>2d} nodes={sum(info['ops'].values()):>4d} size={info['size']:>8d}B "
              f"max|diff|={info['diff']:.2e} (max|logit|={info['ref_absmax']:.2f}){fn}{idn}")
        if args.ops:
            print("   ops:", dict(sorted(info["ops"].items())))
            print("   opset_import:", info["opset_imports"])

    for spec in BENCH_SPECS if args.bench else SPECS:
        if args.only and spec.name not in args.only:
            continue
        model = build(spec)
        units = compute_units(model, spec)

        file = f"{spec.name}.onnx"
        path = os.path.join(args.out, file)
        export_torchscript(model, spec, path)
        record(spec.name, file, spec, "torchscript", model, units, verify(path, model, spec))

        if spec.name == "mlp":
            efile = "mlp_external.onnx"
            epath = os.path.join(args.out, efile)
            write_external_fixture(path, epath)
            info = verify(epath, model, spec, expect_external=True)
            record("mlp_external", efile, spec, "torchscript", model, units, info)

        if spec.dynamo:
            dname = f"{spec.name}_dynamo"
            dfile = f"{dname}.onnx"
            dpath = os.path.join(args.out, dfile)
            export_dynamo(model, spec, dpath)
            record(dname, dfile, spec, "dynamo", model, units, verify(dpath, model, spec))

    if not args.only and not args.bench:
        write_readme(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
