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
# fit the probe's budget.
# Prints one Markdown table row per case.
# usage: tools/edge_bench.sh MODEL BATCH LIMIT EPOCHS "M,M,..."
set -euo pipefail
B=$(realpath "${EDGEFREEZE:-target/release/edgefreeze}")
[[ $# -ge 5 ]] || { sed -n '2,13p' "$0"; exit 2; }
model=$(realpath "$1"); batch=$2; limit=$3; epochs=$4; ms=$5
work=$(mktemp -d)
cd "$work"
echo "files in $work" >&2
T=bench-token-0123456789abcdef
echo "phone-1 $T" > tokens.txt
EX_EDGE="ip netns exec ef-edge"; EX_DEV="ip netns exec ef-dev"; LISTEN=10.210.0.2:50078
[[ -z ${EDGE_CPUS:-} ]] || EX_EDGE="$EX_EDGE taskset -c $EDGE_CPUS"
[[ -z ${DEVICE_CPUS:-} ]] || EX_DEV="$EX_DEV taskset -c $DEVICE_CPUS"
$EX_EDGE $B edge serve --listen $LISTEN --tokens tokens.txt --threads 1 > edge.out 2> edge.err &
EDGE_PID=$!
trap 'kill $EDGE_PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do [[ -s edge.out ]] && break; sleep 0.1; done
ADDR=$(head -1 edge.out | awk '{print $NF}')
common=(--data fashion-mnist --epochs "$epochs" --batch "$batch" --limit "$limit" --test-limit 1000 --threads 1
        --lr 0.05 --optimizer sgd:momentum=0.9,wd=5e-4 --schedule constant --quiet)
row() { # name run-folder plan-json cut m
  python3 - "$@" <<'PY'
import json, sys
name, run, plan, cut, m = sys.argv[1:6]
epochs = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"event":"epoch"' in l]
secs = sum(e["train_seconds"] for e in epochs) / len(epochs)
acc = epochs[-1]["test_accuracy"] * 100
pred = ""
if plan != "-":
    p = json.load(open(plan))
    c = [c for c in p["plan"]["candidates"] if c["candidate"]["cut"] == int(cut) and c["candidate"]["micro_batches"] == int(m)][0]
    steps = len([1 for l in open(f"{run}/metrics.jsonl") if '"event":"step"' in l]) / len(epochs)
    step = c["step_s"] if name != "sequential" else int(m) * c["cycle_s"] + c["device_apply_s"] + c["edge_apply_s"]
    pred = f"{step*1e3:.0f} ms predicted, {secs/steps*1e3:.0f} ms measured ({(step/(secs/steps)-1)*100:+.0f}%)"
print(f"| {name} | {cut} | {m} | {secs:.1f} | {acc:.2f} | {pred} |")
PY
}
plan() { # frozen-layers out
  timeout 900 $EX_DEV $B plan --model $model --edge $ADDR --device-id phone-1 --token $T --batch $batch \
    --micro-batches 1,$ms ${CUTS:+--cuts $CUTS} --threads 1 --optimizer sgd:momentum=0.9,wd=5e-4 --frozen-layers "$1" --json > "$2"
}
choice() { python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['choice']['candidate']; print(c['cut'], c['micro_batches'])" "$1"; }
echo "| case | cut | M | train s / epoch | test acc. % | step: predicted vs measured |"
echo "|---|---|---|---|---|---|"
timeout 3600 $EX_DEV $B train --model $model "${common[@]}" --log-every 1 --out device-only > /dev/null
row "device only" device-only - - - 
plan 0 plan.json
read cut m < <(choice plan.json)
timeout 3600 $EX_DEV $B device train --edge $ADDR --device-id phone-1 --token $T --model $model "${common[@]}" \
  --log-every 1 --cut $cut --micro-batches 1 --sequential --out sequential > /dev/null
row sequential sequential plan.json $cut 1
timeout 3600 $EX_DEV $B device train --edge $ADDR --device-id phone-1 --token $T --model $model "${common[@]}" \
  --log-every 1 --cut $cut --micro-batches $m --out pipelined > /dev/null
row pipelined pipelined plan.json $cut $m
# A frozen device side: the planner's choice among cuts whose device layers are all frozen.
layers=$($B inspect $model --json | python3 -c "import json,sys; print(len(json.load(sys.stdin)['layers']))")
plan $((layers - 1)) frozen.json
read fcut fm < <(choice frozen.json)
timeout 3600 $EX_DEV $B device train --edge $ADDR --device-id phone-1 --token $T --model $model "${common[@]}" \
  --log-every 1 --cut $fcut --micro-batches $fm --freeze-device --out frozen > /dev/null
row "pipelined, device frozen" frozen frozen.json $fcut $fm
