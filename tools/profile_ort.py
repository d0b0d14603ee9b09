#!/usr/bin/env python3
"""Where ONNX Runtime (CPU) spends a training step: runs a converted training-step
graph with ONNX Runtime's profiler and sums the kernel time per op type.

    edgefreeze convert models/resnet20_28.onnx --out runs/resnet20-graphs
    python3 tools/profile_ort.py runs/resnet20-graphs --batch 128 --threads 2

Inputs are synthetic (random images or token ids, random labels); the state comes from
the folder's state.safetensors. Prints the top op types with their share of kernel time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort


def read_state(path: str) -> dict:
    """Reads a safetensors file (f32/f64/i64) with numpy alone."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        data = f.read()
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    state = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        state[name] = np.frombuffer(data[start:end], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return state


def synthetic_feeds(model: onnx.ModelProto, state: dict, batch: int) -> dict:
    """Every input of a training-step graph: the state's tensors from `state`, and the
    rest synthetic with `batch` for the symbolic dimensions (random images or token ids,
    random labels, a learning rate of 0.01), from a fixed seed."""
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        name = value.name
        if name in state:
            feeds[name] = state[name]
            continue
        dims = [d.dim_value if d.dim_value > 0 else batch for d in value.type.tensor_type.shape.dim]
        elem = value.type.tensor_type.elem_type
        if name == "labels":
            feeds[name] = rng.integers(0, 2, size=dims).astype(np.int64)
        elif name == "lr":
            feeds[name] = np.array(0.01, dtype=np.float32)
        elif elem == onnx.TensorProto.INT64:
            feeds[name] = rng.integers(0, 2, size=dims).astype(np.int64)
        else:
            feeds[name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a folder written by edgefreeze convert (or a run's graphs/)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)

    model_path = os.path.join(args.folder, "train_step.onnx")
    model = onnx.load(model_path)
    state = read_state(os.path.join(args.folder, "state.safetensors"))
    feeds = synthetic_feeds(model, state, args.batch)

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "edgefreeze")
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)  # warm-up, not counted below
    for _ in range(args.steps):
        session.run(None, feeds)
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)

    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    per_op = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_op[e["args"].get("op_name", "?")] += e["dur"]
    # The first run is the warm-up.
    steps_us = [e["dur"] for e in runs[1:]] or [e["dur"] for e in runs]
    total = sum(per_op.values())
    print(f"{model_path}: batch {args.batch}, {args.threads} threads, "
          f"median step {sorted(steps_us)[len(steps_us) // 2] / 1e3:.1f} ms, {len(model.graph.node)} nodes")
    print(f"{'op type':<24}{'share':>8}{'ms/step':>10}")
    for op, us in per_op.most_common(args.top):
        print(f"{op:<24}{100 * us / total:>7.1f}%{us / 1e3 / (args.steps + 1):>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
