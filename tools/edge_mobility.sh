#!/usr/bin/env bash
# The EdgeMove mobility case: a device trains with edge server A over an emulated link
# that degrades mid-run (`edgefreeze edge shape --change`: the device moves away), while
# server B stays reachable over a slower but steady link. Two runs of the same recipe,
# each behind fresh shapers with the same rate schedule (timed from the shapers' start):
#   1. `device train --adapt` (re-plans when its measured step drifts; migrates to B),
#   2. the same with re-planning off (--adapt-drift 1e6: it never re-probes; stays on A).
# CUTS (e.g. 4,8) limits the cuts the adaptive runs probe and re-plan among (every cut of a
# deep model on two servers does not fit the probe's budget); BUDGET is that probe's budget
# in seconds (default 60).
# Both servers and both shapers run on loopback: no root needed. The servers are pinned to
# EDGE_CPUS (default 0), the device to DEVICE_CPUS (default 1).
# Prints both runs' training seconds and the adaptive run's decisions; the adaptive run's
# step-time chart (moves marked) is OUT/adapt-steps.png.
# usage: tools/edge_mobility.sh MODEL BATCH LIMIT CUT M A_MBIT DEGRADED_MBIT B_MBIT CHANGE_S RTT_MS OUT
set -euo pipefail
[[ $# -ge 11 ]] || { sed -n '2,13p' "$0"; exit 2; }
B=$(realpath "${EDGEFREEZE:-target/release/edgefreeze}")
model=$(realpath "$1"); batch=$2; limit=$3; cut=$4; m=$5; a=$6; degraded=$7; b=$8; change=$9; rtt=${10}
mkdir -p "${11}"; out=$(realpath "${11}")
work=$(mktemp -d)
cd "$work"
echo "files in $work" >&2
T=mobility-token-0123456789abcdef
echo "phone-1 $T" > tokens.txt
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
first_line() { for _ in $(seq 100); do [[ -s $1 ]] && break; sleep 0.1; done; head -1 "$1"; }
for s in a b; do
  taskset -c "${EDGE_CPUS:-0}" $B edge serve --listen 127.0.0.1:0 --tokens tokens.txt --threads 1 > $s.out 2> $s.err &
  pids+=($!)
done
A=$(first_line a.out | awk '{print $NF}'); BB=$(first_line b.out | awk '{print $NF}')
run() { # name extra-args...
  local name=$1; shift
  $B edge shape --to "$A" --up-mbit "$a" --down-mbit "$a" --rtt-ms "$rtt" --change "$change:$degraded:$degraded" \
    --for-s 3600 > shape-a-$name.out 2> shape-a-$name.err &
  local sa=$!
  $B edge shape --to "$BB" --up-mbit "$b" --down-mbit "$b" --rtt-ms "$rtt" --for-s 3600 > shape-b-$name.out 2>&1 &
  local sb=$!
  pids+=($sa $sb)
  local via_a via_b
  via_a=$(first_line shape-a-$name.out | awk '{print $2}'); via_b=$(first_line shape-b-$name.out | awk '{print $2}')
  timeout 1800 taskset -c "${DEVICE_CPUS:-1}" $B device train --edge "$via_a,$via_b" --device-id phone-1 --token $T \
    --model "$model" --data fashion-mnist --epochs 1 --batch "$batch" --limit "$limit" --test-limit 1000 \
    --threads 1 --lr 0.05 --optimizer sgd:momentum=0.9,wd=5e-4 --schedule constant --log-every 1 \
    --cut "$cut" --micro-batches "$m" --adapt --adapt-budget "${BUDGET:-60}" ${CUTS:+--adapt-cuts $CUTS} --plot "$out/$name.png" --out "$name" "$@" \
    > "$name.log" 2>&1
  kill $sa $sb 2>/dev/null || true
  python3 - "$name" <<'PY'
import json, sys
name = sys.argv[1]
lines = [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
e = [l for l in lines if l.get("event") == "epoch"][-1]
moves = [l for l in lines if l.get("event") == "decision"]
print(f"{name}: {e['train_seconds']:.1f} s training, test accuracy {e['test_accuracy']*100:.2f}%, {len(moves)} decision(s)")
for d in moves:
    print(f"  after update {d['step']}: {d['kind']}: {d['reason']}")
PY
}
run adapt
run stay --adapt-drift 1000000
grep -h "Mbit/s" shape-a-*.err >&2 || true
