#!/usr/bin/env python3
"""What PyTorch eager keeps from the forward pass for the backward, per sample.

Usage:
    python3 tools/saved_pytorch.py [--models lenet5,resnet20_28,...] [--batch 8]

For each model of ``tools/export_models.py`` (bundled and benchmark ones), one
training-mode forward and loss run under ``torch.autograd.graph.saved_tensors_hooks``;
every tensor autograd saves for the backward is recorded once per storage, the
parameters left out (they exist before and after the step), and the bytes are
divided by the batch. This is the figure that ``edgefreeze inspect`` prints under a
converted folder's training graphs ("keeps N forward values for the backward, X per
sample"), so the two can be put side by side. Both count what the backward reads, not
the temporaries of the forward or of the backward itself.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402  (model builders and specs only)
from bench_pytorch import make_batch  # noqa: E402


def saved_bytes(spec: em.Spec, batch: int) -> tuple[int, int]:
    """(tensors, bytes) autograd saves for one training step's backward."""
    model = em.build(spec)
    model.train()
    x, y = make_batch(spec, batch, 1234)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return len(seen), sum(seen.values())


def main(argv=None) -> int:
    specs = {s.name: s for s in list(em.SPECS) + list(em.BENCH_SPECS)}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(specs), help="comma-separated model names")
    parser.add_argument("--batch", type=int, default=8, help="batch of the one forward pass")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print("| model | tensors saved | bytes per sample |")
    print("|---|---:|---:|")
    for name in args.models.split(","):
        if name not in specs:
            parser.error(f"unknown model {name!r}; known: {', '.join(specs)}")
        count, total = saved_bytes(specs[name], args.batch)
        print(f"| {name} | {count} | {total / args.batch / 1024:.1f} KiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
