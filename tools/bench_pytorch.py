#!/usr/bin/env python3
"""PyTorch eager training throughput of the edgefreeze reference models.

Usage (the interface ``edgefreeze bench`` relies on):
    python3 tools/bench_pytorch.py --models lenet5,resnet20_28 --batches 64,128 \\
        --threads 2 --out FILE

For every (model, batch) pair one full training step is timed: forward in
train mode, mean cross-entropy, backward, ``torch.optim.SGD`` update (momentum
0.9, weight decay 5e-4) and ``zero_grad(set_to_none=True)``.  Models are built
with ``tools/export_models.py`` (same architectures as ``models/*.onnx``; the
weight values do not matter for speed).  Inputs are random with a fixed seed:
float32 ``N(0, 1)`` images, or int64 tokens in ``[0, vocab)`` for
``transformer_text``; labels are uniform over the model's classes.  The same
batch is reused for every step.

After ``--warmup`` untimed steps, at least ``--steps`` steps are timed and
stepping continues until ``--min-seconds`` of timed steps have accumulated (so
fast models are measured long enough).  ``samples_per_s`` is
``batch * steps / total timed seconds``; ``step_ms_median`` is the median step
time.  The JSON goes to stdout, or to ``--out`` (progress then goes to stderr):

    {"engine": "pytorch-eager", "torch": ..., "threads": N,
     "results": [{"model": ..., "batch": ..., "samples_per_s": ...,
                  "step_ms_median": ..., "steps": ...,
                  "step_peak_mib": ...}, ...]}

``step_peak_mib`` is the peak resident memory of the steps above the resident
memory once the model and batch exist (Linux; null elsewhere).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402  (model builders and SPECS only)

DEFAULT_MODELS = ("lenet5", "resnet20_28", "mobilenetv2_05", "transformer_text")
DEFAULT_BATCHES = (64, 128)
DATA_SEED = 1234
LR = 0.01
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4


def comma_list(text: str) -> list:
    return [item.strip() for item in text.split(",") if item.strip()]


def make_batch(spec: em.Spec, batch: int, seed: int) -> tuple:
    """Random inputs (fixed seed) and labels in ``[0, num_classes)``."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch,) + tuple(spec.input_shape)
    if spec.input_dtype == "int64":
        x = torch.randint(0, em.VOCAB, shape, generator=gen, dtype=torch.int64)
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
    y = torch.randint(0, spec.num_classes, (batch,), generator=gen, dtype=torch.int64)
    return x, y


def bench_one(spec: em.Spec, batch: int, warmup: int, steps: int, min_seconds: float) -> dict:
    """Time full SGD training steps of one model at one batch size."""
    model = em.build(spec)  # seeded build; eval mode -> switch to train below
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    x, y = make_batch(spec, batch, DATA_SEED)

    def step() -> float:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # forces completion of the step

    # Peak resident memory of the steps above what is resident now (the model and the
    # batch), measured as edgefreeze's StepMemory does: writing 5 to clear_refs resets
    # the high-water mark VmHWM to the current resident size (Linux only).
    start_kib = reset_peak()
    for _ in range(warmup):
        step()
    times = []
    total = 0.0
    while len(times) < steps or total < min_seconds:
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
    return {
        "model": spec.name,
        "batch": batch,
        "samples_per_s": batch * len(times) / total,
        "step_ms_median": 1e3 * statistics.median(times),
        "step_ms_min": 1e3 * min(times),
        "steps": len(times),
        "timed_seconds": total,
        "step_peak_mib": None if start_kib is None else max(status_kib("VmHWM") - start_kib, 0) / 1024,
    }


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak():
    """Resets VmHWM to the current resident size and returns that size (kB), or None
    where the system does not allow it."""
    try:
        # Memory earlier cases freed goes back to the system first (as edgefreeze's
        # StepMemory does), or the steps would reuse it and the peak would not rise.
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_kib("VmRSS")
    except OSError:
        return None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", type=comma_list, default=list(DEFAULT_MODELS),
                    help="comma-separated model names (export_models.py specs)")
    ap.add_argument("--batches", type=comma_list, default=[str(b) for b in DEFAULT_BATCHES],
                    help="comma-separated batch sizes")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    ap.add_argument("--steps", type=int, default=10, help="minimum number of timed steps")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="minimum total timed seconds per case")
    ap.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    args = ap.parse_args(argv)
    specs = {s.name: s for s in em.SPECS + em.BENCH_SPECS}
    unknown = [m for m in args.models if m not in specs]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(specs)}")
    try:
        args.batches = [int(b) for b in args.batches]
    except ValueError:
        ap.error(f"--batches must be integers: {args.batches}")
    if not args.models or not args.batches or min(args.batches) < 1:
        ap.error("need at least one model and batch sizes >= 1")
    if args.threads < 1 or args.warmup < 0 or args.steps < 1 or args.min_seconds < 0:
        ap.error("--threads and --steps must be >= 1, --warmup and --min-seconds >= 0")
    args.specs = [specs[m] for m in args.models]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    log = sys.stderr
    results = []
    for spec in args.specs:
        for batch in args.batches:
            r = bench_one(spec, batch, args.warmup, args.steps, args.min_seconds)
            results.append(r)
            print(f"{r['model']:18s} batch {batch:4d}: {r['samples_per_s']:9.1f} samples/s, "
                  f"median step {r['step_ms_median']:8.2f} ms ({r['steps']} steps)", file=log, flush=True)
    report = {
        "engine": "pytorch-eager",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "warmup": args.warmup,
        "min_steps": args.steps,
        "min_seconds": args.min_seconds,
        "optimizer": {"type": "SGD", "lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY},
        "loadavg_after": list(os.getloadavg()),
        "results": results,
    }
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
