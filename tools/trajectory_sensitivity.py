#!/usr/bin/env python3
"""How far apart two float32 training runs of the same recipe drift, in PyTorch.

Trains a reference model for ``--steps`` SGD updates (momentum 0.9, weight decay
5e-4, constant ``--lr``) on the first ``steps * batch`` Fashion-MNIST training
images, in order, starting from the weights of the ONNX model, three ways:
float32 with 1 thread, float32 with 2 threads, and float64. It prints the largest
relative loss difference of each float32 run from the float64 one and between
the two float32 runs, per step window, as JSON.

Two float32 runs that differ only in summation order (thread count) tell how much
any two correct float32 implementations of the same training can be expected to
differ: the measure for comparing edgefreeze's engines with each other. It also
prints the largest relative L2 difference of any state tensor between the float32
(1 thread) and float64 runs after a few steps.

    python3 tools/trajectory_sensitivity.py --onnx models/resnet20_28.onnx \\
        --steps 50 --batch 32 --lr 0.001
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_pytorch as tp  # noqa: E402  (same data loading and weight import)


def losses(args, images, labels, dtype, threads):
    torch.set_num_threads(threads)
    spec = tp.spec_for(args.onnx, None)
    model = tp.em.build(spec)
    tp.load_onnx_weights(model, onnx.load(args.onnx))
    model = model.to(dtype).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    out = []
    snapshots = {}
    for step in range(args.steps):
        x = images[step * args.batch:(step + 1) * args.batch].to(dtype)
        y = labels[step * args.batch:(step + 1) * args.batch]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
        if step + 1 in SNAPSHOT_STEPS:
            snapshots[step + 1] = {k: v.detach().to(torch.float64).clone() for k, v in model.state_dict().items()}
    return np.array(out), snapshots


SNAPSHOT_STEPS = (1, 2, 5, 10)


def worst_parameter_difference(a: dict, b: dict) -> tuple:
    """Largest relative L2 difference over the float tensors of two state dicts."""
    worst = (0.0, "")
    for name, x in a.items():
        if not x.is_floating_point():
            continue
        y = b[name]
        rel = float(torch.linalg.vector_norm(x - y) / torch.linalg.vector_norm(y).clamp_min(1e-30))
        worst = max(worst, (rel, name))
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.001)
    args = parser.parse_args(argv)
    train_images, train_labels = tp.load_split(args.data_dir, "train")
    mean, std = tp.pixel_stats(train_images)
    n = args.steps * args.batch
    images = tp.normalize(train_images[:n], mean, std).to(torch.float64)
    labels = torch.from_numpy(train_labels[:n].astype(np.int64))
    f64, s64 = losses(args, images, labels, torch.float64, 1)
    f32_1, s32_1 = losses(args, images, labels, torch.float32, 1)
    f32_2, s32_2 = losses(args, images, labels, torch.float32, 2)

    def worst(a, b, upto):
        return float(np.max(np.abs(a[:upto] - b[:upto]) / np.abs(b[:upto])))

    windows = [w for w in (1, 2, 5, 10, 20, 50, args.steps) if w <= args.steps]
    report = {
        "model": args.onnx,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "torch": torch.__version__,
        "max_relative_loss_difference": {
            f"first_{w}_steps": {
                "f32_1thread_vs_f64": worst(f32_1, f64, w),
                "f32_2threads_vs_f64": worst(f32_2, f64, w),
                "f32_1thread_vs_f32_2threads": worst(f32_1, f32_2, w),
            }
            for w in sorted(set(windows))
        },
        "max_relative_parameter_difference_f32_1thread_vs_f64": {
            f"after_{k}_steps": worst_parameter_difference(s32_1[k], s64[k]) for k in SNAPSHOT_STEPS if k in s64
        },
        "final_loss": {"f64": float(f64[-1]), "f32_1thread": float(f32_1[-1]), "f32_2threads": float(f32_2[-1])},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
