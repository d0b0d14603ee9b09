#!/usr/bin/env python3
"""Same-recipe PyTorch training baseline for the edgefreeze Rust trainer.

Usage:
    python3 tools/train_pytorch.py --onnx models/lenet5.onnx --epochs 5 \\
        --batch 128 --lr 0.05 --schedule cosine

Trains one of the 1x28x28 reference models (``lenet5``, ``resnet20_28``,
``mlp``) on Fashion-MNIST, or the segmentation model ``fcn_28`` on its
segmentation variant (``--data fashion-mnist-seg``, the Rust dataset of that
name), with the recipe of the Rust trainer, so that both trainers can be
compared run for run:

* initial weights: *every* parameter and BatchNorm buffer (running mean/var)
  of the PyTorch module (built with ``tools/export_models.py``) is loaded from
  the ONNX initializer of the same name; a missing initializer or a shape /
  dtype mismatch is a hard error.  Unless ``--no-check-ort``, the loaded module
  (eval mode) is checked against onnxruntime on a few test images;
* inputs: ``x = (pixel / 255 - mean) / std`` where ``mean`` and ``std``
  (population std, ddof=0) are computed in float64 over all pixels of the full
  training split (also with ``--limit``); the test split uses the train
  statistics.  The float64 values are cast to float32 per pixel value;
* every epoch the (optionally ``--limit``-ed) training set is shuffled with a
  seeded generator and cut into batches of ``--batch``; the last partial batch
  is kept;
* loss: mean cross-entropy (``--label-smoothing``);
* ``--data fashion-mnist-seg``: the same normalised images, labelled per pixel
  (pixel value ``p >= 32``: the image's class, ``p == 0``: 10, background,
  else 255, unlabelled); logits ``[N, 11, 28, 28]``, loss
  ``F.cross_entropy(..., ignore_index=255)`` (mean over the labelled pixels of
  the batch; 0 if it has none, as in Rust).  Accuracy is aggregated as the Rust
  trainer does: per batch ``correct_b = hits_b / max(labelled_b, 1) * n_b``,
  accuracy ``= sum(correct_b) / sum(n_b)``, loss ``= sum(loss_b * n_b) / sum(n_b)``;
  the test split is cut into batches of ``--batch`` (as in Rust) unless
  ``--eval-batch`` is given.  Augmentation moves the mask with its image,
  labelling the pixels a crop brings in 10;
* optimizer: ``torch.optim.SGD`` (momentum, dampening 0, optional Nesterov)
  with weight decay applied to *all* parameters (BN affine and biases too);
* the learning rate is set before every update ``t = 0 .. T-1``
  (``T = epochs * ceil(N / batch)``) from ``--schedule``:

  - ``constant``: ``lr``
  - ``cosine``: ``lr * 0.5 * (1 + cos(pi * t / T))``
  - ``warmup-cosine``: ``lr * (t + 1) / W`` for ``t < W`` (``W = --warmup``),
    else ``lr * 0.5 * (1 + cos(pi * (t - W) / (T - W)))``
  - ``step``: ``lr * gamma ** floor(epoch / step_every)``;

* BatchNorm in training mode while training (PyTorch momentum 0.1), eval mode
  for testing; optional augmentation ``--augment crop:P,flip`` (random crop
  after zero-pixel padding by P, horizontal flip with p = 0.5; the padding is
  raw pixel value 0, as in the Rust ``augment`` module).

After every epoch the test accuracy / loss on the 10k test images, the mean
train loss (sample weighted) and the elapsed time are printed and the JSON
summary (``--out``) is rewritten, so a background run can be followed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import random
import sys
import time

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402  (model builders and SPECS only)

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
IMAGE_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
DATASETS = ("fashion-mnist", "fashion-mnist-seg")
# fashion-mnist-seg (crates/data/src/named.rs): SEGMENT_THRESHOLD, BACKGROUND, UNLABELLED
SEG_THRESHOLD = 32
SEG_BACKGROUND = 10
SEG_UNLABELLED = 255
SEG_CLASSES = SEG_BACKGROUND + 1
DEFAULT_EVAL_BATCH = 1000  # classification (the aggregation does not depend on it there)
SCHEDULES = ("constant", "cosine", "warmup-cosine", "step")
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
ORT_CHECK_ATOL = 1e-4

# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def read_idx(path: str) -> np.ndarray:
    """Read a (gzipped) IDX file into a numpy array; exits with a clear message if absent."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: dataset file not found: {path}\n"
                         f"(expected Fashion-MNIST IDX files in {os.path.dirname(path)}; see --data-dir)")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise SystemExit(f"error: {path} is not an IDX file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    count = int(np.prod(shape))
    if len(raw) != offset + count * dtype.itemsize:
        raise SystemExit(f"error: {path}: size {len(raw)} does not match header shape {shape}")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)


def load_split(data_dir: str, split: str) -> tuple:
    """Images ``[N, 28, 28]`` uint8 and labels ``[N]`` int64 of one split."""
    img_file, lbl_file = SPLIT_FILES[split]
    images = read_idx(os.path.join(data_dir, img_file))
    labels = read_idx(os.path.join(data_dir, lbl_file))
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE[1:] or images.dtype != np.uint8:
        raise SystemExit(f"error: {split} images have shape {images.shape} / dtype {images.dtype}")
    if labels.shape != (images.shape[0],):
        raise SystemExit(f"error: {split}: {labels.shape[0]} labels for {images.shape[0]} images")
    return images, labels.astype(np.int64)


def pixel_stats(images: np.ndarray) -> tuple:
    """Mean and population std (ddof=0) of ``pixel / 255`` over all pixels, in float64.

    Computed from the exact 256-bin histogram, so no float64 copy of the data is made.
    """
    counts = np.bincount(images.reshape(-1), minlength=256).astype(np.float64)
    values = np.arange(256, dtype=np.float64) / 255.0
    n = counts.sum()
    mean = float((counts * values).sum() / n)
    var = float((counts * (values - mean) ** 2).sum() / n)
    return mean, math.sqrt(var)


def normalize(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    """``(pixel / 255 - mean) / std`` (float64 per pixel value, cast to float32) as ``[N, 1, 28, 28]``."""
    lut = ((np.arange(256, dtype=np.float64) / 255.0 - mean) / std).astype(np.float32)
    return torch.from_numpy(lut[images]).unsqueeze(1)


def segment_masks(images: np.ndarray, labels: np.ndarray) -> torch.Tensor:
    """Per-pixel labels ``[N, 28, 28]`` uint8 of ``ImageDataset::segmented(32, 10, 255)``:
    ``p >= 32`` -> the image's class, ``p == 0`` -> 10 (background), else 255 (unlabelled)."""
    cls = labels.astype(np.uint8)[:, None, None]
    masks = np.where(images >= SEG_THRESHOLD, cls,
                     np.where(images == 0, np.uint8(SEG_BACKGROUND), np.uint8(SEG_UNLABELLED)))
    return torch.from_numpy(np.ascontiguousarray(masks.astype(np.uint8)))


def parse_augment(text: str) -> dict:
    """``"crop:2,flip"`` -> ``{"crop_padding": 2, "flip": True}``; ``"none"`` / ``""`` -> no augmentation."""
    aug = {"crop_padding": 0, "flip": False}
    if not text or text == "none":
        return aug
    for item in text.split(","):
        item = item.strip()
        if item == "flip":
            aug["flip"] = True
        elif item.startswith("crop:"):
            aug["crop_padding"] = int(item.split(":", 1)[1])
            if aug["crop_padding"] < 0:
                raise argparse.ArgumentTypeError("crop padding must be >= 0")
        else:
            raise argparse.ArgumentTypeError(f"unknown augmentation {item!r} (use crop:P and/or flip)")
    return aug


def augment_batch(x: torch.Tensor, aug: dict, pad_value: float, gen: torch.Generator,
                  mask: torch.Tensor | None = None, mask_pad: int = SEG_BACKGROUND):
    """Random crop after padding by ``crop_padding`` with ``pad_value`` and/or horizontal flip (p = 0.5).

    Same semantics as the Rust ``augment``: ``out[y, x] = img[y + dy, (W-1-x if flip else x) + dx]``
    with ``dy, dx`` uniform in ``[-P, P]`` and out-of-range pixels set to the padding value.
    With ``mask`` (``[B, H, W]`` per-pixel labels) returns ``(images, masks)``, the masks moved
    the same way and the pixels brought in from outside labelled ``mask_pad``.
    """
    p, flip = aug["crop_padding"], aug["flip"]
    if p == 0 and not flip:
        return x if mask is None else (x, mask)
    b, _, h, w = x.shape
    xp = F.pad(x, (p, p, p, p), value=pad_value) if p else x
    dy = torch.randint(-p, p + 1, (b,), generator=gen)
    dx = torch.randint(-p, p + 1, (b,), generator=gen)
    cols = torch.arange(w).expand(b, w)
    if flip:
        flipped = torch.rand(b, generator=gen) < 0.5
        cols = torch.where(flipped[:, None], (w - 1) - cols, cols)
    rows = torch.arange(h)[None, :] + dy[:, None] + p  # [B, H]
    cols = cols + dx[:, None] + p  # [B, W]
    idx_b = torch.arange(b)[:, None, None]
    out = xp[idx_b, :, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    out = out.permute(0, 3, 1, 2).contiguous()
    if mask is None:
        return out
    mp = F.pad(mask, (p, p, p, p), value=mask_pad) if p else mask
    return out, mp[idx_b, rows[:, :, None], cols[:, None, :]].contiguous()  # [B, H, W]


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


def spec_for(onnx_path: str, name: str | None, data: str = "fashion-mnist") -> em.Spec:
    """The export spec of the model (``--model`` or the ONNX file stem without ``_dynamo``),
    checked to fit the dataset ``data``."""
    if name is None:
        name = os.path.splitext(os.path.basename(onnx_path))[0]
        if name.endswith("_dynamo"):
            name = name[: -len("_dynamo")]
    specs = {s.name: s for s in em.SPECS}
    if name not in specs:
        raise SystemExit(f"error: unknown model {name!r}; pass --model (one of {', '.join(specs)})")
    spec = specs[name]
    if data == "fashion-mnist-seg":
        want = (SEG_CLASSES,) + IMAGE_SHAPE[1:]
        if (tuple(spec.input_shape) != IMAGE_SHAPE or spec.input_dtype != "float32"
                or tuple(spec.logits_shape) != want):
            raise SystemExit(f"error: model {name!r} takes {spec.input_shape} {spec.input_dtype} and gives "
                             f"{spec.logits_shape}; fashion-mnist-seg needs {IMAGE_SHAPE} float32 -> {want}")
        return spec
    if tuple(spec.input_shape) != IMAGE_SHAPE or spec.input_dtype != "float32" or spec.num_classes != NUM_CLASSES:
        raise SystemExit(f"error: model {name!r} takes {spec.input_shape} {spec.input_dtype} with "
                         f"{spec.num_classes} classes; Fashion-MNIST needs {IMAGE_SHAPE} float32, 10 classes")
    return spec


def load_onnx_weights(model: nn.Module, onnx_model: onnx.ModelProto) -> dict:
    """Copy every state_dict entry (parameters, BN running stats) from the ONNX initializer of the same name.

    ``num_batches_tracked`` (not exported) is reset to 0.  Raises on any missing
    initializer or shape/dtype mismatch and checks the copy bit for bit.
    """
    inits = {t.name: t for t in onnx_model.graph.initializer}
    state = model.state_dict()
    names = [k for k in state if not k.endswith("num_batches_tracked")]
    missing = [k for k in names if k not in inits]
    if missing:
        raise SystemExit(f"error: state_dict entries without an ONNX initializer: {missing}")
    problems = []
    arrays = {}
    for k in names:
        arr = numpy_helper.to_array(inits[k])
        dst = state[k]
        if tuple(arr.shape) != tuple(dst.shape) or arr.dtype != np.float32 or dst.dtype != torch.float32:
            problems.append(f"{k}: onnx {arr.dtype}{list(arr.shape)} vs torch {dst.dtype}{list(dst.shape)}")
        arrays[k] = arr
    if problems:
        raise SystemExit("error: ONNX initializers do not match the module:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for k in names:
            state[k].copy_(torch.from_numpy(arrays[k].copy()))
        for k, v in state.items():
            if k.endswith("num_batches_tracked"):
                v.zero_()
    loaded = model.state_dict()
    for k in names:
        if not np.array_equal(loaded[k].numpy(), arrays[k]):
            raise SystemExit(f"error: {k} was not loaded bit-identically")
    unused = [n for n in inits if n not in set(names)]
    return {"loaded": len(names), "unused_initializers": unused}


def check_against_ort(model: nn.Module, onnx_path: str, x: torch.Tensor) -> float:
    """Max abs difference of the eval-mode module vs onnxruntime on ``x`` (hard error above the tolerance)."""
    import onnxruntime as ort  # only needed for this check

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    model.eval()
    with torch.no_grad():
        ref = model(x).numpy()
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    if got.shape != ref.shape:
        raise SystemExit(f"error: onnxruntime gives {list(got.shape)}, the module {list(ref.shape)}")
    diff = float(np.max(np.abs(got - ref)))
    if not diff < ORT_CHECK_ATOL:
        raise SystemExit(f"error: loaded module differs from onnxruntime by {diff:g} (> {ORT_CHECK_ATOL:g})")
    return diff


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def lr_at(t: int, epoch: int, total: int, args: argparse.Namespace) -> float:
    """Learning rate for update ``t`` (0-based) of ``total``, in epoch ``epoch`` (0-based)."""
    lr0 = args.lr
    if args.schedule == "constant":
        return lr0
    if args.schedule == "cosine":
        return lr0 * 0.5 * (1.0 + math.cos(math.pi * t / total))
    if args.schedule == "warmup-cosine":
        w = args.warmup
        if t < w:
            return lr0 * (t + 1) / w
        return lr0 * 0.5 * (1.0 + math.cos(math.pi * (t - w) / (total - w)))
    if args.schedule == "step":
        return lr0 * args.gamma ** (epoch // args.step_every)
    raise ValueError(args.schedule)


def seg_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over the labelled pixels (``ignore_index=255``); 0 (with a zero
    gradient) for a batch without any, as the Rust loss (PyTorch's mean would be NaN)."""
    if not bool((labels != SEG_UNLABELLED).any()):
        return (logits * 0.0).sum()
    return F.cross_entropy(logits, labels, ignore_index=SEG_UNLABELLED, label_smoothing=label_smoothing)


def seg_correct(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The Rust trainer's per-batch ``correct``: hits / max(labelled, 1) * batch size."""
    kept = labels != SEG_UNLABELLED
    hits = int(((logits.argmax(1) == labels) & kept).sum())
    return hits / max(int(kept.sum()), 1) * labels.shape[0]


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seg: bool = False) -> tuple:
    """(mean cross-entropy, accuracy) of the eval-mode model.

    ``seg``: per-pixel labels; loss and accuracy are aggregated per batch of ``batch`` as in
    the Rust trainer (``sum(loss_b * n_b) / N``, ``sum(correct_b) / N``)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            logits = model(x[i: i + batch])
            yb = y[i: i + batch].long()
            if seg:
                loss_sum += float(seg_loss(logits, yb)) * yb.shape[0]
                correct += seg_correct(logits, yb)
                continue
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
    return loss_sum / x.shape[0], correct / x.shape[0]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_json(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> dict:
    """Run the whole recipe; returns the summary (also written to ``args.out``)."""
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    seg = args.data == "fashion-mnist-seg"
    spec = spec_for(args.onnx, args.model, args.data)

    train_u8, train_y = load_split(args.data_dir, "train")
    test_u8, test_y = load_split(args.data_dir, "test")
    mean, std = pixel_stats(train_u8)
    if args.limit:
        train_u8, train_y = train_u8[: args.limit], train_y[: args.limit]
    x_train = normalize(train_u8, mean, std)
    x_test = normalize(test_u8, mean, std)
    if seg:  # per-pixel labels, uint8 [N, 28, 28] (cast to int64 per batch)
        y_train = segment_masks(train_u8, train_y)
        y_test = segment_masks(test_u8, test_y)
    else:
        y_train = torch.from_numpy(train_y)
        y_test = torch.from_numpy(test_y)
    eval_batch = args.eval_batch or (args.batch if seg else DEFAULT_EVAL_BATCH)
    pad_value = float(np.float32((0.0 - mean) / std))
    n = x_train.shape[0]
    steps_per_epoch = math.ceil(n / args.batch)
    total = args.epochs * steps_per_epoch
    if args.schedule == "warmup-cosine" and not 0 < args.warmup < total:
        raise SystemExit(f"error: --warmup must be in 1..{total - 1} (T = {total} updates)")

    model = spec.build()  # every tensor is overwritten from the ONNX file below
    load_info = load_onnx_weights(model, onnx.load(args.onnx))
    ort_diff = None if args.no_check_ort else check_against_ort(model, args.onnx, x_test[:16])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, dampening=0.0,
                          weight_decay=args.wd, nesterov=args.nesterov)

    shuffle_gen = torch.Generator().manual_seed(args.seed)
    aug_gen = torch.Generator().manual_seed(args.seed + 1)
    summary = {
        "engine": "pytorch-eager",
        "model": spec.name,
        "onnx": args.onnx,
        "recipe": {
            "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "schedule": args.schedule,
            "warmup": args.warmup if args.schedule == "warmup-cosine" else None,
            "step_every": args.step_every if args.schedule == "step" else None,
            "gamma": args.gamma if args.schedule == "step" else None,
            "momentum": args.momentum, "nesterov": args.nesterov, "dampening": 0.0,
            "weight_decay": args.wd, "weight_decay_on": "all parameters",
            "label_smoothing": args.label_smoothing, "augment": args.augment or "none",
            "seed": args.seed, "limit": args.limit, "drop_last": False,
            "bn_momentum": 0.1, "updates": total, "updates_per_epoch": steps_per_epoch,
        },
        "data": {
            "name": args.data, "dir": args.data_dir, "train_samples": n, "test_samples": int(x_test.shape[0]),
            "mean": mean, "std": std, "std_ddof": 0, "stats_over": "all pixels of the full training split",
            "eval_batch": eval_batch,
        },
        "init": {**load_info, "ort_max_abs_diff": ort_diff},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "epochs": [],
    }
    if seg:
        def fractions(y: torch.Tensor) -> dict:
            counts = torch.bincount(y.reshape(-1).long(), minlength=256).double()
            return {"labelled": float(1 - counts[SEG_UNLABELLED] / counts.sum()),
                    "background": float(counts[SEG_BACKGROUND] / counts.sum())}
        summary["data"]["segmentation"] = {
            "classes": SEG_CLASSES, "threshold": SEG_THRESHOLD, "background": SEG_BACKGROUND,
            "unlabelled": SEG_UNLABELLED, "loss": "cross-entropy, ignore_index=255, mean over labelled pixels",
            "accuracy": "per batch hits/max(labelled,1)*n_b, summed over batches / samples (Rust trainer)",
            "pixel_fractions": {"train": fractions(y_train), "test": fractions(y_test)},
        }
    print(f"{spec.name}: {n} train / {x_test.shape[0]} test samples, mean {mean:.6f} std {std:.6f}, "
          f"{total} updates ({steps_per_epoch}/epoch), {summary['threads']} threads, "
          f"init from {args.onnx} ({load_info['loaded']} tensors, ort diff {ort_diff})", flush=True)

    t = 0
    for epoch in range(args.epochs):
        t_epoch = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=shuffle_gen)
        loss_sum, correct = 0.0, 0
        lr = args.lr
        for i in range(0, n, args.batch):
            idx = order[i: i + args.batch]
            if seg:
                xb, yb = augment_batch(x_train[idx], args.aug, pad_value, aug_gen, mask=y_train[idx])
                yb = yb.long()
            else:
                xb = augment_batch(x_train[idx], args.aug, pad_value, aug_gen)
                yb = y_train[idx]
            lr = lr_at(t, epoch, total, args)
            for group in opt.param_groups:
                group["lr"] = lr
            logits = model(xb)
            if seg:
                loss = seg_loss(logits, yb, args.label_smoothing)
            else:
                loss = F.cross_entropy(logits, yb, label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise SystemExit(f"error: non-finite loss at update {t}")
            loss_sum += loss_value * yb.shape[0]
            if seg:
                correct += seg_correct(logits.detach(), yb)
            else:
                correct += int((logits.detach().argmax(1) == yb).sum())
            t += 1
        train_seconds = time.perf_counter() - t_epoch
        test_loss, test_acc = evaluate(model, x_test, y_test, eval_batch, seg)
        row = {
            "epoch": epoch + 1, "updates": t, "lr_last": lr,
            "train_loss": loss_sum / n, "train_acc": correct / n,
            "test_loss": test_loss, "test_acc": test_acc,
            "train_seconds": train_seconds, "epoch_seconds": time.perf_counter() - t_epoch,
            "elapsed_seconds": time.perf_counter() - t_start,
        }
        summary["epochs"].append(row)
        summary["final_test_acc"] = test_acc
        summary["best_test_acc"] = max(r["test_acc"] for r in summary["epochs"])
        summary["wall_seconds"] = row["elapsed_seconds"]
        summary["finished"] = epoch + 1 == args.epochs
        print(f"epoch {epoch + 1:3d}/{args.epochs}  lr {lr:.5f}  train_loss {row['train_loss']:.4f}  "
              f"train_acc {row['train_acc']:.4f}  test_loss {test_loss:.4f}  test_acc {test_acc:.4f}  "
              f"epoch {row['epoch_seconds']:.1f}s  elapsed {row['elapsed_seconds']:.1f}s", flush=True)
        write_json(args.out, summary)
    print(f"final test accuracy {summary['final_test_acc']:.4f} in {summary['wall_seconds']:.1f}s -> {args.out}")
    return summary


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--onnx", required=True, help="ONNX model whose initializers are the initial weights")
    ap.add_argument("--model", default=None,
                    help="export_models.py spec name (if unset: ONNX file stem without _dynamo)")
    ap.add_argument("--data", choices=DATASETS, default="fashion-mnist",
                    help="fashion-mnist (classification) or fashion-mnist-seg (per-pixel labels, 11 classes)")
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="directory with the Fashion-MNIST IDX .gz files")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=128, help="batch size (last partial batch kept)")
    ap.add_argument("--lr", type=float, default=0.05, help="base learning rate lr0")
    ap.add_argument("--schedule", choices=SCHEDULES, default="cosine", help="learning-rate schedule")
    ap.add_argument("--warmup", type=int, default=0, help="warm-up updates W (warmup-cosine)")
    ap.add_argument("--step-every", type=int, default=1, help="epochs per decay (step schedule)")
    ap.add_argument("--gamma", type=float, default=0.1, help="decay factor (step schedule)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wd", type=float, default=5e-4, help="weight decay (all parameters)")
    ap.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--augment", default="", help="'crop:P,flip', 'crop:P', 'flip' or 'none'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="use only the first N training samples (0: all)")
    ap.add_argument("--eval-batch", type=int, default=0,
                    help=f"batch size for testing (0: {DEFAULT_EVAL_BATCH}; fashion-mnist-seg: --batch, as in Rust)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads")
    ap.add_argument("--no-check-ort", action="store_true",
                    help="skip the onnxruntime check of the loaded initial weights")
    ap.add_argument("--out", default=None, help="JSON summary (if unset: runs/pytorch_<model>.json)")
    args = ap.parse_args(argv)
    try:
        args.aug = parse_augment(args.augment)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        ap.error(f"--augment: {exc}")
    if args.epochs < 1 or args.batch < 1 or args.threads < 1 or args.limit < 0 or args.eval_batch < 0:
        ap.error("--epochs, --batch and --threads must be >= 1 and --limit, --eval-batch >= 0")
    if args.schedule == "step" and args.step_every < 1:
        ap.error("--step-every must be >= 1")
    if args.out is None:
        suffix = "_seg" if args.data == "fashion-mnist-seg" else ""
        args.out = os.path.join("runs", f"pytorch_{spec_for(args.onnx, args.model, args.data).name}{suffix}.json")
    return args


def main(argv=None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
