#!/usr/bin/env python3
"""The model-zoo sweep: every torchvision classification model and a set of
``nn.TransformerEncoder`` models, exported as users export them for training,
through ``edgefreeze inspect`` and ``edgefreeze convert``, and the gradient graph
checked against PyTorch.

Usage:
    pip install -r tools/requirements.txt   # torch, torchvision, onnx, onnxruntime
    cargo build --workspace                  # target/debug/edgefreeze
    python3 tools/zoo_sweep.py --out runs/zoo --table docs/coverage.md [--models a,b] [--exporters ts,dynamo]
    python3 tools/zoo_sweep.py --fixtures tests/fixtures/zoo   # the small CI fixtures

For every (model, exporter) this

1. builds the model with random weights (``torch.manual_seed(0)``, 10 classes),
   re-draws the affine parameters and running statistics of every norm layer (the
   constant defaults hide bugs), and sets every Dropout and stochastic-depth
   probability to 0 (the gradient comparison needs a deterministic forward; a
   training-mode Dropout node is still exported);
2. exports it in training mode: TorchScript with ``training=TrainingMode.TRAINING,
   opset_version=17 (`--ts-opset`), do_constant_folding=False`` and a dynamic batch axis, or dynamo
   with ``dynamic_shapes`` (batch) and ``optimize=False``;
3. runs ``edgefreeze inspect`` and ``edgefreeze convert`` (wall time and peak
   resident memory of the process, from ``wait4``);
4. runs ``grad.onnx`` on ONNX Runtime (CPU) with the model's parameters, a fixed
   random batch and its labels, and compares the loss and every parameter gradient
   with PyTorch's in float64 (the truth); PyTorch's own float32 run on the same
   batch is the noise floor. A tensor passes when its relative L2 error is at most
   ``max(C * torch_f32_error, floor)`` where ``C`` = ``ERROR_MULTIPLE`` and the floor
   is ``FLOOR_EPS`` times the largest gradient norm of the model over the tensor's norm
   (gradients that are zero in exact arithmetic);

and writes one row per (model, exporter) to the coverage table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")

# Both are float32 implementations of the same arithmetic with different summation
# orders, so their errors against the float64 truth are of the same size; 16 leaves room
# for the (random-walk) spread of rounding between two orders.
ERROR_MULTIPLE = 16.0
# Absolute floor, relative to the largest gradient norm of the model: a few float32
# epsilons (2^-23 ≈ 1.2e-7) of accumulated round-off.
FLOOR_EPS = 64 * 2.0 ** -23
NUM_CLASSES = 10
BATCH = 4
# --side: the input side of this run instead of the table's (None: the table's).
SIDE = None
# --ts-opset: the TorchScript exporter's opset_version (17 unless a run asks otherwise; 13 gives
# the five-output training-mode BatchNormalization of opsets 9 to 13).
TS_OPSET = 17
DATA_SEED = 1234

# (name, input side) -- the smallest input each architecture accepts, 64x64 where it works.
TORCHVISION = [
    ("alexnet", 64), ("vgg11_bn", 64), ("resnet18", 64), ("resnet50", 64),
    ("resnext50_32x4d", 64), ("wide_resnet50_2", 64), ("densenet121", 64),
    ("squeezenet1_0", 64), ("squeezenet1_1", 64), ("shufflenet_v2_x0_5", 64),
    ("shufflenet_v2_x1_0", 64), ("mobilenet_v2", 64), ("mobilenet_v3_small", 64),
    ("mobilenet_v3_large", 64), ("mnasnet0_5", 64), ("mnasnet1_0", 64),
    ("efficientnet_b0", 64), ("efficientnet_v2_s", 64), ("regnet_x_400mf", 64),
    ("regnet_y_400mf", 64), ("googlenet", 64), ("inception_v3", 75),
    ("convnext_tiny", 64), ("vit_b_16", 224), ("swin_t", 64), ("maxvit_t", 224),
]
# Run last (or skipped with --skip-big) on a small machine.
BIG = {"vit_b_16", "maxvit_t", "vgg11_bn", "wide_resnet50_2", "alexnet"}

# nn.TransformerEncoder variants: (name, batch_first, norm_first, activation, key padding mask)
TRANSFORMERS = [
    (f"tfenc_{'bf' if bf else 'sf'}_{'pre' if nf else 'post'}_{act}{'_mask' if mask else ''}", bf, nf, act, mask)
    for bf in (True, False) for nf in (True, False) for act in ("relu", "gelu") for mask in (False, True)
]
SEQ, D_MODEL, HEADS, FF, LAYERS, VOCAB = 8, 16, 2, 32, 2, 50


class EncoderClassifier(nn.Module):
    """Token embedding, an nn.TransformerEncoder, mean pooling and a linear head."""

    def __init__(self, batch_first, norm_first, activation, mask):
        super().__init__()
        self.batch_first, self.mask = batch_first, mask
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.0, activation=activation,
                                           batch_first=batch_first, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, NUM_CLASSES)

    def forward(self, tokens):
        h = self.embed(tokens)
        padding = tokens == 0 if self.mask else None
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.encoder(h, src_key_padding_mask=padding)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return self.head(h.mean(dim=1))


# Hugging Face `transformers` sequence classifiers (random weights from a small config; the
# hub is not reachable here and not needed): the models most people bring for text. Each
# takes token ids only, as `model(input_ids=...)` does, so the model builds its own
# attention mask and position ids. Sizes: hidden 16, 2 layers, 2 heads, vocabulary VOCAB.
HUGGINGFACE = ["hf_bert", "hf_distilbert", "hf_roberta", "hf_albert", "hf_electra", "hf_gpt2", "hf_llama"]


class TokensToLogits(nn.Module):
    """`model(input_ids=tokens).logits`: one tensor in, one out, as the exporters want."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, tokens):
        return self.m(input_ids=tokens).logits


def huggingface(name: str) -> nn.Module:
    import transformers as T

    common = dict(vocab_size=VOCAB, num_labels=NUM_CLASSES)
    # Dropout off in the config too: attention dropout is a float passed to the attention
    # function, not an nn.Dropout that zero_stochastic would find.
    bert_like = dict(hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=FF, max_position_embeddings=2 * SEQ, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, classifier_dropout=0.0, **common)
    kind = name[len("hf_"):]
    if kind == "bert":
        return T.BertForSequenceClassification(T.BertConfig(**bert_like))
    if kind == "roberta":
        # RoBERTa's position ids start after its padding index (1): two more positions.
        return T.RobertaForSequenceClassification(T.RobertaConfig(**{**bert_like, "max_position_embeddings": 2 * SEQ + 2}))
    if kind == "electra":
        return T.ElectraForSequenceClassification(T.ElectraConfig(embedding_size=D_MODEL // 2, **bert_like))
    if kind == "albert":
        return T.AlbertForSequenceClassification(T.AlbertConfig(embedding_size=D_MODEL // 2, **bert_like))
    if kind == "distilbert":
        return T.DistilBertForSequenceClassification(T.DistilBertConfig(
            dim=D_MODEL, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FF, max_position_embeddings=2 * SEQ,
            dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, **common))
    if kind == "gpt2":
        # The classifier reads the last token that is not padding (id 0).
        return T.GPT2ForSequenceClassification(T.GPT2Config(
            n_embd=D_MODEL, n_layer=LAYERS, n_head=HEADS, n_positions=2 * SEQ, pad_token_id=0, bos_token_id=1,
            eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common))
    if kind == "llama":
        # Rotary position embeddings, RMSNorm, SiLU-gated MLP; as many key-value heads as
        # heads (TorchScript cannot export grouped-query attention).
        return T.LlamaForSequenceClassification(T.LlamaConfig(
            hidden_size=D_MODEL, intermediate_size=FF, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=HEADS, max_position_embeddings=2 * SEQ, pad_token_id=0, bos_token_id=1,
            eos_token_id=1, attention_dropout=0.0, **common))
    raise KeyError(name)


# timm (pytorch-image-models) architectures that torchvision does not have, random
# weights, 10 classes: (name, input side). CNNs at 64; models whose patch grid or windows
# fix the input at the side timm accepts smallest.
TIMM = [
    ("resnet18d", 64), ("resnest14d", 64), ("skresnet18", 64), ("res2net50_14w_8s", 64), ("dla34", 64),
    ("cspdarknet53", 64), ("dpn68", 64), ("repvgg_a0", 64), ("regnetx_002", 64), ("rexnet_100", 64),
    ("mixnet_s", 64), ("lcnet_050", 64), ("tinynet_e", 64), ("ghostnet_100", 64), ("mobilenetv4_conv_small", 64),
    ("hrnet_w18_small", 64), ("nf_resnet26", 64), ("hgnetv2_b0", 64), ("convnext_atto", 64),
    ("inception_next_atto", 64), ("edgenext_xx_small", 64), ("poolformer_s12", 64), ("mobilevit_xxs", 64),
    ("mobilevitv2_050", 64), ("fastvit_t8", 64), ("efficientvit_b0", 64), ("starnet_s1", 64),
    ("vit_tiny_patch16_224", 64), ("deit_tiny_patch16_224", 64), ("levit_128s", 224), ("pvt_v2_b0", 64),
    ("xcit_nano_12_p16_224", 64), ("tiny_vit_5m_224", 224), ("mambaout_femto", 64),
]


# torchvision's segmentation models (bilinear upsampling: Resize in linear mode), random
# weights, 10 classes, through a head that averages each class's map to one logit, so that
# the classification loss reaches every pixel; and its video classifiers (Conv3d,
# BatchNorm3d, 3-D pooling) on clips of 4 frames: (name, input side). Family `segpx_`: the
# same segmentation models with the loss they train with, per-pixel cross-entropy on their
# `out` map [N, 10, H, W] (`MapsOut`), about 10% of the labels SEG_IGNORE (see LOSSES).
SEGMENTATION = [("fcn_resnet50", 64), ("deeplabv3_mobilenet_v3_large", 64), ("deeplabv3_resnet50", 64),
                ("lraspp_mobilenet_v3_large", 64)]
# (S3D is left out: its last pooling needs clips of 16 frames at 224×224, too large for
# this machine's float64 reference.)
VIDEO = [("r3d_18", 32), ("mc3_18", 32), ("r2plus1d_18", 32)]
FRAMES = {}  # frames per clip where not 4


class MapsToLogits(nn.Module):
    """A segmentation model's per-pixel class scores, averaged over the image."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"].mean(dim=(2, 3))


class MapsOut(nn.Module):
    """A segmentation model's per-pixel class scores [N, C, H, W] (its `out` map)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


class ResizeMini(nn.Module):
    """The Resize modes torchvision and timm models write beyond nearest upsampling by whole
    numbers: bilinear (align_corners False and True), bicubic, nearest to a fractional size,
    a bilinear downsampling, in one small network."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1)
        self.conv3 = nn.Conv2d(6, 6, 3, padding=1)
        self.fc = nn.Linear(6, NUM_CLASSES)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        x = F.gelu(self.conv2(x))
        x = F.interpolate(x, size=(11, 13), mode="bilinear", align_corners=True)
        x = F.interpolate(x, scale_factor=1.5, mode="bicubic", align_corners=False)
        x = F.gelu(self.conv3(x))
        x = F.interpolate(x, size=(7, 9), mode="nearest")
        x = F.interpolate(x, scale_factor=0.5, mode="bilinear", align_corners=False)
        return self.fc(x.mean(dim=(2, 3)))


def timm_model(name: str, side: int) -> nn.Module:
    import timm

    for kwargs in ({"img_size": side}, {}):
        try:
            return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kwargs)
        except TypeError:
            continue
    raise RuntimeError(f"timm cannot build {name}")


def squeezenet_mini():
    """SqueezeNet 1.1's layers (torchvision's Fire modules, ceil-mode pooling, Dropout, a
    convolutional classifier) at a quarter of the width, to keep a CI fixture small."""
    from torchvision.models.squeezenet import Fire

    final = nn.Conv2d(32, NUM_CLASSES, kernel_size=1)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 16, kernel_size=3, stride=2), nn.ReLU(inplace=True),
                      nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True), Fire(16, 4, 8, 8), Fire(16, 4, 8, 8),
                      nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True), Fire(16, 8, 16, 16)),
        nn.Sequential(nn.Dropout(p=0.5), final, nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1))),
        nn.Flatten())


class OpsMini(nn.Module):
    """The ops timm models brought, in one small network: GroupNorm (InstanceNormalization),
    nearest upsampling (Resize), a learned map repeated over the batch (Tile with the batch
    as its count) and F.normalize (ReduceL2)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pos = nn.Parameter(0.1 * torch.randn(1, 8, 1, 1))
        self.fc = nn.Linear(8, NUM_CLASSES)

    def forward(self, x):
        x = F.gelu(self.norm(self.conv1(x)))
        x = self.conv2(self.up(x)) + self.pos.repeat(x.shape[0], 1, 1, 1)
        x = F.normalize(x.mean(dim=(2, 3)), dim=1) * 4.0
        return self.fc(x)


SEG_CLASSES = 5
# The label of the pixels seg_mini's loss leaves out (cross-entropy's ignore_index).
SEG_IGNORE = 255


class SegMini(nn.Module):
    """A tiny segmentation network: conv-BN-ReLU at full resolution, a stride-2 conv-BN-ReLU,
    another conv-BN-ReLU, a 1x1 class-score conv and a bilinear upsampling (align_corners
    False) back to the input's size: per-pixel logits [N, SEG_CLASSES, H, W], trained with a
    per-pixel cross-entropy that ignores the label SEG_IGNORE (see LOSSES)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.head = nn.Conv2d(16, SEG_CLASSES, 1)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        return F.interpolate(self.head(x), scale_factor=2.0, mode="bilinear", align_corners=False)


def small_model(name: str):
    """The reduced-width torchvision models of the CI fixtures."""
    from torchvision.models import ShuffleNetV2
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

    if name == "squeezenet_mini":
        return squeezenet_mini()
    if name == "ops_mini":
        return OpsMini()
    if name == "resize_mini":
        return ResizeMini()
    if name == "seg_mini":
        return SegMini()
    if name == "shufflenet_v2_mini":
        return ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=NUM_CLASSES)
    if name == "mobilenet_v3_small_025":
        setting, last = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.25)
        return MobileNetV3(setting, last, num_classes=NUM_CLASSES)
    if name == "efficientnet_b0_025":
        setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
        return EfficientNet(setting, 0.2, num_classes=NUM_CLASSES, last_channel=last)
    if name == "swin_mini":
        from torchvision.models import SwinTransformer

        # Swin-T's blocks (shifted windows, relative-position bias, patch merging) at
        # width 8, two stages of one block each, 2×2 windows.
        return SwinTransformer([4, 4], 8, [2, 2], [1, 2], [2, 2], num_classes=NUM_CLASSES,
                               stochastic_depth_prob=0.0)
    if name == "convnext_mini":
        from torchvision.models.convnext import CNBlockConfig, ConvNeXt

        return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=NUM_CLASSES)
    raise KeyError(name)


# CI fixtures: (model, exporter, input side); together they cover every op family the
# sweep needed (see tests/fixtures/zoo/README.md).
FIXTURES = [
    ("squeezenet_mini", "ts", 64),
    ("shufflenet_v2_mini", "dynamo", 64),
    ("mobilenet_v3_small_025", "ts", 64),
    ("mobilenet_v3_small_025", "dynamo", 64),
    ("efficientnet_b0_025", "ts", 64),
    ("swin_mini", "ts", 32),
    ("swin_mini", "dynamo", 32),
    ("convnext_mini", "dynamo", 32),
    ("tfenc_bf_pre_gelu", "ts", None),
    ("tfenc_bf_pre_gelu_mask", "dynamo", None),
    ("tfenc_sf_post_relu_mask", "ts", None),
    # Hugging Face transformers: GatherElements (BERT's token types), CumSum (RoBERTa's
    # position ids, int64 on tract), IsNaN and SplitToSequence (dynamo's attention and
    # GPT-2's fused QKV), Trilu (GPT-2's causal mask), Sin and Cos (Llama's rotary embeddings).
    # GroupNorm, nearest upsampling, a map repeated over the batch and F.normalize, as the
    # timm sweep met them (InstanceNormalization, Resize, Tile, ReduceL2).
    ("ops_mini", "ts", 16),
    ("ops_mini", "dynamo", 16),
    # Bilinear, bicubic and fractional nearest Resize (segmentation models' upsampling).
    ("resize_mini", "ts", 16),
    ("resize_mini", "dynamo", 16),
    # Per-pixel cross-entropy with ignored pixels (segmentation training): logits
    # [N, 5, 16, 16] against int64 labels [N, 16, 16], about 10% of them SEG_IGNORE.
    ("seg_mini", "ts", 16),
    ("seg_mini", "dynamo", 16),
    ("hf_bert", "ts", None),
    ("hf_roberta", "dynamo", None),
    ("hf_gpt2", "ts", None),
    ("hf_gpt2", "dynamo", None),
    ("hf_llama", "dynamo", None),
]
FIXTURE_SIDES = {name: side for name, _, side in FIXTURES if side}
# The loss of the models that are not trained with plain cross-entropy on class labels [N]:
# what the fixture's json records under "loss_function" (absent: plain cross-entropy).
LOSSES = {"seg_mini": {"kind": "cross-entropy", "ignore_index": SEG_IGNORE}}
LOSSES.update({f"segpx_{n}": {"kind": "cross-entropy", "ignore_index": SEG_IGNORE} for n, _ in SEGMENTATION})


def make_labels(name: str, x: torch.Tensor, seed: int) -> torch.Tensor:
    """The labels of a model's batch: class labels [N] in 0..NUM_CLASSES from
    RandomState(seed), or for seg_mini (segpx_*) per-pixel labels [N, H, W] in
    0..SEG_CLASSES (0..NUM_CLASSES) with about 10% of the pixels SEG_IGNORE."""
    rs = np.random.RandomState(seed)
    if name == "seg_mini" or name.startswith("segpx_"):
        dims = (x.shape[0], x.shape[2], x.shape[3])
        y = rs.randint(0, SEG_CLASSES if name == "seg_mini" else NUM_CLASSES, size=dims)
        y[rs.random_sample(dims) < 0.1] = SEG_IGNORE
        return torch.from_numpy(y.astype(np.int64))
    return torch.from_numpy(rs.randint(0, NUM_CLASSES, size=(x.shape[0],)).astype(np.int64))


def criterion(logits: torch.Tensor, y: torch.Tensor, loss=None) -> torch.Tensor:
    """PyTorch's loss for a LOSSES entry (None: plain cross-entropy, mean over the batch)."""
    if loss is None:
        return F.cross_entropy(logits, y)
    assert loss["kind"] == "cross-entropy", loss
    return F.cross_entropy(logits, y, ignore_index=loss.get("ignore_index", -100))


def loss_option(loss) -> list:
    """`edgefreeze convert`'s --loss for a LOSSES entry ([] for the default)."""
    if loss is None:
        return []
    assert loss["kind"] == "cross-entropy", loss
    return ["--loss", f"cross-entropy:ignore={loss['ignore_index']}"] if "ignore_index" in loss else []


def build(name: str, seed: int = DATA_SEED):
    """The module and its example input (batch BATCH)."""
    torch.manual_seed(0)
    if name in FIXTURE_SIDES:
        model = small_model(name)
        redraw_norms(model)
        rs = np.random.RandomState(seed)
        side = FIXTURE_SIDES[name]
        return model, torch.from_numpy(rs.standard_normal((BATCH, 3, side, side)).astype(np.float32))
    if name.startswith("timm_"):
        side = SIDE or dict(TIMM)[name[len("timm_"):]]
        model = timm_model(name[len("timm_"):], side)
        redraw_norms(model)
        rs = np.random.RandomState(seed)
        return model, torch.from_numpy(rs.standard_normal((BATCH, 3, side, side)).astype(np.float32))
    if name.startswith(("seg_", "segpx_", "video_")):
        import torchvision

        family, base = name.split("_", 1)
        side = SIDE or dict(SEGMENTATION + VIDEO)[base]
        kwargs = {"weights": None, "num_classes": NUM_CLASSES}
        if family in ("seg", "segpx"):
            kwargs["weights_backbone"] = None
        model = torchvision.models.get_model(base, **kwargs)
        if family in ("seg", "segpx"):
            model = (MapsToLogits if family == "seg" else MapsOut)(model)
        redraw_norms(model)
        rs = np.random.RandomState(seed)
        dims = (BATCH, 3, side, side) if family in ("seg", "segpx") else (BATCH, 3, FRAMES.get(base, 4), side, side)
        return model, torch.from_numpy(rs.standard_normal(dims).astype(np.float32))
    if name.startswith("hf_"):
        model = TokensToLogits(huggingface(name))
        redraw_norms(model)
        rs = np.random.RandomState(seed)
        tokens = rs.randint(2, VOCAB, size=(BATCH, SEQ))
        if name in ("hf_gpt2", "hf_llama"):
            tokens[1:, -2:] = 0  # padded tails: the classifier reads the last real token
        return model, torch.from_numpy(tokens.astype(np.int64))
    if name.startswith("tfenc_"):
        spec = next(t for t in TRANSFORMERS if t[0] == name)
        model = EncoderClassifier(*spec[1:])
        rs = np.random.RandomState(seed)
        tokens = rs.randint(1, VOCAB, size=(BATCH, SEQ))
        tokens[:, -2:] = 0 if spec[4] else tokens[:, -2:]  # padded tails when masked
        return model, torch.from_numpy(tokens.astype(np.int64))
    import torchvision

    side = SIDE or dict(TORCHVISION)[name]
    kwargs = {"weights": None, "num_classes": NUM_CLASSES}
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    if name == "vit_b_16":
        kwargs["image_size"] = side
    if name == "maxvit_t":
        kwargs["input_size"] = (side, side)
    model = torchvision.models.get_model(name, **kwargs)
    redraw_norms(model)
    rs = np.random.RandomState(seed)
    x = torch.from_numpy(rs.standard_normal((BATCH, 3, side, side)).astype(np.float32))
    return model, x


def redraw_norms(model: nn.Module):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None:
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(1 + 0.2 * torch.rand(m.running_var.shape, generator=g))


def zero_stochastic(model: nn.Module) -> int:
    """Sets Dropout and stochastic depth to p = 0; returns how many modules were changed."""
    from torchvision.ops import StochasticDepth

    n = 0
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or isinstance(m, StochasticDepth):
            m.p = 0.0
            n += 1
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
        for attr in ("attention_dropout", "dropout", "stochastic_depth_prob"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return n


# --fixed-batch: export as users do by default, with one sample and no dynamic batch axis
# (the import makes the batch variable again; the gradient check still runs at --batch).
FIXED_BATCH = False


def export(model: nn.Module, x: torch.Tensor, exporter: str, path: str):
    model.train()
    if FIXED_BATCH:
        # Still in training mode, without constant folding or the optimizer: their folding
        # of BatchNorm is another matter (see docs/coverage.md, "Exported with defaults").
        if exporter == "ts":
            torch.onnx.export(model, (x[:1],), path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                              opset_version=TS_OPSET, do_constant_folding=False)
        else:
            program = torch.onnx.export(model, (x[:1],), dynamo=True, optimize=False, verify=False, report=False)
            proto = program.model_proto
            for node in proto.graph.node:
                del node.metadata_props[:]
                node.doc_string = ""
            onnx.save_model(proto, path, save_as_external_data=False)
        return
    if exporter == "ts":
        torch.onnx.export(model, (x,), path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          opset_version=TS_OPSET, do_constant_folding=False, input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    else:
        batch = torch.export.Dim("batch", min=2, max=4096)
        program = torch.onnx.export(model, (x,), dynamo=True, input_names=["input"], output_names=["logits"],
                                    dynamic_shapes=({0: batch},), optimize=False, verify=False, report=False)
        proto = program.model_proto
        # Node metadata (source locations, FX names) is most of a small model's bytes.
        for node in proto.graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
        onnx.save_model(proto, path, save_as_external_data=False)


# ---------------------------------------------------------------------------
# PyTorch references
# ---------------------------------------------------------------------------


def torch_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype, logits_out=None, loss=None):
    """PyTorch's loss and parameter gradients in `dtype`; `loss` is a LOSSES entry (None:
    plain cross-entropy)."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    xin = x if x.dtype == torch.int64 else x.to(dtype)
    logits = m(xin)
    if logits_out is not None:
        logits_out.append(logits.detach().to(torch.float64).numpy())
    loss = criterion(logits, y, loss)
    loss.backward()
    grads = {n: p.grad.detach().to(torch.float64).numpy().copy() for n, p in m.named_parameters()
             if p.grad is not None}
    return float(loss.item()), grads


PERTURBATION = 1e-6
# A float64 gradient that moves more than this when the input moves by PERTURBATION
# (relative) is not smooth at the batch: kinks (ReLU at 0, max-pool ties) lie within
# float32 rounding, and no float32 evaluation, PyTorch's included, is reliable there.
KINK_LIMIT = 100 * PERTURBATION


def kink_sensitivity(model, x, y, g64, loss=None):
    """Largest relative change of a float64 gradient (of tensors above 1e-3 of the largest
    norm) when the input is scaled elementwise by 1 + PERTURBATION * N(0, 1): about
    PERTURBATION for a smooth loss. Token inputs cannot be perturbed: 0."""
    if x.dtype == torch.int64:
        return 0.0
    gen = torch.Generator().manual_seed(3)
    xp = x.double() * (1 + PERTURBATION * torch.randn(x.shape, generator=gen, dtype=torch.float64))
    _, moved = torch_grads(model, xp, y, torch.float64, loss=loss)
    top = max(float(np.linalg.norm(g.ravel())) for g in g64.values())
    return max(rel_l2(moved[n], g)[0] for n, g in g64.items() if np.linalg.norm(g.ravel()) > 1e-3 * top)


# A max-pool window whose two largest inputs (float64) are closer than this many times the
# float32 forward error of the pool's input (PyTorch's float32 forward against its float64
# one, the largest over the tensor) is a near-tie: which position wins in float32 is decided
# by rounding, and the whole window's gradient goes to the one that wins.
NEAR_TIE_MULTIPLE = 1.0


def pool_near_ties(model, x):
    """Max-pool windows (``nn.MaxPool2d`` modules) whose argmax float32 cannot decide: the gap
    between the window's largest and second-largest input in float64 is positive (exact ties
    are the rule's business: first maximum, as PyTorch) and at most NEAR_TIE_MULTIPLE times
    the float32 forward error of the pool's input. Returns {"windows": count, "pools": pools
    with a near-tie, "closest": (module, gap, float32 error) of the smallest gap/error}."""
    if x.dtype == torch.int64:
        return {"windows": 0, "pools": [], "closest": None}
    # The pool inputs of a float64 and a float32 copy, by module name.
    inputs = {"f64": {}, "f32": {}}
    modules = {}

    def record(seen, name):
        def hook(_mod, inp, _out):
            seen[name] = inp[0].detach().to(torch.float64).clone()
        return hook

    for tag, dtype in (("f64", torch.float64), ("f32", torch.float32)):
        m = copy.deepcopy(model).to(dtype)
        m.train()
        for name, mod in m.named_modules():
            if isinstance(mod, nn.MaxPool2d):
                mod.register_forward_hook(record(inputs[tag], name))
                modules[name] = mod
        with torch.no_grad():
            m(x.to(dtype))
    count, pools, closest = 0, [], None
    for name, a64 in inputs["f64"].items():
        mod = modules[name]
        noise = float((inputs["f32"][name] - a64).abs().max())
        k, s, p, d = (nn.modules.utils._pair(v) for v in (mod.kernel_size, mod.stride or mod.kernel_size,
                                                          mod.padding, mod.dilation))
        pads = []
        for axis in (1, 0):  # F.pad's order: last axis first
            size = a64.shape[2 + axis]
            reach = d[axis] * (k[axis] - 1) + 1
            span = size + 2 * p[axis] - reach
            out = (-(-span // s[axis]) if mod.ceil_mode else span // s[axis]) + 1
            if mod.ceil_mode and (out - 1) * s[axis] >= size + p[axis]:
                out -= 1
            pads += [p[axis], max(0, (out - 1) * s[axis] + reach - size - 2 * p[axis]) + p[axis]]
        padded = F.pad(a64, pads, value=float("-inf"))
        cols = F.unfold(padded, k, dilation=d, stride=s)  # [N, C*kh*kw, L]
        cols = cols.reshape(a64.shape[0], a64.shape[1], k[0] * k[1], -1)
        if cols.shape[2] < 2:
            continue
        top = cols.topk(2, dim=2).values
        gap = top[:, :, 0] - top[:, :, 1]
        near = (gap > 0) & (gap <= NEAR_TIE_MULTIPLE * noise) & torch.isfinite(gap)
        if near.any():
            count += int(near.sum())
            pools.append(name)
            g = float(gap[near].min())
            if closest is None or g / noise < closest[1] / closest[2]:
                closest = (name, g, noise)
    return {"windows": count, "pools": pools, "closest": closest}


def rel_l2(a, ref):
    d = float(np.linalg.norm((np.asarray(a, np.float64) - ref).ravel()))
    n = float(np.linalg.norm(ref.ravel()))
    return d / n if n > 0 else (0.0 if d == 0 else float("inf")), d, n


def onnx_param_names(model_path: str, torch_names):
    """ONNX initializer name of each PyTorch parameter (exporters keep the qualified name,
    dynamo sometimes with dots replaced)."""
    names = {t.name for t in onnx.load(model_path, load_external_data=False).graph.initializer}
    out = {}
    for n in torch_names:
        for cand in (n, n.replace(".", "_"), "p_" + n.replace(".", "_")):
            if cand in names:
                out[n] = cand
                break
    return out


def grad_feeds(input_names, model_path: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Feeds of grad.onnx's inputs (the model's parameters, its other initializers, the batch
    and labels), and the ONNX name of each PyTorch parameter."""
    params = dict(model.named_parameters())
    mapping = onnx_param_names(model_path, params)
    by_onnx = {v: k for k, v in mapping.items()}
    inits = {t.name: t for t in onnx.load(model_path).graph.initializer}
    feeds = {}
    for name in input_names:
        if name == "labels":
            feeds[name] = y.numpy()
        elif name == "dropout_seed":
            feeds[name] = np.array(7, dtype=np.int64)
        elif name in by_onnx:
            feeds[name] = params[by_onnx[name]].detach().numpy().astype(np.float32)
        elif name in inits:
            feeds[name] = onnx.numpy_helper.to_array(inits[name])
        else:
            feeds[name] = x.numpy()
    return feeds, mapping


def grads_by_torch_name(got: dict, mapping):
    by_onnx = {v: k for k, v in mapping.items()}
    return {by_onnx[k[5:]]: v for k, v in got.items() if k.startswith("grad.") and k[5:] in by_onnx}


# --engine: where grad.onnx runs. "ort" is ONNX Runtime's Python binding; any other
# engine name (tract, ort:cpu) goes through the engine crate's `run_graph` example,
# built with `cargo build --release -p edgefreeze-engine --example run_graph`.
ENGINE = "ort"
RUN_GRAPH = "target/release/examples/run_graph"


def run_grad(conv_dir: str, model_path: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Loss and gradients of grad.onnx on the sweep's engine, keyed by PyTorch parameter name."""
    graph = os.path.join(conv_dir, "grad.onnx")
    if ENGINE == "ort":
        sess = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
        feeds, mapping = grad_feeds([i.name for i in sess.get_inputs()], model_path, model, x, y)
        outs = sess.run(None, feeds)
        got = dict(zip([o.name for o in sess.get_outputs()], outs))
    else:
        from safetensors.numpy import load_file, save_file

        inputs = [i.name for i in onnx.load(graph, load_external_data=False).graph.input]
        feeds, mapping = grad_feeds(inputs, model_path, model, x, y)
        feeds_path, out_path = os.path.join(conv_dir, "feeds.safetensors"), os.path.join(conv_dir, "out.safetensors")
        save_file({k: np.ascontiguousarray(v) for k, v in feeds.items()}, feeds_path)
        p = subprocess.run([RUN_GRAPH, ENGINE, graph, feeds_path, out_path], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip() or f"run_graph exited with {p.returncode}")
        got = load_file(out_path)
    return float(got["loss"]), grads_by_torch_name(got, mapping), mapping


# In float64, a tensor whose gradient norm is below this fraction of the model's largest is
# zero in exact arithmetic within rounding (a BatchNorm's shift in front of another
# training-mode BatchNorm): its error is measured against the largest norm instead.
F64_ZERO = 1e-6


def eps_as_exported(model: nn.Module) -> nn.Module:
    """A copy whose normalisation epsilons are rounded to float32, as the ONNX file stores
    them (an attribute is a float32): BatchNorm's 1e-5 is 9.99999975e-06 there, which moves
    a float64 gradient by up to 1e-8 relative where a channel's variance is small."""
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
            mod.eps = float(np.float32(mod.eps))
    return m


def f64_check(conv_dir: str, model_path: str, model: nn.Module, x, y, loss=None):
    """Our gradient graph evaluated in float64 (tools/f64_check.py) against PyTorch's float64
    gradients of the model as exported (`eps_as_exported`): (worst error, its tensor,
    seconds). The error of a tensor is its relative L2 error, or for a tensor that is zero
    within rounding (norm below F64_ZERO of the largest) its error's norm over the largest
    norm. Right rules give float64 rounding, about 1e-10 or below, whether or not the model
    is smooth at the batch."""
    import f64_check as f64

    start = time.time()
    loss64, g64 = torch_grads(eps_as_exported(model), x, y, torch.float64, loss=loss)
    grad = onnx.load(os.path.join(conv_dir, "grad.onnx"))
    feeds, mapping = grad_feeds([i.name for i in grad.graph.input], model_path, model, x, y)
    got = f64.run_double(grad, feeds)
    grads = grads_by_torch_name(got, mapping)
    top = max(float(np.linalg.norm(g.ravel())) for g in g64.values())
    errors = [("loss", abs(float(got["loss"]) - loss64) / abs(loss64))]
    for n, ref in g64.items():
        if n not in grads:
            errors.append((n, float("inf")))
            continue
        rel, diff, norm = rel_l2(grads[n], ref)
        errors.append((n, rel if norm > F64_ZERO * top else diff / top))
    worst = max(errors, key=lambda e: e[1])
    return worst[1], worst[0], time.time() - start


def compare(loss, grads, loss64, g64, loss32, g32):
    """Per-tensor verdicts: worst ratio of our error to its tolerance, and failures."""
    top = max(float(np.linalg.norm(g.ravel())) for g in g64.values())
    rows = []
    le = abs(loss - loss64) / abs(loss64)
    lt = max(ERROR_MULTIPLE * abs(loss32 - loss64) / abs(loss64), FLOOR_EPS)
    rows.append(("loss", le, lt))
    for n, ref in g64.items():
        if n not in grads:
            rows.append((n, float("inf"), 0.0))
            continue
        ours, _, norm = rel_l2(grads[n], ref)
        torch_err, _, _ = rel_l2(g32[n], ref)
        floor = FLOOR_EPS * top / norm if norm > 0 else float("inf")
        if norm == 0:
            # analytically zero: compare absolutely against the floor
            ours = float(np.linalg.norm(grads[n].ravel())) / top
            floor = FLOOR_EPS
        rows.append((n, ours, max(ERROR_MULTIPLE * torch_err, floor)))
    return rows


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def run_cli(binary, args, timeout):
    """Runs the CLI under `timeout` and GNU time; returns (completed process, wall seconds,
    peak resident KiB of the CLI, CPU seconds user + system of the CLI). (wait4's ru_maxrss
    is no good here: Linux carries the forking Python's peak across exec.)"""
    start = time.time()
    with tempfile.NamedTemporaryFile("r") as peak:
        p = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", "-o", peak.name, "timeout", str(timeout), binary]
                           + args, capture_output=True, text=True)
        text = peak.read().strip().splitlines()
    fields = text[-1].split() if text else []
    rss = float(fields[0]) if len(fields) == 3 and fields[0].isdigit() else None
    cpu = float(fields[1]) + float(fields[2]) if len(fields) == 3 else None
    return p, time.time() - start, rss, cpu


def first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    msg = lines[-1] if lines else ""
    return msg.replace("|", "\\|")[:300]


def sweep_one(name, exporter, out_dir, binary, timeout, convert_only=False, check_f64=False, check_branches=False):
    row = {"model": name, "exporter": exporter}
    work = os.path.join(out_dir, f"{name}.{exporter}")
    os.makedirs(work, exist_ok=True)
    model_path = os.path.join(work, "model.onnx")
    model, x = build(name)
    zero_stochastic(model)
    try:
        # A timing run reuses an export of the same model at the same batch.
        if not (convert_only and os.path.exists(model_path)):
            export(model, x, exporter, model_path)
    except Exception as exc:  # the exporter's own failure
        row["export"] = f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return row
    row["export"] = "ok"
    row["onnx_mb"] = os.path.getsize(model_path) / 1e6
    row["forward_nodes"] = len(onnx.load(model_path, load_external_data=False).graph.node)
    p, _, _, _ = run_cli(binary, ["inspect", model_path], timeout)
    row["inspect"] = "ok" if p.returncode == 0 else first_line(p.stderr)
    if p.returncode != 0:
        return row
    conv = os.path.join(work, "converted")
    if os.path.exists(conv):
        subprocess.run(["rm", "-rf", conv], check=True)
    loss_spec = LOSSES.get(name)
    p, seconds, rss, cpu = run_cli(binary, ["convert", model_path, "--out", conv] + loss_option(loss_spec), timeout)
    row["convert"] = "ok" if p.returncode == 0 else first_line(p.stderr)
    row["convert_s"] = seconds
    row["convert_cpu_s"] = cpu
    row["binary"] = binary
    row["batch"] = BATCH
    row["memory_by_time"] = True
    row["convert_mb"] = rss / 1024 if rss else None
    if p.returncode != 0:
        return row
    manifest = json.load(open(os.path.join(conv, "manifest.json")))
    row["nodes"] = manifest.get("nodes") or manifest.get("node_counts")
    row["grad_nodes"] = len(onnx.load(os.path.join(conv, "grad.onnx"), load_external_data=False).graph.node)
    row["step_nodes"] = len(onnx.load(os.path.join(conv, "train_step.onnx"), load_external_data=False).graph.node)
    if convert_only:
        return row
    y = make_labels(name, x, DATA_SEED + 1)
    try:
        loss, grads, _ = run_grad(conv, model_path, model, x, y)
    except Exception as exc:
        row["gradient"] = f"{ENGINE} failed: {first_line(str(exc))}"
        return row
    loss64, g64 = torch_grads(model, x, y, torch.float64, loss=loss_spec)
    loss32, g32 = torch_grads(model, x, y, torch.float32, loss=loss_spec)
    rows = compare(loss, grads, loss64, g64, loss32, g32)
    worst = max(rows, key=lambda r: r[1] / r[2] if r[2] > 0 else float("inf"))
    failing = [r for r in rows if not r[1] <= r[2]]
    row["tensors"] = len(rows)
    row["failing"] = len(failing)
    row["worst"] = {"tensor": worst[0], "error": worst[1], "tolerance": worst[2]}
    row["gradient"] = "match" if not failing else f"{len(failing)} of {len(rows)} off"
    row["failing_tensors"] = [r[0] for r in failing][:12]
    if check_f64:
        err, tensor, seconds = f64_check(conv, model_path, model, x, y, loss=loss_spec)
        row["f64"] = {"error": err, "tensor": tensor, "seconds": seconds}
        row["sensitivity"] = kink_sensitivity(model, x, y, g64, loss=loss_spec)
        row["near_ties"] = pool_near_ties(model, x)
    if check_branches:
        row["branch"] = branch_row(conv, model_path, model, x, y, loss=loss_spec)
    return row


def branch_row(conv, model_path, model, x, y, loss=None):
    """`tools/branch_check.py` on one converted model: our float32 gradients against float64
    with our run's ReLU, ReLU6 and max-pool decisions imposed; or why it could not run."""
    import branch_check as bc

    mapping = onnx_param_names(model_path, dict(model.named_parameters()))
    start = time.time()
    try:
        result = bc.branch_check(
            conv, model_path, model, x, y,
            feeds_for=lambda names: grad_feeds(names, model_path, model, x, y)[0],
            grads_from=lambda outs: grads_by_torch_name(outs, mapping),
            torch_grads=lambda *a, **k: torch_grads(*a, loss=loss, **k), compare=compare)
    except Exception as exc:  # a model whose branches cannot be paired, say
        return {"error": f"{type(exc).__name__}: {first_line(str(exc))}"}
    result["seconds"] = time.time() - start
    return result


def fmt(v, spec):
    return "" if v is None else format(v, spec)


FINDINGS_HEADING = "## Findings behind the failing rows"
FINDINGS = FINDINGS_HEADING + """

- **Every row that is off matches on its own branches** (`--branch-check`, the section
  "Float32 on its own branches"): with the float32 run's ReLU, ReLU6 and max-pool decisions
  imposed on PyTorch's float64 model, every tensor of AlexNet, VGG-11-BN, MobileNetV2 and
  MNASNet 0.5 is within the table's tolerance. Float64 decides differently in one max-pool
  window of AlexNet (of 176,640), one ReLU6 input of MobileNetV2 (of 1,993,728; both
  exporters) and one ReLU input of MNASNet 0.5 (of 878,080; both exporters): a single kink
  within rounding moves up to 119 of 159 gradients past the tolerance; VGG-11-BN (224)
  decides three ReLU inputs (of 14,868,480) and one max-pool window (of 3,060,736)
  differently. The smooth controls (ResNet-18, SqueezeNet 1.1) make no decision
  differently and keep their verdicts.
- **MNASNet 0.5, MobileNetV2 (both exporters): the rules match in float64; float32 is off by
  the model's non-smoothness.** Our gradient graph evaluated in float64 (`--f64-check`, the
  section "Our gradient graphs in float64") matches PyTorch's float64 gradients to 2.0e-13
  (MobileNetV2) and 2.3e-13 (MNASNet 0.5) relative, as the smooth controls do (SqueezeNet 1.1
  1.9e-15, ResNet-18 4.4e-12): no rule is wrong. Their float32 rows are off because the
  float64 gradient of these random-weight models is not smooth at the sweep's batch: scaling
  the input by 1 + 1e-6·N(0, 1) moves it by 1.8e-2 (MobileNetV2) and 4.3e-3 (MNASNet 0.5),
  where a smooth model (SqueezeNet 1.1) moves by 1.1e-6. ReLU (ReLU6) inputs lie within
  float32 rounding of a kink, so any float32 evaluation lands on either side. Bisecting
  MNASNet 0.5 per BatchNorm: our forward error is 1.2-1.3x PyTorch float32's at each of the
  52 layers; the first wrong gradient is one ReLU input, 1.3e-5 in float64 (tensor max 4.8),
  which ours rounds to -7.9e-6 and PyTorch's float32 to +5.8e-6. No MNASNet 0.1 batch of ten
  data seeds was smooth (2.4e-4 to 8.9e-2), so MNASNet has no CI fixture.
- **AlexNet (TorchScript, 224): one max-pool near-tie.** The two largest inputs of one
  window of the first MaxPool are 5.4e-8 apart in float64; float32 (ONNX Runtime's conv)
  makes them equal and routes the window's gradient to the other position, moving conv1's
  weight gradient by 5.9e-3. With that routing float64 gives our float32 result to 4.5e-7
  (`tools/alexnet_tie.py`; "The five large models").
- **A measured noise floor as a tolerance: not adopted.** The sensitivity is one sample of
  the gradient's response to a perturbation of the input alone (float32 rounds every
  intermediate too), and it is not small where a model passes: ResNet-18 moves by 5.1e-3
  and matches within 16x PyTorch's own float32 error, so a tolerance of that size would
  hide rule errors up to 1e-3 there. It is reported as a column of the float64 section; the
  float64 check is what separates a wrong rule from float32 noise.
- **GoogLeNet** (fixed): the MaxPool gradient went to every tied maximum; 1x1 convolutions of
  pooled 2x2 maps make spatially constant maps, so all four positions tied.
"""


# A float64 evaluation of our graph within this of PyTorch's float64 gradients is float64
# rounding: the rules are right.
F64_MATCH = 1e-10


def branch_summary(b) -> str:
    """How many branch decisions float64 makes differently from our float32 run."""
    parts = [f"{d['differ']} of {d['total']} {BRANCH_WORDS[k]}" for k, d in sorted(b["decisions"].items())]
    return ", ".join(parts)


BRANCH_WORDS = {"relu": "ReLU inputs", "clip": "ReLU6 inputs", "maxpool": "max-pool windows"}


def gradient_verdict(r) -> str:
    """The gradient column: the float32 verdict, and for a row that is off, what the float64
    check and the branch check found."""
    verdict = r.get("gradient", "")
    b = r.get("branch")
    if b and r.get("failing") and "error" not in b:
        if b["failing"] == 0:
            verdict += (f"; with our float32 run's branches imposed on float64 ({branch_summary(b)} decided "
                        f"differently), every tensor within tolerance (see \"Float32 on its own branches\")")
        else:
            verdict += f"; {b['failing']} of {b['tensors']} off even on our float32 run's own branches"
    f = r.get("f64")
    ties = (r.get("near_ties") or {}).get("windows", 0)
    if f and r.get("failing"):
        if f["error"] <= F64_MATCH and ties:
            name, gap, noise = r["near_ties"]["closest"]
            verdict += (f"; rules match in float64 (err {f['error']:.1e}); float32 off by {ties} max-pool "
                        f"near-tie{'s' if ties > 1 else ''} (in {name}: its two largest inputs {gap:.1e} apart, "
                        f"float32 forward error {noise:.1e}; see \"Findings\")")
        elif f["error"] <= F64_MATCH and r["sensitivity"] > KINK_LIMIT:
            verdict += (f"; rules match in float64 (err {f['error']:.1e}); float32 off by the model's "
                        f"non-smoothness (sensitivity {r['sensitivity']:.1e})")
        elif f["error"] <= F64_MATCH:
            verdict += (f"; rules match in float64 (err {f['error']:.1e}) and the model is smooth "
                        f"(sensitivity {r['sensitivity']:.1e}): our float32 evaluation is less accurate "
                        "than PyTorch's here (see \"The five large models\")")
        else:
            verdict += f"; float64 error {f['error']:.1e} ({f['tensor']}): a rule is wrong"
    return verdict


def write_table(rows, path, command):
    out = ["# Model coverage", "",
           "Every torchvision classification model (random weights, 10 classes) and `nn.TransformerEncoder`",
           "classifiers, exported in training mode by both PyTorch exporters, through `edgefreeze inspect`,",
           "`convert`, and `grad.onnx` on ONNX Runtime (CPU) against PyTorch's float64 gradients. A tensor",
           f"passes when its relative L2 error is at most max({ERROR_MULTIPLE:g} × PyTorch's own float32 error,",
           f"{FLOOR_EPS:.2e} × largest gradient norm / its norm); *worst* is the tensor with the largest",
           "error/tolerance ratio. Convert: wall time of a debug build on a 2-core machine shared with",
           "other builds (not a benchmark); peak resident memory where measured (empty: the run",
           "predates the GNU time measurement). *not run (time)*: the sweep did not reach it.",
           "", "Made by:", "", "```", command, "```", "",
           "| model | exporter | input | inspect | convert | gradient | worst error / tolerance (tensor) | convert s | peak MiB | forward nodes | grad nodes | step nodes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "kept" in r:
            out.append(r["kept"])
            continue
        w = r.get("worst")
        worst = f"{w['error']:.2e} / {w['tolerance']:.2e} ({w['tensor']})" if w else ""
        status = r.get("export") if r.get("export") != "ok" else ""
        out.append("| " + " | ".join([
            r["model"], r["exporter"], str(r.get("input", "")),
            status or r.get("inspect", ""), r.get("convert", "") if r.get("inspect") == "ok" else "",
            gradient_verdict(r), worst, fmt(r.get("convert_s"), ".1f"), fmt(r.get("convert_mb"), ".0f"),
            str(r.get("forward_nodes", "")), str(r.get("grad_nodes", "")), str(r.get("step_nodes", "")),
        ]) + " |")
    old = open(path).read() if os.path.exists(path) else ""
    # Sections written by hand after the table ("The five large models") stay.
    out += hand_written_sections(old)
    out += ["", FINDINGS]
    out += branch_section([r for r in rows if r.get("branch")])
    # The sections other runs wrote (convert times, float64) stay as they are.
    for begin, end in ((TIMES_BEGIN, TIMES_END), (F64_BEGIN, F64_END)):
        if begin in old and end in old.split(begin, 1)[1]:
            out += ["", begin + old.split(begin, 1)[1].split(end, 1)[0] + end]
    open(path, "w").write("\n".join(out) + "\n")


GENERATED_HEADINGS = (FINDINGS_HEADING, "## Float32 on its own branches", "## Convert time", "## Our gradient graphs")


def hand_written_sections(text):
    """The `## ` sections of an existing table that no part of this tool writes, each up to
    the next heading or section marker."""
    out, keep = [], False
    for line in text.split("\n"):
        if line.startswith("## ") or line.startswith("<!-- "):
            keep = line.startswith("## ") and not line.startswith(GENERATED_HEADINGS)
            if keep:
                out.append("")
        if keep:
            out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


def branch_section(rows):
    """The table of the branch checks among `rows` (empty when none ran)."""
    if not rows:
        return []
    out = ["", "## Float32 on its own branches", "",
           "`--branch-check` (tools/branch_check.py) runs `grad.onnx` on ONNX Runtime with the input of every",
           "forward `Relu`, `Clip` and `MaxPool` as extra outputs, decides each branch from those float32 values",
           "as the engines do (ReLU `x > 0`, ReLU6 `0 < x < 6`, the first maximum of a pool window), imposes the",
           "decisions on PyTorch's modules in call order (shapes checked), and holds our float32 gradients to",
           "the table's rule against that imposed model in float64, with the imposed model's own float32 run",
           "as PyTorch's error. *decided differently*: how many of those decisions PyTorch's float64 run of",
           "the unmodified model makes otherwise (0 for a smooth model, whose verdict does not change).", "",
           "| model | exporter | input | float32 gradient | decided differently in float64 | on our branches | worst error / tolerance (tensor) | s |",
           "|---|---|---|---|---|---|---|---:|"]
    for r in rows:
        b = r["branch"]
        if "error" in b:
            out.append(f"| {r['model']} | {r['exporter']} | {r.get('input', '')} | {r.get('gradient', '')} | "
                       f"not run: {b['error']} | | | |")
            continue
        w = b["worst"]
        verdict = "match" if b["failing"] == 0 else f"{b['failing']} of {b['tensors']} off"
        out.append(f"| {r['model']} | {r['exporter']} | {r.get('input', '')} | {r.get('gradient', '')} | "
                   f"{branch_summary(b)} | {verdict} | {w['error']:.2e} / {w['tolerance']:.2e} ({w['tensor']}) | "
                   f"{b['seconds']:.0f} |")
    return out


def write_fixture(name, exporter, out_dir):
    """A CI fixture: the exported model, the batch, PyTorch's float64 loss and gradients
    (stored as float32: their rounding, 6e-8 relative, is far below any tolerance) and
    PyTorch's own float32 error per tensor."""
    from safetensors.numpy import save_file

    # The first data seed at which the loss is smooth (see KINK_LIMIT), else the smoothest
    # of ten.
    loss_spec = LOSSES.get(name)
    tries = []
    for seed in range(DATA_SEED, DATA_SEED + 10):
        model, x = build(name, seed)
        zero_stochastic(model)
        y = make_labels(name, x, seed + 1)
        loss64, g64 = torch_grads(model, x, y, torch.float64, loss=loss_spec)
        sensitivity = kink_sensitivity(model, x, y, g64, loss=loss_spec)
        tries.append((sensitivity, seed))
        if sensitivity <= KINK_LIMIT:
            break
        print(f"{name}: data seed {seed}: float64 gradient moves {sensitivity:.1e} under a {PERTURBATION:g} "
              "input perturbation", flush=True)
    sensitivity, seed = min(tries)
    if seed != tries[-1][1]:
        model, x = build(name, seed)
        zero_stochastic(model)
        y = make_labels(name, x, seed + 1)
        loss64, g64 = torch_grads(model, x, y, torch.float64, loss=loss_spec)
    stem = f"{name}.{exporter}"
    model_path = os.path.join(out_dir, stem + ".onnx")
    export(model, x, exporter, model_path)
    logits = []
    torch_grads(model, x, y, torch.float64, logits, loss=loss_spec)
    loss32, g32 = torch_grads(model, x, y, torch.float32, logits, loss=loss_spec)
    mapping = onnx_param_names(model_path, g64)
    missing = [n for n in g64 if n not in mapping]
    assert not missing, f"{stem}: parameters without an ONNX initializer: {missing}"
    tensors = {"input": x.numpy(), "labels": y.numpy()}
    errors = {}
    for n, ref in g64.items():
        tensors[f"grad/{mapping[n]}"] = ref.astype(np.float32)
        errors[mapping[n]] = rel_l2(g32[n], ref)[0]
    save_file(tensors, os.path.join(out_dir, stem + ".safetensors"))
    os.chmod(os.path.join(out_dir, stem + ".safetensors"), 0o644)
    meta = {
        "model": name, "exporter": exporter, "file": stem + ".onnx", "batch": int(x.shape[0]),
        "input_shape": list(x.shape), "loss": loss64, "loss_float32_error": abs(loss32 - loss64) / abs(loss64),
        # One number can be near zero by chance; the logits' error bounds what the loss's can be.
        "logits_float32_error": rel_l2(logits[1], logits[0])[0],
        "float32_error_per_tensor": errors,
        "gradient_norms": {mapping[n]: float(np.linalg.norm(g.ravel())) for n, g in g64.items()},
        "parameters": [mapping[n] for n in g64], "torch_names": list(g64),
        "data_seed": seed, "kink_sensitivity": sensitivity, "kink_limit": KINK_LIMIT,
        "conditioned": sensitivity <= KINK_LIMIT, "seed_search": [[s, v] for v, s in tries],
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__},
        "command": "python3 tools/zoo_sweep.py --fixtures tests/fixtures/zoo",
    }
    if loss_spec is not None:
        # The loss the gradients are of, for the Rust test to build the same one ("loss" is
        # its float64 value); absent: plain cross-entropy on class labels [N].
        meta["loss_function"] = loss_spec
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    size = sum(os.path.getsize(os.path.join(out_dir, stem + ext)) for ext in (".onnx", ".safetensors", ".json"))
    print(f"{stem}: {size / 1e6:.2f} MB, worst PyTorch float32 error {max(errors.values()):.2e}", flush=True)


TIMES_BEGIN = "<!-- convert times: begin -->"
TIMES_END = "<!-- convert times: end -->"


def write_times(paths, table, command):
    """Writes (or replaces) the section of `table` with the convert time, CPU time and peak
    memory of the runs in `paths` (results.jsonl files of `--convert-only` runs)."""
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in open(path)]
    out = [TIMES_BEGIN, "## Convert time, release build", "",
           "`edgefreeze convert` (all graphs of a training run) of a release build, per (model, exporter):",
           "wall time, CPU time (user + system) and peak resident memory of the process, on the 2-core",
           "machine shared with other builds: CPU time is the figure to read; wall time includes waiting",
           "for a core.", "", "Made by:", "", "```", command, "```", "",
           "| model | exporter | input | convert | wall s | CPU s | peak MiB | forward nodes | step nodes |",
           "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append("| " + " | ".join([
            r["model"], r["exporter"], str(r.get("input", "")),
            r.get("convert", r.get("export", r.get("inspect", ""))),
            fmt(r.get("convert_s"), ".1f"), fmt(r.get("convert_cpu_s"), ".1f"),
            fmt(r["convert_mb"] if r.get("convert_mb") else None, ".0f"),
            str(r.get("forward_nodes", "")), str(r.get("step_nodes", "")),
        ]) + " |")
    out.append(TIMES_END)
    text = open(table).read() if os.path.exists(table) else ""
    if TIMES_BEGIN in text:
        before, rest = text.split(TIMES_BEGIN, 1)
        after = rest.split(TIMES_END, 1)[1] if TIMES_END in rest else ""
        text = before + "\n".join(out) + after
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(out) + "\n"
    open(table, "w").write(text)


F64_BEGIN = "<!-- float64 check: begin -->"
F64_END = "<!-- float64 check: end -->"


def replace_section(table, begin, end, lines):
    """Writes `lines` between the markers `begin` and `end` of `table` (appended if absent)."""
    text = open(table).read() if os.path.exists(table) else ""
    section = "\n".join([begin] + lines + [end])
    if begin in text:
        before, rest = text.split(begin, 1)
        after = rest.split(end, 1)[1] if end in rest else ""
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    open(table, "w").write(text)


def write_f64(paths, table, command):
    """Writes the section of `table` with the float64 evaluation of our gradient graphs
    (rows of `--f64-check` runs)."""
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in open(path) if "f64" in json.loads(line)]
    out = ["## Our gradient graphs in float64", "",
           "`--f64-check` rewrites each `grad.onnx` to float64 (tools/f64_check.py: initializers,",
           "constants, `Cast` targets, value types) and runs it on the ONNX reference evaluator (ONNX",
           "Runtime's CPU kernels have no float64 `Conv`; the evaluator's `Conv` and `ConvTranspose`",
           "are PyTorch's float64 kernels), against PyTorch's float64 gradients of the model as",
           "exported (normalisation epsilons rounded to float32, as the file stores them). *float64",
           "error*: the worst tensor's relative L2 error (for a tensor that is zero within rounding,",
           f"below {F64_ZERO:g} of the largest gradient norm, its error over the largest norm). Right",
           "rules give float64 rounding whatever the model's smoothness. *sensitivity*: the largest",
           f"relative change of the float64 gradient when the input is scaled by 1 + {PERTURBATION:g}·N(0, 1)",
           "(about 1e-6 for a smooth loss): how far apart two float32 evaluations may land.",
           "", "Made by:", "", "```", command, "```", "",
           "| model | exporter | input | batch | float32 gradient | float64 error (tensor) | sensitivity | float64 s |",
           "|---|---|---|---:|---|---|---:|---:|"]
    for r in rows:
        f = r["f64"]
        out.append("| " + " | ".join([
            r["model"], r["exporter"], str(r.get("input", "")), str(r.get("batch", "")), r.get("gradient", ""),
            f"{f['error']:.1e} ({f['tensor']})", f"{r['sensitivity']:.1e}", f"{f['seconds']:.0f}",
        ]) + " |")
    replace_section(table, F64_BEGIN, F64_END, out)


def table_rows(table):
    """The rows of the main table of an existing coverage file, as text keyed by (model,
    exporter): what `--keep-rows` keeps for the pairs no run of this merge reached."""
    rows = {}
    if not os.path.exists(table):
        return rows
    for line in open(table).read().split(FINDINGS_HEADING, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 12 and cells[0] not in ("model", "---"):
            rows[(cells[0], cells[1])] = line
    return rows


def merge_tables(paths, table, command=None, keep_rows=False):
    """One table from the results of several runs, in the sweep's order, with a row for
    every (model, exporter) that no run reached (with `keep_rows`, that row as the existing
    table has it)."""
    kept = table_rows(table) if keep_rows else {}
    found = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        for line in open(path):
            r = json.loads(line)
            if not r.get("memory_by_time"):
                # Runs before GNU time measured it: wait4 had reported the sweep's own peak.
                r["convert_mb"] = None
            found[(r["model"], r["exporter"])] = r
    rows = []
    for name in [t[0] for t in TORCHVISION] + [t[0] for t in TRANSFORMERS]:
        for exporter in ("ts", "dynamo"):
            if (name, exporter) not in found and (name, exporter) in kept:
                rows.append({"kept": kept[(name, exporter)]})
                continue
            rows.append(found.get((name, exporter), {
                "model": name, "exporter": exporter, "export": "not run (time)",
                "input": dict(TORCHVISION).get(name, f"{SEQ} tokens")}))
    write_table(rows, table, command or ("python3 tools/zoo_sweep.py --out runs/zoo --skip-big; parallel runs; then "
                                         "--table-from " + ",".join(paths) + f" --table {table}"))


def main():
    global BATCH, SIDE, TS_OPSET, ENGINE, RUN_GRAPH, FIXED_BATCH
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/zoo")
    ap.add_argument("--table", default=None)
    ap.add_argument("--models", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--bin", default="target/debug/edgefreeze")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--fixtures", default=None, help="write the CI fixtures to this folder instead")
    ap.add_argument("--batch", type=int, default=BATCH, help="samples per batch (export and gradient check)")
    ap.add_argument("--side", type=int, default=None,
                    help="input side of the torchvision models instead of the table's (e.g. 224 where "
                    "TorchScript cannot export an AdaptiveAvgPool2d whose output is not a factor of the input)")
    ap.add_argument("--convert-only", action="store_true",
                    help="time convert only (no gradient check), reusing this folder's exports")
    ap.add_argument("--f64-check", action="store_true",
                    help="also evaluate grad.onnx in float64 (tools/f64_check.py) against PyTorch's float64 "
                    "gradients, and measure the float64 gradient's sensitivity to a 1e-6 input perturbation")
    ap.add_argument("--branch-check", action="store_true",
                    help="also check our float32 gradients against float64 with our run's own ReLU, ReLU6 and "
                    "max-pool decisions imposed (tools/branch_check.py)")
    ap.add_argument("--f64-from", default=None,
                    help="comma-separated results.jsonl files of --f64-check runs: write the float64 section of "
                    "--table")
    ap.add_argument("--ts-opset", type=int, default=17, help="the TorchScript export's opset_version")
    ap.add_argument("--fixed-batch", action="store_true",
                    help="export with one sample and no dynamic batch axis (the exporters' default)")
    ap.add_argument("--engine", default="ort",
                    help="where grad.onnx runs: ort (ONNX Runtime's Python binding, the default) or an engine "
                    "name of edgefreeze (tract, ort:cpu) through --run-graph")
    ap.add_argument("--run-graph", default=RUN_GRAPH,
                    help="the engine crate's run_graph example (cargo build --release -p edgefreeze-engine "
                    "--example run_graph)")
    ap.add_argument("--times-from", default=None,
                    help="comma-separated results.jsonl files of --convert-only runs: write the convert-time "
                    "section of --table")
    ap.add_argument("--keep-rows", action="store_true",
                    help="with --table-from: keep the existing table's row for a pair no listed run reached")
    ap.add_argument("--command", default=None,
                    help="with --table-from or --f64-from: the command line to print under 'Made by'")
    ap.add_argument("--table-from", default=None,
                    help="comma-separated results.jsonl files of earlier (possibly parallel) runs: only write --table")
    args = ap.parse_args()
    BATCH = args.batch
    SIDE = args.side
    TS_OPSET = args.ts_opset
    ENGINE = args.engine
    FIXED_BATCH = args.fixed_batch
    RUN_GRAPH = args.run_graph
    if args.times_from:
        write_times(args.times_from.split(","), args.table,
                    f"python3 tools/zoo_sweep.py --bin target/release/edgefreeze --convert-only --out <dir>; "
                    f"then --times-from {args.times_from} --table {args.table}")
        return
    if args.f64_from:
        write_f64(args.f64_from.split(","), args.table, args.command or
                  "python3 tools/zoo_sweep.py --f64-check --out runs/f64 --models mobilenet_v2,mnasnet0_5; "
                  "... --models resnet18,squeezenet1_1 --exporters ts; ... --f64-check --out runs/big224f --batch 2 "
                  "--side 224 --models alexnet,vgg11_bn --exporters ts; "
                  f"then --f64-from {args.f64_from} --table {args.table}")
        return
    if args.table_from:
        merge_tables(args.table_from.split(","), args.table, args.command, args.keep_rows)
        return
    torch.set_num_threads(2)
    if args.fixtures:
        os.makedirs(args.fixtures, exist_ok=True)
        wanted = set(args.models.split(",")) if args.models else None
        for name, exporter, _ in FIXTURES:
            if wanted is None or name in wanted:
                write_fixture(name, exporter, args.fixtures)
        return
    names = [t[0] for t in TORCHVISION] + [t[0] for t in TRANSFORMERS] + HUGGINGFACE
    if args.models:
        names = [n for n in args.models.split(",") if n]
    if args.skip_big:
        names = [n for n in names if n not in BIG]
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    rows = []
    for name in names:
        for exporter in args.exporters.split(","):
            t0 = time.time()
            try:
                row = sweep_one(name, exporter, args.out, args.bin, args.timeout, args.convert_only, args.f64_check,
                                args.branch_check)
            except Exception as exc:
                # Where it failed is not known: claim no step passed.
                row = {"model": name, "exporter": exporter,
                       "export": f"sweep error: {type(exc).__name__}: {first_line(str(exc))}"}
                traceback.print_exc()
            sides = (dict(TORCHVISION) | {f"timm_{n}": v for n, v in TIMM} | {f"seg_{n}": v for n, v in SEGMENTATION}
                     | {f"segpx_{n}": v for n, v in SEGMENTATION}
                     | {f"video_{n}": f"{FRAMES.get(n, 4)}×{v}" for n, v in VIDEO} | FIXTURE_SIDES)
            row["input"] = (SIDE if SIDE and name in sides else None) or sides.get(name, f"{SEQ} tokens")
            row["sweep_s"] = time.time() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(results_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    if args.table:
        write_table(rows, args.table, "python3 tools/zoo_sweep.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
