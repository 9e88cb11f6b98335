#!/usr/bin/env bash
# The GPU machine's checks and benchmarks, in one call (device time is scarce):
#   1. every CUDA test (make test-cuda's binary), 2. kernel benchmarks (disabled tests: attention TFLOP/s,
#   norm/softmax bandwidth), 3. bert_base training steps, engine vs PyTorch (transformers) on the same GPU.
# Usage (on the GPU machine, binaries built here for sm_90 and carried in $BIN):
#   BIN=.gpu OUT=/tmp/out tools/bench/gpu_checks.sh
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
echo "== cuda tests"
timeout 200 "$BIN/engine_cuda_tests" > "$OUT/cuda_tests.log" 2>&1
grep -E "^\[  FAILED|passed|failed" "$OUT/cuda_tests.log" | tail -25
echo "== kernel benchmarks"
timeout 100 "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_*' > "$OUT/kernel_bench.log" 2>&1
grep -iE "tflop|tb/s|GB/s" "$OUT/kernel_bench.log" | head -40
echo "== bert_base training, engine vs PyTorch"
for cfg in "128 32" "512 8"; do
  set -- $cfg
  timeout 60 "$BIN/engine_train" --model bert_base --device cuda --seq "$1" --batch "$2" --steps 6 > "$OUT/engine_bert_$1.log" 2>&1
  grep -E "^step|error|Error" "$OUT/engine_bert_$1.log" | tail -3
  timeout 80 python3 tools/bench/bert_torch.py --model bert_base --seq "$1" --batch "$2" --precision fp32 --attn eager 2>&1 | tail -1
done
