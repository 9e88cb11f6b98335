#!/usr/bin/env bash
# Ninth session, call 2 of 3 (${BIN:-.gpu/h} as run_h1.sh): the im2col convolutions against the cp.async ones and cuDNN, the
# image models with ENGINE_CONV_IM2COL=1 (default) and 0 from one binary, yolov3 fp32 (stems padded) beside PyTorch.
set -uo pipefail
(cd "${BIN:-.gpu/h}"; for x in engine_train engine_cuda_tests; do [ -x $x ] || { xz -d -k -f $x.xz; chmod +x $x; }; done)
t0=$(date +%s)
CONV_PERF_RUNS=bf16/wg,bf16/tmab timeout 150 ${BIN:-.gpu/h}/engine_cuda_tests --gtest_also_run_disabled_tests \
  --gtest_filter='ConvCudaPerf.DISABLED_TFlops' > $OUT/conv_perf.log 2>&1
grep -E "TFLOP/s \(" $OUT/conv_perf.log | head -30
echo "elapsed $(( $(date +%s) - t0 )) s"
for m in "yolov3 --batch 8" "deeplabv3 --size torchvision --batch 8"; do for im in 1 0 1 0; do
  ENGINE_CONV_IM2COL=$im timeout 50 ${BIN:-.gpu/h}/engine_train --device cuda --steps 10 --model $m --precision bf16 > $OUT/m.log 2>&1
  echo "engine im2col=$im $m bf16 | $(grep -E '^step (8|9|10) |rror' $OUT/m.log | cut -d'|' -f1-3 | tr '\n' ' ')"
done; done
timeout 50 ${BIN:-.gpu/h}/engine_train --device cuda --steps 8 --model yolov3 --batch 8 --precision fp32 > $OUT/yolo_fp32.log 2>&1
echo "engine yolov3 fp32 | $(grep -E '^step [678] |rror' $OUT/yolo_fp32.log | cut -d'|' -f1-3 | tr '\n' ' ')"
timeout 100 python3 tools/bench/yolov3_torch.py --batch 8 --precision fp32 2>&1 | grep -E "^torch|Error" | tail -2
timeout 100 python3 tools/bench/yolov3_torch.py --batch 8 --precision bf16 2>&1 | grep -E "^torch|Error" | tail -2
echo "elapsed $(( $(date +%s) - t0 )) s"
timeout 150 python3 tools/bench/conv_torch.py --types bf16 2>&1 | tee $OUT/conv_cudnn.log | tail -14
echo "elapsed $(( $(date +%s) - t0 )) s"
