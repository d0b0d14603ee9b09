#!/usr/bin/env python3
"""Replays `--freeze auto`'s decision rule on the plasticity values a run recorded.

A lagged run (the default) logs, at every probe, the SP value of every active layer
(`plasticity` decisions in metrics.jsonl). This script feeds those values, in order, to the
rule with other knobs — the slope rule (`--freeze-window`, `--freeze-tol`,
`--freeze-confidence`) or the fall rule (`--freeze-fall`) — and prints the updates at which
it would have frozen each layer, beside the recorded run's own decisions.

What it can and cannot say: up to the first decision that differs from the recording the
replay is exact (the values are the ones that run would have measured). After it, they are
not: a layer frozen earlier changes how the layers behind it train, and one frozen later has
no recorded values. The first divergence is printed; read what follows it as a trend, not a
result. The rule is that of crates/freeze/src/controller.rs (`Controller::stable`,
`fallen`); replaying a run with its own knobs reproduces its recorded freezes (docs/results.md,
"Replaying the rule on recorded values"), which is the check that the two agree.

usage: tools/freeze_replay.py RUN_DIR... [--window W] [--tol T] [--confidence Z] [--fall F | --slope]

Knobs not given are the run's own (its freeze.json). Only runs with the default lagged
reference and every layer measured can be replayed: a fixed reference restarts the
histories at each rebuild, and a candidate-only run has no values of the other layers.
"""
import argparse
import json
import math
import sys
from pathlib import Path


def fit(values):
    """Least-squares slope per position, mean, and the slope's standard error."""
    n = len(values)
    x_mean = (n - 1) / 2
    mean = sum(values) / n
    sxx = sum((i - x_mean) ** 2 for i in range(n))
    slope = sum((i - x_mean) * (y - mean) for i, y in enumerate(values)) / sxx
    ssr = sum((y - (mean + slope * (i - x_mean))) ** 2 for i, y in enumerate(values))
    se = math.sqrt(ssr / (n - 2) / sxx) if n >= 3 else math.inf
    return slope, mean, se


def stable(history, a):
    w = a.window
    if len(history) < w:
        return False
    if a.fall is not None:
        means = [sum(history[i:i + w]) / w for i in range(len(history) - w + 1)]
        return means[-1] < a.fall * max(means)
    slope, mean, se = fit(history[-w:])
    bound = abs(slope) + a.confidence * se if a.confidence > 0 else abs(slope)
    return bound < a.tol * abs(mean)


def knobs_of(run):
    """The run's own controller knobs (freeze.json), or None if it did not run --freeze auto."""
    try:
        plan = json.load(open(run / "freeze.json"))["plan"]
    except (OSError, KeyError, ValueError):
        return None
    return plan.get("knobs") if plan.get("mode") == "auto" else None


def replay(run, a):
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    decisions = [r for r in rows if r.get("event") == "decision"]
    recorded = [(d["step"], d["layer"]) for d in decisions if d["kind"] == "freeze"]
    recorded += [(d["step"], "unfreeze") for d in decisions if d["kind"] == "unfreeze"]
    histories, depth, out, stopped = {}, 0, [], None
    for d in decisions:
        if d["kind"] == "rebuild-reference" and d["reason"].startswith("learning rate dropped"):
            histories = {}
            if depth > a.unfreeze_to:
                depth = a.unfreeze_to
                out.append((d["step"], "unfreeze"))
            continue
        if d["kind"] != "plasticity":
            continue
        first = d["layer"]
        if depth < first:
            # The recording has no values for layers the replay still trains.
            stopped = d["step"]
            break
        for i, v in enumerate(d["history"]):
            # As `Controller::observe`: values of frozen layers and non-finite ones dropped.
            if first + i >= depth and v is not None and math.isfinite(v):
                histories.setdefault(first + i, []).append(v)
        while depth in histories and stable(histories[depth], a):
            out.append((d["step"], depth))
            depth += 1
    recorded.sort(key=lambda r: r[0])
    return out, recorded, first_difference(out, recorded), stopped


def first_difference(out, recorded):
    """The first decision where the replay and the recording differ, at the earlier of the
    two updates, in words; None if they agree."""
    for i in range(max(len(out), len(recorded))):
        mine = out[i] if i < len(out) else None
        theirs = recorded[i] if i < len(recorded) else None
        if mine != theirs:
            step = min(d[0] for d in (mine, theirs) if d is not None)
            what = (f"the replay's decision {mine} against the recorded {theirs}" if mine and theirs
                    else f"the replay's {mine}, which the recorded run did not take" if mine
                    else f"the recorded {theirs}, which the replay did not take")
            return step, what
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--window", type=int, help="default: the run's own")
    ap.add_argument("--tol", type=float, help="default: the run's own")
    ap.add_argument("--confidence", type=float, help="default: the run's own")
    ap.add_argument("--fall", type=float, help="the fall rule instead of the slope rule")
    ap.add_argument("--slope", action="store_true", help="the slope rule, where the run used the fall rule")
    ap.add_argument("--unfreeze-to", type=int, help="default: the run's own")
    given = ap.parse_args()
    for run in given.runs:
        knobs = knobs_of(run)
        if knobs is None or not (run / "metrics.jsonl").is_file():
            print(f"{run}: not a run folder of --freeze auto (no freeze.json or metrics.jsonl)", file=sys.stderr)
            return 2
        if not knobs.get("lagged") or not knobs.get("ahead"):
            # A fixed reference restarts the histories at every rebuild, and a candidate-only
            # run has no values of the layers behind the candidate: neither can be replayed.
            print(f"{run}: recorded with --freeze-fixed-reference or --freeze-candidate-only; "
                  "only a lagged run that measured every layer can be replayed", file=sys.stderr)
            return 2
        a = argparse.Namespace(
            window=given.window or knobs["window"],
            tol=given.tol if given.tol is not None else knobs["tolerance"],
            confidence=given.confidence if given.confidence is not None else knobs.get("confidence", 0.0),
            fall=None if given.slope else (given.fall if given.fall is not None else knobs.get("fall")),
            unfreeze_to=given.unfreeze_to if given.unfreeze_to is not None else knobs["unfreeze_to"],
        )
        rule = (f"fall {a.fall}, window {a.window}" if a.fall is not None
                else f"slope: window {a.window}, tol {a.tol}, confidence {a.confidence}")
        out, recorded, diverged, stopped = replay(run, a)
        fmt = lambda ds: ", ".join(f"{s}: {'unfreeze' if l == 'unfreeze' else f'+{l}'}" for s, l in ds) or "–"
        print(f"{run.name} ({rule}): replay {fmt(out)} | recorded {fmt(recorded)}"
              + (f" | diverges at update {diverged[0]}: {diverged[1]}" if diverged else " | same decisions")
              + (f" | replay ends at update {stopped} (no recorded values of the layers it still trains)"
                 if stopped else ""))


if __name__ == "__main__":
    sys.exit(main())
