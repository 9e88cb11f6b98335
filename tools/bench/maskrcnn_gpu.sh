#!/usr/bin/env bash
# Issue 18's GPU checks and measurements for maskrcnn in one call (device time is scarce), engine and torchvision on
# the same GPU:
#   tests     the detection ops' and RoIAlign's CUDA tests (polygon masks included) and every model's cuda ledger
#             against meta's (ModelsCuda: maskrcnn's tiny training and inference steps among them);
#   speed     maskrcnn at 800 x 1333, batch 2 and 4, fp32 and bf16: the engine (the mean of steps 4-8) beside
#             tools/bench/maskrcnn_torch.py (torchvision's MaskRCNN, the same network; fp32, bf16 and fp16 autocast);
#   peak      the engine's cuda peak against meta's prediction at full size, fp32 and bf16, batch 2;
#   maxbatch  the max batch under the 2020 cards' arenas, cuda beside meta;
#   parity    torchvision's maskrcnn_resnet50_fpn at 800 x 1344 with random weights (tools/bench/maskrcnn_parity.py
#             --size full) against the engine with the same weights on the GPU, fp32 (MaskRcnnCuda.*).
# Usage on the GPU machine: BIN=build/carry OUT=$OUT tools/bench/maskrcnn_gpu.sh [tests] [speed] [peak] [maxbatch]
set -uo pipefail
PARTS=${*:-tests speed peak maxbatch parity}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/maskrcnn_gpu}
mkdir -p "$OUT"
if want tests; then
  echo "== tests"
  timeout 300 "$BIN/engine_cuda_tests" --gtest_filter='DetectionCuda.*:RoiAlignCuda.*:PaintRectanglesCuda.*:ModelsCuda.*' \
    > "$OUT/cuda_tests.log" 2>&1
  grep -E '^\[  (PASSED|FAILED) |FAILED  \]' "$OUT/cuda_tests.log" | tail -8
fi
if want speed; then
  for b in 2 4; do
    for p in fp32 bf16; do
      timeout 200 "$BIN/engine_train" --model maskrcnn --batch "$b" --device cuda --steps 8 --precision "$p" \
        > "$OUT/engine_b${b}_$p.log" 2>&1
      echo "engine maskrcnn b$b $p | $(grep -E '^step 8|rror' "$OUT/engine_b${b}_$p.log" | tail -1)"
    done
    for p in fp32 bf16 fp16; do
      timeout 200 python3 tools/bench/maskrcnn_torch.py --batch "$b" --precision "$p" 2>&1 | tail -1 |
        tee "$OUT/torch_b${b}_$p.log"
    done
  done
fi
if want peak; then
  echo "== peak: cuda, then meta"
  for p in fp32 bf16; do
    for d in cuda meta; do
      timeout 150 "$BIN/engine_train" --model maskrcnn --device "$d" --steps 2 --precision "$p" \
        > "$OUT/peak_${p}_$d.log" 2>&1
      echo "$p $d | $(grep -E 'peak|rror' "$OUT/peak_${p}_$d.log" | head -2 | tr '\n' ' ')"
    done
  done
fi
if want maxbatch; then
  echo "== max batch per 2020 card: cuda, then meta"
  for g in rtx2080ti titanrtx rtx8000; do
    for d in cuda meta; do
      timeout 200 "$BIN/engine_train" --model maskrcnn --device "$d" --gpu "$g" --find-max-batch \
        > "$OUT/maxbatch_${g}_$d.log" 2>&1
      echo "maskrcnn $g $d | $(grep -E '^max batch:|rror' "$OUT/maxbatch_${g}_$d.log" | head -1)"
    done
  done
fi
if want parity; then
  echo "== parity with maskrcnn_resnet50_fpn at full size"
  timeout 200 python3 tools/bench/maskrcnn_parity.py --size full --device cuda --out /tmp/maskrcnn_full.safetensors 2>&1 |
    tail -1
  MASKRCNN_FULL_REFERENCE=/tmp/maskrcnn_full.safetensors timeout 200 "$BIN/engine_cuda_tests" \
    --gtest_filter='MaskRcnnCuda.*' > "$OUT/parity.log" 2>&1
  grep -E 'relative error|PASSED|FAILED|Failure' "$OUT/parity.log" | head -60
fi
