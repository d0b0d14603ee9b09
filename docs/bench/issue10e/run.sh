#!/bin/bash
# ResNet-20 on 10,000 Fashion-MNIST samples, 10 epochs, step at epoch 7 (the recipe of
# docs/bench/issue10d), full training and --freeze auto with the cache, seeds 1 and 2,
# after the int8 reference's weights went to 7 bits. One run at a time on a quiet machine.
cd "$(dirname "$0")/../../.." && O=${O:-/tmp/f10e} && mkdir -p "$O"
B=${B:-target/release/edgefreeze}
AUTO="--freeze-every 10 --freeze-warmup 40 --freeze-refresh 100"
run() {
  seed=$1; name=$2; shift 2; d=$O/$name-s$seed
  [ -f $d/time.txt ] && return; rm -rf $d
  /usr/bin/time -f "%e %U %S" -o $O/.$name-s$seed.time $B train --model models/resnet20_28.onnx \
    --data fashion-mnist --epochs 10 --batch 64 --lr 0.05 --schedule step:every=7,gamma=0.1 \
    --limit 10000 --test-limit 2000 --engine ort:cpu --quiet --log-every 10 --threads 1 \
    --seed $seed "$@" --out $d > $d.log 2>&1
  mv $O/.$name-s$seed.time $d/time.txt; echo "$name seed $seed done $(date -u +%T)"
}
# Full training with seed 1 is docs/bench/issue10d's run (20:11 UTC the same day): it
# builds no reference model, so the change does not touch it.
run 1 auto-cache --freeze auto $AUTO --plot $O/auto-cache-s1.png
run 2 full
run 2 auto-cache --freeze auto $AUTO --plot $O/auto-cache-s2.png
