#!/usr/bin/env python3
"""Paired before/after throughput of two edgefreeze builds, interleaved.

On a 2-vCPU machine whose second core is shared (two busy processes run 5-60% slower
each than one alone), the same binary's 2-thread ONNX Runtime step can vary 2x between
runs. This script alternates the two builds run by run (A, B, A, B, ...) so that each
pair sees the same machine, and reports the median of the per-pair ratios B/A, with
every run's samples/s and step memory. Use --threads 1 for the steadiest pairs.

    tools/bench_ab.py --a /tmp/edgefreeze-base --b target/debug/edgefreeze \
        --model resnet20_28 --engine tract --threads 1 --rounds 3
"""

import argparse
import statistics
import subprocess
import sys
import tempfile


def run(binary, args, out):
    cmd = [
        binary, "bench", "--models", args.model, "--models-dir", args.models_dir,
        "--batches", str(args.batch), "--engines", args.engine, "--threads", str(args.threads),
        "--warmup", "2", "--steps", "4", "--min-seconds", str(args.min_seconds), "--out", out,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith(f"| {args.model} |")]
    headers = [line for line in lines if line.startswith("| model |")]
    if done.returncode != 0 or not rows or not headers:
        sys.exit(f"{binary} bench failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    # Columns by name: builds differ in which others the table has (GFLOP/s since 7 December).
    cols = dict(zip((c.strip() for c in headers[0].split("|")), (c.strip() for c in rows[0].split("|"))))
    return float(cols[f"{args.engine} samples/s"]), cols[f"{args.engine} step MiB"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="the baseline edgefreeze binary")
    p.add_argument("--b", required=True, help="the changed edgefreeze binary")
    p.add_argument("--model", required=True)
    p.add_argument("--models-dir", default="models")
    p.add_argument("--engine", default="ort:cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=1.5)
    args = p.parse_args()
    speeds = {"a": [], "b": []}
    memory = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for key, binary in (("a", args.a), ("b", args.b)):
                s, m = run(binary, args, f"{tmp}/{key}.json")
                speeds[key].append(s)
                memory[key].append(m)
    ratios = [b / a for a, b in zip(speeds["a"], speeds["b"])]
    print(f"{args.model} {args.engine} batch {args.batch}, {args.threads} thread(s), {args.rounds} rounds")
    for key in ("a", "b"):
        print(f"  {key}: samples/s {speeds[key]} (median {statistics.median(speeds[key]):.1f}), step MiB {memory[key]}")
    print(f"  b/a paired: median {statistics.median(ratios):.2f}x, each {[round(r, 2) for r in ratios]}")


if __name__ == "__main__":
    main()
