#!/bin/bash
# ResNet-20 on 10,000 Fashion-MNIST samples, 10 epochs, step at epoch 7: feasibility of 1.5x
cd "$(dirname "$0")/../../.." && mkdir -p "${O:-/tmp/f10}"
B=${B:-target/release/edgefreeze}   # the run used a copy of the release build of a35f552
COMMON="--model models/resnet20_28.onnx --data fashion-mnist --epochs 10 --batch 64 --lr 0.05 --schedule step:every=7,gamma=0.1 --limit 10000 --test-limit 2000 --engine ort:cpu --quiet --log-every 10 --threads 1 --seed 1"
AUTO="--freeze-every 10 --freeze-warmup 40 --freeze-refresh 100"
run() { name=$1; shift; [ -f ${O:-/tmp/f10}/$name/time.txt ] && return; rm -rf ${O:-/tmp/f10}/$name; /usr/bin/time -f "%e %U %S" -o ${O:-/tmp/f10}/.$name.time $B train $COMMON "$@" --out ${O:-/tmp/f10}/$name > ${O:-/tmp/f10}/$name.log 2>&1; mv ${O:-/tmp/f10}/.$name.time ${O:-/tmp/f10}/$name/time.txt; echo "$name done $(date +%T)"; }
run full
run sched5-157 --freeze schedule:157=5
run auto-cache --freeze auto $AUTO --plot ${O:-/tmp/f10}/auto-cache.png
