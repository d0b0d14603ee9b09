#!/usr/bin/env bash
# The EdgeMove benchmark, one (model, link) case: time per epoch and accuracy of
#   1. device only (`edgefreeze train` in the device namespace),
#   2. sequential split learning at the planner's cut (M = 1, one micro-batch in flight),
#   3. pipelined split training with the planner's (cut, M),
#   4. the same with the device's layers frozen (freeze-aware split; the planner's choice
#      for a frozen device side),
# inside the namespaces of tools/netns.sh (run as root after `tools/netns.sh up --up R
# --down R`; the rate is whatever that set). One engine thread on each side; the edge
# server and the device are pinned to CPUs of their own when EDGE_CPUS / DEVICE_CPUS
# (taskset lists) are set. EDGEFREEZE is the binary (default target/release/edgefreeze).
# CUTS (e.g. 2,6,10) limits the cuts the planner probes: a deep model's every cut does not
# fit the probe's budget. PROBE_BUDGET (seconds, default the planner's 120) raises that
# budget: a throttled device also spends it compiling tract's plan for each micro-batch size.
# RTT_MS (e.g. 20) adds that round trip in-process: the device reaches the server through
# `edgefreeze edge shape --rtt-ms RTT_MS` in its namespace (the rate stays tbf's), so the
# probe measures it too. DEVICE_SLOW=F (1 to 10) runs every device process (the probe
# and the training) in the CPU cgroup of `tools/netns.sh throttle --factor F`: 1/F of one
# CPU, network threads included, while the edge has a whole CPU; DEVICE_SLOW_PERIOD_US
# (default 10000) is the throttle's period (`netns.sh throttle --period-us`).
# DEVICE_SLOWDOWN=F (1 to 100) instead slows the device's engine alone (`--slowdown F` on
# every device command, the probe's included): each graph run is followed by a pause of
# F − 1 times its compute, so the device computes F times slower while its network threads
# keep their CPU, as a phone's network stack does not wait for its compute. EDGE_ENGINE (default
# tract, the engine `edge serve` defaults to) is the edge server's engine, e.g. ort:cpu: a
# server need not run the phone's pure-Rust engine.
# Prints one Markdown table row per case (with the load average when it started), then
# each case's stages, predicted and measured, and the concurrent probe's overlap factors.
# usage: tools/edge_bench.sh MODEL BATCH LIMIT EPOCHS "M,M,..."
set -euo pipefail
B=$(realpath "${EDGEFREEZE:-target/release/edgefreeze}")
NETNS=$(dirname "$(realpath "$0")")/netns.sh
[[ $# -ge 5 ]] || { sed -n '2,29p' "$0"; exit 2; }
model=$(realpath "$1"); batch=$2; limit=$3; epochs=$4; ms=$5
work=$(mktemp -d)
cd "$work"
echo "files in $work" >&2
T=bench-token-0123456789abcdef
echo "phone-1 $T" > tokens.txt
EX_EDGE="ip netns exec ef-edge"; EX_DEV="ip netns exec ef-dev"; LISTEN=10.210.0.2:50078
[[ -z ${EDGE_CPUS:-} ]] || EX_EDGE="$EX_EDGE taskset -c $EDGE_CPUS"
[[ -z ${DEVICE_CPUS:-} ]] || EX_DEV="$EX_DEV taskset -c $DEVICE_CPUS"
if [[ -n ${DEVICE_SLOW:-} && -n ${DEVICE_SLOWDOWN:-} ]]; then
  echo "edge_bench.sh: DEVICE_SLOW and DEVICE_SLOWDOWN would slow the device twice: set one" >&2
  exit 2
fi
CG=
if [[ -n ${DEVICE_SLOW:-} ]]; then
  "$NETNS" throttle --factor "$DEVICE_SLOW" --period-us "${DEVICE_SLOW_PERIOD_US:-10000}" >&2
  for d in /sys/fs/cgroup/ef-dev /sys/fs/cgroup/cpu/ef-dev; do [[ -d $d ]] && CG=$d; done
fi
# A device command: in the device namespace, on its CPUs, in its cgroup when throttled.
on_dev() {
  # Joins the cgroup before entering the namespace: `ip netns exec` remounts /sys.
  if [[ -n $CG ]]; then timeout 3600 sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" $EX_DEV "$@"
  else timeout 3600 $EX_DEV "$@"; fi
}
$EX_EDGE $B edge serve --listen $LISTEN --tokens tokens.txt --threads 1 --engine "${EDGE_ENGINE:-tract}" > edge.out 2> edge.err &
EDGE_PID=$!
SHAPER_PID=
trap 'kill $EDGE_PID $SHAPER_PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do [[ -s edge.out ]] && break; sleep 0.1; done
ADDR=$(head -1 edge.out | awk '{print $NF}')
if [[ -n ${RTT_MS:-} ]]; then
  $EX_DEV $B edge shape --to "$ADDR" --rtt-ms "$RTT_MS" --for-s 7200 > shaper.out 2> shaper.err &
  SHAPER_PID=$!
  for _ in $(seq 50); do [[ -s shaper.out ]] && break; sleep 0.1; done
  ADDR=$(head -1 shaper.out | awk '{print $2}')
fi
SLOWDOWN=(${DEVICE_SLOWDOWN:+--slowdown "$DEVICE_SLOWDOWN"})  # empty arrays need bash 4.4
common=(--data fashion-mnist --epochs "$epochs" --batch "$batch" --limit "$limit" --test-limit 1000 --threads 1
        "${SLOWDOWN[@]}" --lr 0.05 --optimizer sgd:momentum=0.9,wd=5e-4 --schedule constant --quiet)
row() { # name run-folder cut m load
  python3 - "$@" <<'PY'
import json, sys, statistics
name, run, cut, m, load = sys.argv[1:6]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
epochs = [e for e in lines if e.get("event") == "epoch"]
secs = sum(e["train_seconds"] for e in epochs) / len(epochs)
acc = epochs[-1]["test_accuracy"] * 100
# Each epoch's first step warms up (first graph runs, the loader's queue): left out.
steps = [s for s in lines if s.get("event") == "step" and "stages" in s]
first = {}
for s in steps:
    first.setdefault(s["epoch"], s["step"])
steps = [s for s in steps if s["step"] != first[s["epoch"]]]
pred = ""
if steps and "predicted" in steps[0]["stages"]:
    meas = statistics.median(s["stages"]["measured"]["step_s"] for s in steps)
    step = statistics.median(s["stages"]["predicted"]["step_s"] for s in steps)
    pred = f"{step*1e3:.0f} ms predicted, {meas*1e3:.0f} ms measured ({(step/meas-1)*100:+.0f}%)"
    keys = ["device_forward_s", "uplink_s", "edge_s", "downlink_s", "device_backward_s", "device_update_s", "edge_update_s"]
    with open("stages.md", "a") as f:
        f.write(f"{name} (cut {cut}, M {m}), ms predicted/measured: " + ", ".join(
            f"{k[:-2]} {statistics.median(s['stages']['predicted'][k] for s in steps)*1e3:.1f}/"
            f"{statistics.median(s['stages']['measured'][k] for s in steps)*1e3:.1f}" for k in keys) + "\n")
print(f"| {name} | {cut} | {m} | {secs:.1f} | {acc:.2f} | {pred} | {load} |")
PY
}
load() { cut -d' ' -f1 /proc/loadavg; }
plan() { # frozen-layers out
  on_dev $B plan --model $model --edge $ADDR --device-id phone-1 --token $T --batch $batch \
    --micro-batches 1,$ms ${CUTS:+--cuts $CUTS} ${PROBE_BUDGET:+--budget $PROBE_BUDGET} --threads 1 "${SLOWDOWN[@]}" --optimizer sgd:momentum=0.9,wd=5e-4 --frozen-layers "$1" --json > "$2"
}
choice() { python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['choice']['candidate']; print(c['cut'], c['micro_batches'])" "$1"; }
echo "| case | cut | M | train s / epoch | test acc. % | step: predicted vs measured | load |"
echo "|---|---|---|---|---|---|---|"
l=$(load)
on_dev $B train --model $model "${common[@]}" --log-every 1 --out device-only > /dev/null
row "device only" device-only - - "$l"
plan 0 plan.json
read cut m < <(choice plan.json)
l=$(load)
on_dev $B device train --edge $ADDR --device-id phone-1 --token $T --model $model "${common[@]}" \
  --log-every 1 --cut $cut --micro-batches 1 --sequential --plan plan.json --out sequential > /dev/null 2> sequential.err
row sequential sequential $cut 1 "$l"
l=$(load)
on_dev $B device train --edge $ADDR --device-id phone-1 --token $T --model $model "${common[@]}" \
  --log-every 1 --cut $cut --micro-batches $m --plan plan.json --out pipelined > /dev/null 2> pipelined.err
row pipelined pipelined $cut $m "$l"
# A frozen device side: the planner's choice among cuts whose device layers are all frozen.
layers=$($B inspect $model --json | python3 -c "import json,sys; print(len(json.load(sys.stdin)['layers']))")
plan $((layers - 1)) frozen.json
read fcut fm < <(choice frozen.json)
l=$(load)
on_dev $B device train --edge $ADDR --device-id phone-1 --token $T --model $model "${common[@]}" \
  --log-every 1 --cut $fcut --micro-batches $fm --freeze-device --plan frozen.json --out frozen > /dev/null 2> frozen.err
row "pipelined, device frozen" frozen $fcut $fm "$l"
echo
cat stages.md
# The concurrent probe's overlap factors at each cut, for both plans: the device's beside
# the edge's compute and beside its own link's transfers, the edge's, and the device's
# transfers beside its compute.
for f in plan.json frozen.json; do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
k = lambda x: "n/a" if x is None or x["factor"] is None else f"{x['factor']:.2f}"
print(f"{sys.argv[1]}: overlap factors device/device-link/edge/link " + ", ".join(
    f"cut {c['cut']} {k(c['found']['device'])}/{k(c['found'].get('device_link'))}/{k(c['found']['edge'])}"
    f"/{k(c['found'].get('link'))}"
    for c in d["probe"]["concurrent"]))
PY
done
[[ -z $CG ]] || "$NETNS" unthrottle >&2
