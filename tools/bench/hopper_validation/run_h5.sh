#!/usr/bin/env bash
# Tenth session: the validation branch with the wgmma attention defaults: the whole CUDA suite, then issue 20's bench.
set -uo pipefail
BIN=${BIN:-.gpu/h}
(cd $BIN; for x in engine_train engine_cuda_tests; do xz -d -k -f $x.xz; chmod +x $x; done)
t0=$(date +%s)
timeout 280 $BIN/engine_cuda_tests > $OUT/tests.log 2>&1
echo "== suite rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" $OUT/tests.log | head -20
grep -q "^\[==========\] .* ran" $OUT/tests.log || echo "  (died during: $(grep '^\[ RUN' $OUT/tests.log | tail -1))"
for m in "yolov3 --batch 8" "deeplabv3 --size torchvision --batch 8"; do
  timeout 50 $BIN/engine_train --device cuda --steps 12 --model $m --precision bf16 > $OUT/m_${m%% *}.log 2>&1
  echo "engine $m bf16 | $(grep -E '^step (10|11|12)/|rror' $OUT/m_${m%% *}.log | cut -d'|' -f1-4 | tr '\n' ' ')"
done
timeout 100 python3 tools/bench/yolov3_torch.py --batch 8 --precision bf16 2>&1 | grep -E "^torch yolov3 608|Error" | tail -1
timeout 100 python3 tools/bench/deeplab_torch.py --batch 8 --precision bf16 2>&1 | grep -E "^torch|Error" | tail -1
echo "elapsed $(( $(date +%s) - t0 )) s"
BIN=$BIN OUT=$OUT timeout $(( 570 - $(date +%s) + t0 )) bash tools/bench/transformer_gpu.sh bench
echo "elapsed $(( $(date +%s) - t0 )) s"
