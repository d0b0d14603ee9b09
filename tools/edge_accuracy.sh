#!/usr/bin/env bash
# Accuracy parity of split training: ResNet-20 on Fashion-MNIST, LIMIT (2,560) samples x
# EPOCHS (3), batch 32, for each of SEEDS (1 2): local (device only, in the device namespace of
# tools/netns.sh, run as root after `tools/netns.sh up`) and split pipelined at cut CUT (8), M
# micro-batches (4) over the namespace link with a 20 ms round trip added in-process. Run folders
# and the summary go to OUT (relative to the repository root; default edge-accuracy).
# EDGEFREEZE: the binary (default target/release/edgefreeze).
set -u
cd "$(dirname "$(realpath "$0")")/.."
B=$(realpath "${EDGEFREEZE:-target/release/edgefreeze}"); model=$(realpath models/resnet20_28.onnx)
CUT=${CUT:-8}; M=${M:-4}; LIMIT=${LIMIT:-2560}; EPOCHS=${EPOCHS:-3}
work=$(realpath -m "${OUT:-edge-accuracy}"); mkdir -p "$work"; cd "$work"
T=bench-token-0123456789abcdef; echo "phone-1 $T" > tokens.txt
EX_EDGE="ip netns exec ef-edge taskset -c 0"; EX_DEV="ip netns exec ef-dev taskset -c 1"
$EX_EDGE $B edge serve --listen 10.210.0.2:50079 --tokens tokens.txt --threads 1 > edge.out 2> edge.err &
EDGE=$!
for _ in $(seq 50); do [[ -s edge.out ]] && break; sleep 0.1; done
ADDR=$(head -1 edge.out | awk '{print $NF}')
$EX_DEV $B edge shape --to "$ADDR" --rtt-ms 20 --for-s 7200 > shaper.out 2> shaper.err &
SHAPER=$!
trap 'kill $EDGE $SHAPER 2>/dev/null' EXIT
for _ in $(seq 50); do [[ -s shaper.out ]] && break; sleep 0.1; done
VIA=$(head -1 shaper.out | awk '{print $2}')
common=(--data fashion-mnist --epochs $EPOCHS --batch 32 --limit $LIMIT --test-limit 2000 --threads 1
        --lr 0.05 --optimizer sgd:momentum=0.9,wd=5e-4 --schedule constant --quiet)
for seed in ${SEEDS:-1 2}; do
  echo "seed $seed local start $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 1500 $EX_DEV $B train --model $model "${common[@]}" --seed $seed --out local-$seed > /dev/null 2> local-$seed.err
  echo "seed $seed split start $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 1500 $EX_DEV $B device train --edge $VIA --device-id phone-1 --token $T --model $model "${common[@]}" \
    --seed $seed --cut $CUT --micro-batches $M --out split-$seed > /dev/null 2> split-$seed.err
  echo "seed $seed done $(date -u +%T)"
done
python3 - <<'PY'
import json, glob
for run in sorted(glob.glob("local-*") + glob.glob("split-*")):
    try:
        lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    except OSError:
        continue
    ep = [e for e in lines if e.get("event") == "epoch"]
    print(run, " ".join(f"e{e['epoch']}: {e['test_accuracy']*100:.2f}% ({e['train_seconds']:.0f} s)" for e in ep))
PY
