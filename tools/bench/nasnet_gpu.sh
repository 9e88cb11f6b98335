#!/usr/bin/env bash
# Issue 15's GPU measurements in one call (device time is scarce), engine and PyTorch (timm) on the same GPU:
#   tests    every CUDA test (make test-cuda's binary; ModelsCuda checks cuda == meta for nasnet_large at batch 32
#            in fp32 and bf16)
#   parity   timm's nasnetalarge vs engine --size timm, fp32, training-mode batch norm, two steps, 8 batch orders
#            (tools/bench/nasnet_parity.py), and the small-network reference file the cpu tests read
#   models   nasnet_large at 331x331 batch 32 in $PRECISIONS (default "fp32 bf16"): engine --size timm (timm's
#            network) and the default imagenet size (+ aux head, drop path), vs timm (tools/bench/nasnet_torch.py), one engine profile
#   depthwise the depthwise kernels on NASNet's shapes (ConvCudaPerf.DISABLED_Depthwise) vs PyTorch/cuDNN
#            (tools/bench/conv_torch.py --depthwise), and the average pool (PoolCuda.DISABLED_Bandwidth)
#   compile  timm under torch.compile (fp32, bf16)
#   maxbatch the largest batch under a 24 GiB card's arena: timm (set_per_process_memory_fraction) vs the engine's meta
# Usage on the GPU machine:
#   BIN=build OUT=$OUT tools/bench/nasnet_gpu.sh [tests] [parity] [models] [depthwise] [compile] [maxbatch]
set -uo pipefail
PARTS=${*:-tests parity models depthwise maxbatch}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/nasnet_gpu}
mkdir -p "$OUT"
nvidia-smi -L
run_engine() {  # name, then engine_train flags
  local name=$1; shift
  timeout 120 "$BIN/engine_train" --device cuda --steps 6 "$@" > "$OUT/engine_$name.log" 2>&1
  echo "engine $* | $(grep -E '^step 6|rror' "$OUT/engine_$name.log" | tail -1)"
}
if want tests; then
  echo "== cuda tests"
  timeout 300 "$BIN/engine_cuda_tests" > "$OUT/cuda_tests.log" 2>&1
  grep -E "^\[  FAILED|passed|failed|nasnet" "$OUT/cuda_tests.log" | tail -25
fi
if want parity; then
  echo "== parity: timm nasnetalarge vs engine --size timm (fp32, cuda)"
  timeout 200 python3 tools/bench/nasnet_parity.py --device cuda --engine "$BIN/engine_train" --batch 4 --orders 8 \
    --out "$OUT/parity" 2>&1 | tail -16
  timeout 100 python3 tools/bench/nasnet_parity.py --reference "$OUT/nasnet_reference.safetensors" 2>&1 | tail -2
fi
if want models; then
  echo "== nasnet_large, batch 32, 331x331"
  for p in ${PRECISIONS:-fp32 bf16}; do
    run_engine "timm_$p" --model nasnet_large --size timm --batch 32 --precision "$p"
    run_engine "imagenet_$p" --model nasnet_large --batch 32 --precision "$p"
    timeout 150 python3 tools/bench/nasnet_torch.py --batch 32 --precision "$p" 2>&1 | grep -E "^torch|Error"
  done
  timeout 100 "$BIN/engine_train" --device cuda --steps 3 --model nasnet_large --size timm --batch 32 --precision bf16 \
    --profile > "$OUT/engine_timm_bf16_profile.log" 2>&1
  grep -A30 -E "^\| op" "$OUT/engine_timm_bf16_profile.log" | head -32
fi
if want depthwise; then
  echo "== depthwise convolutions, NASNet shapes, batch 32: engine, then PyTorch"
  "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='ConvCudaPerf.DISABLED_Depthwise:PoolCuda.DISABLED_Bandwidth' 2>&1 | grep -E "^dw|^layer|GB/s"
  timeout 120 python3 tools/bench/conv_torch.py --depthwise 2>&1 | tail -22
fi
if want compile; then
  echo "== timm under torch.compile"
  for p in fp32 bf16; do
    timeout 280 python3 tools/bench/nasnet_torch.py --batch 32 --precision "$p" --compile 2>&1 | grep -E "^torch|Error"
  done
fi
if want maxbatch; then
  echo "== max batch under a 24 GiB card's arena (titanrtx: 24576 MiB less 600 MiB = 23.414 GiB)"
  for p in fp32 bf16; do
    timeout 280 python3 tools/bench/nasnet_torch.py --precision "$p" --max-batch-cap-gib 23.414 --max-batch-from 16 2>&1 | grep -E "^torch|batch|Error"
    "$BIN/engine_train" --model nasnet_large --size timm --precision "$p" --device meta --gpu titanrtx --find-max-batch \
      2>&1 | grep -E "^max batch:"
  done
fi
