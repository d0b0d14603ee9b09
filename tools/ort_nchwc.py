#!/usr/bin/env python3
"""What ONNX Runtime's blocked-layout convolutions are worth, and why a training graph
never gets them.

ONNX Runtime's CPU provider rewrites `Conv` nodes into its NCHWc kernels (channels in
blocks of 8 with AVX2, 16 with AVX-512, filters reordered once at load) at optimisation
level 3 ("layout"), but only where the weight is a constant initializer: the filter is
reordered when the session is built (`NchwcTransformerImpl::TransformConv` returns early
for any other weight). In a training step every weight is an input (it changes each step),
so the training graph's convolutions stay on the generic im2col + GEMM path.

This script times a model's forward pass three ways in one process, same thread count:
  - constant:    weights as initializers, level 3 (the NCHWc rewrite fires),
  - inputs:      the same weights fed as graph inputs, level 3 (as in a training graph),
  - no-layout:   weights as initializers, level 2 (no NCHWc, the generic kernels),
checks that the three give the same logits, and prints the time per run and how many
nodes of the optimised graph are NCHWc ops (from ONNX Runtime's optimised-model dump).

    python3 tools/ort_nchwc.py models/resnet20_28.onnx --batch 64 --threads 2
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort


def weights_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """The model with every 4-D float initializer (a convolution's weight) made an input."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    feeds = {}
    keep = []
    for init in m.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 4:
            feeds[init.name] = onnx.numpy_helper.to_array(init)
            m.graph.input.append(onnx.helper.make_tensor_value_info(init.name, onnx.TensorProto.FLOAT, list(init.dims)))
        else:
            keep.append(init)
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    return m, feeds


def session(model: onnx.ModelProto, level, threads: int, dump: str):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.optimized_model_filepath = dump
    so.log_severity_level = 3  # not the warning that a level-3 dump is machine-specific
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def nchwc_nodes(dump: str) -> tuple[int, int]:
    g = onnx.load(dump).graph
    nchwc = sum(1 for n in g.node if n.domain == "com.microsoft.nchwc")
    plain = sum(1 for n in g.node if n.op_type in ("Conv", "FusedConv") and n.domain != "com.microsoft.nchwc")
    return nchwc, plain


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="the three forms alternated this many times")
    args = ap.parse_args()

    model = onnx.load(args.model)
    inp = model.graph.input[0]
    dims = [d.dim_value if d.dim_value > 0 else args.batch for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    as_inputs, weights = weights_as_inputs(model)
    print(f"{os.path.basename(args.model)}, batch {args.batch}, {args.threads} threads, "
          f"{len(weights)} convolution weights, onnxruntime {ort.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        forms = {
            "constant": (session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, args.threads, f"{tmp}/c.onnx"), {}, f"{tmp}/c.onnx"),
            "inputs": (session(as_inputs, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, args.threads, f"{tmp}/i.onnx"), weights, f"{tmp}/i.onnx"),
            "no-layout": (session(model, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, args.threads, f"{tmp}/n.onnx"), {}, f"{tmp}/n.onnx"),
        }
        reference = None
        times = {k: [] for k in forms}
        for _ in range(args.rounds):
            for name, (s, extra, _) in forms.items():
                feeds = {inp.name: x, **extra}
                out = s.run(None, feeds)[0]
                if reference is None:
                    reference = out
                scale = float(np.abs(reference).max())
                assert np.abs(out - reference).max() <= 1e-4 * max(scale, 1.0), f"{name} disagrees"
                for _ in range(args.runs):
                    t = time.perf_counter()
                    s.run(None, feeds)
                    times[name].append(time.perf_counter() - t)
        for name, (_, _, dump) in forms.items():
            nchwc, conv = nchwc_nodes(dump)
            ms = statistics.median(times[name]) * 1e3
            print(f"  {name:>9}: {ms:8.2f} ms a forward (median of {len(times[name])}), "
                  f"{nchwc} NCHWc nodes, {conv} other Conv/FusedConv nodes")
        c, i = statistics.median(times["constant"]), statistics.median(times["inputs"])
        print(f"  weights as inputs take {i / c:.2f}x the constant-weight forward")


if __name__ == "__main__":
    main()
