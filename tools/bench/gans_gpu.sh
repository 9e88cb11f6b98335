#!/usr/bin/env bash
# Issues 16 and 17's GPU checks and measurements for pix2pixhd and stylegan in one call (device time is scarce),
# engine and PyTorch on the same GPU:
#   1. tests: instance norm, add_noise and the synthetic painter against the cpu (the CUDA tests), instance norm's bandwidth at
#      pix2pixHD's largest shapes, and every model's cuda ledger against meta's (both GANs included);
#   2. speed: pix2pixhd at 2048 x 1024 batch 1 and stylegan at 1024 x 1024 batch 4, fp32 and bf16: the engine (step 6)
#      beside tools/bench/pix2pixhd_torch.py and stylegan_torch.py (each written from its architecture,
#      channels_last, cudnn.benchmark, autocast for bf16);
#   3. the max batch under the 2020 cards' arenas on the GPU itself, beside meta's answer for the same --gpu.
#   4. variants: PyTorch's stylegan under each memory format and blur (its fastest setup is the reference);
#   5. batch8: stylegan at batch 8, both sides; 6. profile: both sides' time by kernel, bf16.
# Usage on the GPU machine: BIN=build/carry OUT=$OUT tools/bench/gans_gpu.sh [tests] [speed] [maxbatch] [variants]
#   [batch8] [profile]   (all six take more than one 600 s call: tests+speed, then variants, then the rest)
set -uo pipefail
PARTS=${*:-tests speed maxbatch variants batch8 profile}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/gans_gpu}
mkdir -p "$OUT"
if want tests; then
  echo "== tests"
  timeout 300 "$BIN/engine_cuda_tests" \
    --gtest_filter='InstanceNormCuda.*:BatchNormCuda.*:ElementwiseCuda.*:PaintRectanglesCuda.*:ModelsCuda.*' > "$OUT/cuda_tests.log" 2>&1
  grep -E 'passed|FAILED' "$OUT/cuda_tests.log" | tail -5
  timeout 120 "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='InstanceNormCuda.DISABLED_Bandwidth' 2>&1 | grep -E 'GB/s' | tee "$OUT/instance_norm_bandwidth.log"
fi
if want speed; then
  for model in "pix2pixhd --batch 1" "stylegan --batch 4"; do
    name=${model%% *}
    echo "== $model: engine, then PyTorch"
    for p in fp32 bf16; do
      # shellcheck disable=SC2086
      timeout 150 "$BIN/engine_train" --model $model --device cuda --steps 6 --precision "$p" \
        > "$OUT/engine_${name}_$p.log" 2>&1
      echo "engine $name $p | $(grep -E '^step 6|rror' "$OUT/engine_${name}_$p.log" | tail -1)"
      timeout 150 python3 "tools/bench/${name}_torch.py" --precision "$p" 2>&1 | tail -1 |
        tee "$OUT/torch_${name}_$p.log"
    done
  done
fi
if want variants; then
  # PyTorch's stylegan step took 6-8 s at batch 4 with autograd's double backward of its convolutions (2026-12-02:
  # every variant below; --blur planes did not finish 4 steps in 120 s): the reference runs --conv gradfix.
  echo "== stylegan: PyTorch variants (memory format x blur), 3 timed steps each"
  for p in fp32 bf16; do
    for fmt in channels_last contiguous; do
      for b in depthwise planes; do
        timeout 120 python3 tools/bench/stylegan_torch.py --precision "$p" --memory-format "$fmt" --blur "$b" \
          --steps 3 --warmup 1 2>&1 | tail -1 | tee "$OUT/torch_stylegan_${p}_${fmt}_$b.log"
      done
    done
  done
fi
if want batch8; then
  echo "== stylegan --batch 8: engine, then PyTorch"
  for p in fp32 bf16; do
    timeout 150 "$BIN/engine_train" --model stylegan --batch 8 --device cuda --steps 6 --precision "$p" \
      > "$OUT/engine_stylegan8_$p.log" 2>&1
    echo "engine stylegan b8 $p | $(grep -E '^step 6|rror' "$OUT/engine_stylegan8_$p.log" | tail -1)"
    timeout 150 python3 tools/bench/stylegan_torch.py --batch 8 --precision "$p" 2>&1 | tail -1 |
      tee "$OUT/torch_stylegan8_$p.log"
  done
fi
if want profile; then
  echo "== where the time goes, bf16: the engine's --profile and torch.profiler's top kernels"
  for model in "pix2pixhd --batch 1" "stylegan --batch 4"; do
    name=${model%% *}
    # shellcheck disable=SC2086
    timeout 100 "$BIN/engine_train" --model $model --device cuda --steps 3 --precision bf16 --profile \
      > "$OUT/profile_engine_$name.log" 2>&1
    timeout 150 python3 "tools/bench/${name}_torch.py" --precision bf16 --profile --warmup 1 \
      > "$OUT/profile_torch_$name.log" 2>&1
  done
fi
if want maxbatch; then
  echo "== max batch per 2020 card: cuda, then meta"
  for name in pix2pixhd stylegan; do
    for g in rtx2080ti titanrtx rtx8000; do
      for d in cuda meta; do
        timeout 150 "$BIN/engine_train" --model "$name" --device "$d" --gpu "$g" --find-max-batch \
          > "$OUT/maxbatch_${name}_${g}_$d.log" 2>&1
        echo "$name $g $d | $(grep -E '^max batch:|rror' "$OUT/maxbatch_${name}_${g}_$d.log" | head -1)"
      done
    done
  done
fi
