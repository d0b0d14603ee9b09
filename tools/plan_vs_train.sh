#!/usr/bin/env bash
# Predicted (edgefreeze plan) against measured (edgefreeze device train) step times, for
# a few (cut, M) of one model on Fashion-MNIST, on loopback or inside the namespaces of
# tools/netns.sh (NS = anything: run as root after `tools/netns.sh up`). Measured = the
# epoch's training seconds / steps (so it includes data loading); the schedule spans are
# the first three steps from their first device span to the edge update's end.
# EDGEFREEZE is the binary (default target/release/edgefreeze); EDGE_CPUS and DEVICE_CPUS
# (taskset lists, e.g. 0 and 1) pin the edge server and the device to CPUs of their own.
# usage: tools/plan_vs_train.sh MODEL BATCH LIMIT "CUT:M[:seq] ..." [NS]   (NS: run inside tools/netns.sh namespaces "ef")
set -euo pipefail
B=${EDGEFREEZE:-target/release/edgefreeze}
[[ $# -ge 4 ]] || { sed -n '2,8p' "$0"; exit 2; }
model=$(realpath "$1"); batch=$2; limit=$3; cases=$4; ns=${5:-}
B=$(realpath "$B")
work=$(mktemp -d)
cd "$work"
echo "files in $work"
T=val-token-0123456789abcdef
echo "phone-1 $T" > tokens.txt
if [[ -n $ns ]]; then
  EX_EDGE="ip netns exec ef-edge"; EX_DEV="ip netns exec ef-dev"; LISTEN=10.210.0.2:50077
else
  EX_EDGE=""; EX_DEV=""; LISTEN=127.0.0.1:0
fi
[[ -z ${EDGE_CPUS:-} ]] || EX_EDGE="$EX_EDGE taskset -c $EDGE_CPUS"
[[ -z ${DEVICE_CPUS:-} ]] || EX_DEV="$EX_DEV taskset -c $DEVICE_CPUS"
$EX_EDGE $B edge serve --listen $LISTEN --tokens tokens.txt --threads 1 > edge.out 2> edge.err &
EDGE_PID=$!
trap 'kill $EDGE_PID 2>/dev/null || true' EXIT
for i in $(seq 50); do [[ -s edge.out ]] && break; sleep 0.1; done
ADDR=$(head -1 edge.out | awk '{print $NF}')
cuts=$(for c in $cases; do echo ${c%%:*}; done | sort -un | paste -sd,)
ms=$(for c in $cases; do x=${c#*:}; echo ${x%%:*}; done | sort -un | paste -sd,)
timeout 600 $EX_DEV $B plan --model $model --edge $ADDR --device-id phone-1 --token $T --batch $batch \
  --micro-batches $ms --cuts $cuts --threads 1 --optimizer sgd:momentum=0.9,wd=5e-4 --json > plan.json
echo "probe took $(python3 -c 'import json; print(round(json.load(open("plan.json"))["probe"]["elapsed_s"],2))') s"
for c in $cases; do
  IFS=: read cut m seq <<< "$c"
  extra=""; mode=pipelined
  if [[ "$seq" == seq ]]; then extra="--sequential"; mode=sequential; fi
  rm -rf run
  timeout 900 $EX_DEV $B device train --edge $ADDR --device-id phone-1 --token $T --model $model --data fashion-mnist \
    --cut $cut --micro-batches $m $extra --epochs 1 --batch $batch --limit $limit --test-limit 64 --threads 1 --quiet --out run > /dev/null
  python3 - "$cut" "$m" "$mode" "$batch" "$limit" <<'PY'
import json, sys
cut, m, mode, batch, limit = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
plan = json.load(open("plan.json"))
pred = [c for c in plan["plan"]["candidates"] if c["candidate"]["cut"] == cut and c["candidate"]["micro_batches"] == m][0]
step_s = pred["step_s"]
if mode == "sequential":
    # the same measurements, window 1: T = M*C + updates
    step_s = m * pred["cycle_s"] + pred["device_apply_s"] + pred["edge_apply_s"]
epoch = [json.loads(l) for l in open("run/metrics.jsonl") if '"epoch"' in l and "train_seconds" in l][-1]
steps = limit // batch
measured = epoch["train_seconds"] / steps
sched = json.load(open("run/schedule.json"))
def dur(s):
    t0 = min(d["start_us"] for d in s["device"]); t1 = max(d["end_us"] for d in s["device"]); return (t1 - t0) / 1e6
firsts = [round(dur(s)*1e3, 1) for s in sched]
print(f"cut {cut} M={m} {mode}: predicted {step_s*1e3:.1f} ms, measured {measured*1e3:.1f} ms/step over {steps} steps "
      f"({(step_s/measured-1)*100:+.0f}%); first steps' schedule spans {firsts} ms")
PY
done
