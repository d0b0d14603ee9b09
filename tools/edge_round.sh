#!/usr/bin/env bash
# One round of every case of the EdgeMove benchmark (issue 12), one after another:
# ResNet-20 and MobileNetV2 x0.5 on Fashion-MNIST at 20 Mbit/s (RTT 20 ms), 5 Mbit/s
# (RTT 50 ms) and 100 Mbit/s (RTT 10 ms) with a device as fast as the edge, and at
# 20 Mbit/s with a device 4x and 10x slower (MobileNetV2 also at batch 128 with the 4x
# one). Each case is one `tools/edge_bench.sh` run; its output goes to OUT/NAME.txt and
# its start and end times to OUT/log.txt. Run as root: it brings up the namespaces of
# tools/netns.sh (and takes them down at the end). Edge on CPU 0, device on CPU 1.
#
# THROTTLE says how a device is made slower:
#   cgroup (default)  the device's processes in a CPU cgroup with 1/F of one CPU
#                     (`tools/netns.sh throttle`: 4 ms period for 4x, 10 ms for 10x, the
#                     kernel's least quota being 1 ms), network threads included;
#   engine            every device command with `--slowdown F`: each graph run followed by
#                     a pause of F − 1 times its compute (the network threads run freely).
# CASES (default all) picks cases by name, e.g. CASES="rn20-b32-4x mnv2-b32-4x".
# RN20_CUTS and MNV2_CUTS are the cuts the planner probes (defaults 2,4,8 and 2,10,18, as
# in the rounds of docs/results.md; `all` probes every valid cut, the planner's own
# default, within PROBE_BUDGET, which is then at least 300 s).
# usage: OUT=/tmp/round EDGEFREEZE=target/release/edgefreeze tools/edge_round.sh
set -euo pipefail
HERE=$(dirname "$(realpath "$0")")
ROOT=$(dirname "$HERE")
OUT=$(realpath -m "${OUT:?set OUT to the folder for the results}")
EDGEFREEZE=$(realpath "${EDGEFREEZE:-$ROOT/target/release/edgefreeze}")
export EDGEFREEZE
THROTTLE=${THROTTLE:-cgroup}
[[ $THROTTLE == engine || $THROTTLE == cgroup ]] || { echo "THROTTLE is engine or cgroup" >&2; exit 2; }
mkdir -p "$OUT"
RN20=$ROOT/models/resnet20_28.onnx RC=${RN20_CUTS:-2,4,8}
MNV2=$ROOT/models/mobilenetv2_05_28.onnx MC=${MNV2_CUTS:-2,10,18}
ALL="rn20-b32-eq rn20-b32-5m rn20-b32-100m rn20-b32-4x rn20-b32-10x mnv2-b32-eq mnv2-b32-5m mnv2-b32-100m mnv2-b32-4x mnv2-b32-10x mnv2-b128-4x"
"$HERE/netns.sh" up --up 20mbit --down 20mbit >&2
trap '"$HERE/netns.sh" down >&2 || true' EXIT

# case NAME RATE RTT_MS SLOW MODEL BATCH LIMIT CUTS PROBE_BUDGET
case_() {
  local name=$1 rate=$2 rtt=$3 slow=$4 model=$5 batch=$6 limit=$7 cuts=$8 budget=$9
  [[ " ${CASES:-$ALL} " == *" $name "* ]] || return 0
  "$HERE/netns.sh" rate --up "$rate" --down "$rate" >&2
  local env=(EDGE_CPUS=0 DEVICE_CPUS=1 RTT_MS="$rtt")
  if [[ $cuts == all ]]; then budget=$(( ${budget:-0} > 300 ? budget : 300 ))
  else env+=(CUTS="$cuts"); fi
  [[ -z $budget ]] || env+=(PROBE_BUDGET="$budget")
  if [[ $slow != 1 ]]; then
    if [[ $THROTTLE == engine ]]; then env+=(DEVICE_SLOWDOWN="$slow")
    else env+=(DEVICE_SLOW="$slow" DEVICE_SLOW_PERIOD_US=$((slow == 4 ? 4000 : 10000))); fi
  fi
  echo "== $name start $(date -u +%T) ${env[*]}" >> "$OUT/log.txt"
  local rc=0
  # The case's settings alone: none of the caller's exported ones leak in.
  env -u CUTS -u PROBE_BUDGET -u DEVICE_SLOW -u DEVICE_SLOW_PERIOD_US -u DEVICE_SLOWDOWN "${env[@]}" \
    "$HERE/edge_bench.sh" "$model" "$batch" "$limit" 1 "2,4,8" > "$OUT/$name.txt" 2> "$OUT/$name.err" || rc=$?
  echo "== $name end $(date -u +%T) rc=$rc" >> "$OUT/log.txt"
}
case_ rn20-b32-eq   20mbit 20 1  "$RN20" 32 320 "$RC" ""
case_ rn20-b32-5m   5mbit  50 1  "$RN20" 32 320 "$RC" ""
case_ rn20-b32-100m 100mbit 10 1 "$RN20" 32 320 "$RC" ""
case_ rn20-b32-4x   20mbit 20 4  "$RN20" 32 320 "$RC" 300
case_ rn20-b32-10x  20mbit 20 10 "$RN20" 32 160 "$RC" 900
case_ mnv2-b32-eq   20mbit 20 1  "$MNV2" 32 320 "$MC" ""
case_ mnv2-b32-5m   5mbit  50 1  "$MNV2" 32 320 "$MC" ""
case_ mnv2-b32-100m 100mbit 10 1 "$MNV2" 32 320 "$MC" ""
case_ mnv2-b32-4x   20mbit 20 4  "$MNV2" 32 320 "$MC" 300
case_ mnv2-b32-10x  20mbit 20 10 "$MNV2" 32 160 "$MC" 400
case_ mnv2-b128-4x  20mbit 20 4  "$MNV2" 128 1280 "$MC" 300
echo ALLDONE >> "$OUT/log.txt"
