#!/usr/bin/env bash
# True-fp32 checks and measurements in one call (device time is scarce): the fp32 CUDA-core flash attention
# (ops/cuda/attention_simt.cu) and Winograd's tile-range chunks (ops/cuda/conv_winograd.cu), engine and PyTorch on the
# same GPU.
#   tests      the CUDA tests of both (AttentionCuda.*, ConvCuda.Winograd*, ConvCuda.PathChoice)
#   bert       bert_squad large 384 x 16 fp32: the engine with flash (fp32 CUDA-core kernels) and naive attention,
#              then transformers with SDPA (memory-efficient kernel) and fused AdamW, both true fp32 (TF32 off)
#   gans       pix2pixhd 2048 x 1024 batch 1 and stylegan 1024^2 batch 4, fp32: the engine (Winograd on, then off)
#              beside tools/bench/{pix2pixhd,stylegan}_torch.py
#   gpt2       transformer_lm --size small at 1024 tokens x 8, fp32 (causal attention, dropout drawn, dQ recomputed
#              on the CUDA-core kernels): the engine with flash and naive attention, then transformers' GPT-2 with
#              SDPA and with its eager attention (tools/bench/gpt2_torch.py)
#   models     every model's cuda ledger against meta's (ModelsCuda.*)
# Usage on the GPU machine: BIN=build OUT=$OUT tools/bench/fp32_gpu.sh [tests] [bert] [gans] [gpt2] [models]
set -uo pipefail
PARTS=${*:-tests bert gans gpt2 models}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/fp32_gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if want tests; then
  echo "== tests"
  timeout 240 "$BIN/engine_cuda_tests" \
    --gtest_filter='AttentionCuda.*:ConvCuda.Winograd*:ConvCuda.PathChoice' > "$OUT/cuda_tests.log" 2>&1
  grep -E '^\[  (PASSED|FAILED) |FAILED|passed|Failure' "$OUT/cuda_tests.log" | head -20
fi
# engine_train NAME ARGS... with flash, then naive attention (8 steps, fp32, cuda): step 8's line of each.
both_attentions() {
  local name=$1
  shift
  for attn in flash naive; do
    timeout 120 "$BIN/engine_train" "$@" --precision fp32 --steps 8 --attention $attn --device cuda \
      > "$OUT/engine_${name}_$attn.log" 2>&1
    echo "engine $name fp32 $attn | $(grep -E '^step 8|rror' "$OUT/engine_${name}_$attn.log" | tail -1)"
  done
}
if want bert; then
  both_attentions bert_squad --model bert_squad --size large --seq 384 --batch 16
  timeout 150 python3 tools/bench/bert_torch.py --size large --fused-adamw \
    --sweep bert_squad:384:16:fp32:sdpa 2>&1 | tail -2 | tee "$OUT/torch_bert_squad.log"
fi
if want gans; then
  for model in "pix2pixhd --batch 1" "stylegan --batch 4"; do
    name=${model%% *}
    for w in 1 0; do
      # shellcheck disable=SC2086
      ENGINE_CONV_WINOGRAD=$w timeout 150 "$BIN/engine_train" --model $model --device cuda --steps 6 --precision fp32 \
        > "$OUT/engine_${name}_winograd$w.log" 2>&1
      echo "engine $name fp32 winograd=$w | $(grep -E '^step 6|rror' "$OUT/engine_${name}_winograd$w.log" | tail -1)"
    done
    timeout 150 python3 "tools/bench/${name}_torch.py" --precision fp32 2>&1 | tail -1 | tee "$OUT/torch_${name}.log"
  done
fi
if want gpt2; then
  both_attentions gpt2 --model transformer_lm --size small --seq 1024 --batch 8
  for attn in sdpa eager; do
    timeout 150 python3 tools/bench/gpt2_torch.py --size small --seq 1024 --batch 8 --precision fp32 --attn $attn 2>&1 |
      tail -1 | tee -a "$OUT/torch_gpt2.log"
  done
fi
if want models; then
  echo "== models"
  timeout 300 "$BIN/engine_cuda_tests" --gtest_filter='ModelsCuda.*' > "$OUT/models_cuda.log" 2>&1
  grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' "$OUT/models_cuda.log" | head -20
fi
