#!/usr/bin/env bash
# Issue 20's GPU measurements in one call (device time is scarce): the transformer family's step time by op
# (engine_train --profile), the flash attention kernels' TFLOP/s, and the steps beside PyTorch's strongest setups.
#   profile  engine --profile of bert_base 512 x 32, bert_squad large 384 x 16, mtdnn 512 x 8, transformer_big
#            8192 tokens (bf16, flash), and the attention kernel benchmark (AttentionCudaBench*)
#   bench    engine steps (bf16 flash, and fp32 naive) beside tools/bench/bert_torch.py --best (SDPA, gathered MLM,
#            fused AdamW; eager and torch.compile), the BERT-Large sweep (rows padded as the engine's synthetic
#            batches pad them, then full rows) and tools/bench/translation_torch.py (its flash
#            backend, then its default), one call
#   ab       a change measured before and after in one call: the attention kernel benchmark and the bert_base
#            512 x 32 bf16 flash step of $BIN_BEFORE's and $BIN's binaries, then PyTorch's best setup
#   variants the flash kernels' configurations: the attention kernel benchmark beside PyTorch's SDPA backends on the
#            same shapes (tools/bench/sdpa_torch.py: cuDNN, FlashAttention-2, memory-efficient), then the bert_base
#            512 x 32 bf16 flash step with each ENGINE_FLASH_TUNING="F,B" of $TUNINGS (ops/cuda/attention.h; default:
#            the defaults, then the overlapped wgmma forward 4), once with ENGINE_FLASH_KEEP_DS=0 (dQ recomputed,
#            ops/attention.h) and once with ENGINE_FLASH_KEEP_DROPOUT=0 (the backward draws dropout again)
# Usage on the GPU machine (binaries built here for sm_90, carried in $BIN):
#   BIN=.gpu OUT=$OUT tools/bench/transformer_gpu.sh profile|bench
#   BIN_BEFORE=.gpu_before BIN=.gpu OUT=$OUT tools/bench/transformer_gpu.sh ab
#   [TUNINGS="-1,-1 4,4"] BIN=.gpu OUT=$OUT tools/bench/transformer_gpu.sh variants
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/transformer_gpu}
mkdir -p "$OUT"
# name | engine flags (each mode adds precision and attention)
CONFIGS=("bert_base|--model bert_base --seq 512 --batch 32"
         "bert_squad|--model bert_squad --size large --seq 384 --batch 16"
         "mtdnn|--model mtdnn --task mnli --seq 512 --batch 8"
         "transformer_big|--model transformer_big --tokens 8192")
# The BERT family: 60 steps, the last step's line and the median of steps 5-60 (a padded batch's step costs its
# rows' lengths: flash attention skips padded key tiles, so steps differ with their batches; 20 steps' medians moved
# by up to 0.5 ms between runs of one binary, 56 steps' by 0.1 ms: H200, 2026-12-04). transformer_big: 40
# steps and the mean of steps 18-40: its token batches come in 17 shapes (one step's batch may hold half the tokens
# of another), and each new shape's first GEMMs stall the host (cuBLASLt's algorithm query, kernels loaded on first
# launch) in the first 17 steps (BENCHMARKS.md, issue 20).
engine_step() {  # name, log, flags...: prints the last step line and the steady state's median (or means)
  local name=$1 log=$2; shift 2
  local steps=60
  case " $* " in *" transformer_big "*) steps=40 ;; esac
  timeout 120 "$BIN/engine_train" --device cuda --steps $steps "$@" > "$log" 2>&1
  echo "engine $name $* | $(grep -E "^step $steps|rror" "$log" | tail -1)"
  if [ "$steps" = 40 ]; then
    grep -E '^step' "$log" | awk -F'|' 'NR >= 18 { ms += $3 + 0; tok += $4 + 0; mfu += $5 + 0; n++ }
      END { if (n) printf "  steps 18-40: mean %.2f ms, %.0f tok/s, %.1f%% MFU\n", ms / n, tok / n, mfu / n }'
  else
    grep -E '^step' "$log" | awk -F'|' 'NR >= 5 { print $3 + 0, $4 + 0, $5 + 0 }' | sort -n | awk '
      { ms[NR] = $1; rate[NR] = $2; mfu[NR] = $3 }
      END { if (NR) { m = int((NR + 1) / 2); printf "  steps 5-'$steps': median %.2f ms (%.1f-%.1f), %.1f /s, %.1f%% MFU\n",
                                               ms[m], ms[1], ms[NR], rate[m], mfu[m] } }'
  fi
}
nvidia-smi -L | tee "$OUT/gpu.txt"
case "${1:-profile}" in
profile)
  for cfg in "${CONFIGS[@]}"; do
    IFS='|' read -r name flags <<< "$cfg"
    engine_step "$name" "$OUT/profile_$name.log" $flags --precision bf16 --attention flash --profile
    awk '/## Time by op/{f=1} /## Memory/{f=0} f' "$OUT/profile_$name.log" | head -30
  done
  echo "== attention kernels"
  timeout 200 "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter='AttentionCudaBench*' \
    > "$OUT/attention_bench.log" 2>&1
  grep -iE "tflop|ms" "$OUT/attention_bench.log" | head -40
  ;;
ab)
  for side in before after; do
    bin=$BIN; [ "$side" = before ] && bin=$BIN_BEFORE
    timeout 200 "$bin/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter='AttentionCudaBench*' \
      > "$OUT/attention_bench_$side.log" 2>&1
    echo "== attention kernels, $side"; grep -iE "tflop" "$OUT/attention_bench_$side.log" | head -24
    BIN=$bin engine_step "bert_base ($side)" "$OUT/ab_bert_base_$side.log" --model bert_base --seq 512 --batch 32 \
      --precision bf16 --attention flash
  done
  timeout 200 python3 tools/bench/bert_torch.py --best --seq 512 --batch 32 --precision bf16 --steps 10 --warmup 3 \
    2>&1 | grep -E "^torch|rror" | tee "$OUT/torch_bert_base.log"
  ;;
variants)
  timeout 200 "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter='AttentionCudaBench*' \
    > "$OUT/attention_bench.log" 2>&1
  echo "== attention kernels"; grep -iE "tflop|ms " "$OUT/attention_bench.log" | head -80
  echo "== PyTorch SDPA, same shapes"
  timeout 200 python3 tools/bench/sdpa_torch.py 2>&1 | tee "$OUT/sdpa_torch.log"
  for t in ${TUNINGS:--1,-1 4,-1}; do
    ENGINE_FLASH_TUNING=$t engine_step "bert_base (ENGINE_FLASH_TUNING=$t)" "$OUT/variants_bert_base_${t/,/_}.log" \
      --model bert_base --seq 512 --batch 32 --precision bf16 --attention flash
  done
  ENGINE_FLASH_KEEP_DS=0 engine_step "bert_base (ENGINE_FLASH_KEEP_DS=0)" "$OUT/variants_bert_base_no_ds.log" \
    --model bert_base --seq 512 --batch 32 --precision bf16 --attention flash
  ENGINE_FLASH_KEEP_DROPOUT=0 engine_step "bert_base (ENGINE_FLASH_KEEP_DROPOUT=0)" \
    "$OUT/variants_bert_base_no_keep.log" --model bert_base --seq 512 --batch 32 --precision bf16 --attention flash
  ;;
bench)
  for cfg in "${CONFIGS[@]}"; do
    IFS='|' read -r name flags <<< "$cfg"
    engine_step "$name" "$OUT/bench_${name}_bf16.log" $flags --precision bf16 --attention flash
  done
  # fp32 with flash attention: the fp32 CUDA-core kernels (ops/cuda/attention_simt.cu)
  engine_step bert_base "$OUT/bench_bert_base_fp32.log" --model bert_base --seq 512 --batch 32 --precision fp32 \
    --attention flash
  echo "== PyTorch"
  timeout 200 python3 tools/bench/bert_torch.py --best --seq 512 --batch 32 --precision bf16 --steps 10 --warmup 3 \
    2>&1 | grep -E "^torch|rror" | tee "$OUT/torch_bert_base.log"
  timeout 200 python3 tools/bench/bert_torch.py --size large --fused-adamw --steps 10 --warmup 3 \
    --sweep bert_squad:384:16:bf16:sdpa,mtdnn:512:8:bf16:sdpa,bert_base:512:32:fp32:sdpa 2>&1 | grep -E "^torch|rror" \
    | tee "$OUT/torch_sweep.log"
  # PyTorch's same two on full rows (no padding mask), as its figures before 2026-12-04 (not the engine's work)
  timeout 200 python3 tools/bench/bert_torch.py --size large --fused-adamw --steps 10 --warmup 3 --padding none \
    --sweep bert_squad:384:16:bf16:sdpa,mtdnn:512:8:bf16:sdpa 2>&1 | grep -E "^torch|rror" \
    | tee -a "$OUT/torch_sweep.log"
  for attn in flash default; do
    timeout 120 python3 tools/bench/translation_torch.py --tokens 8192 --length 128 --precision bf16 --attn "$attn" \
      2>&1 | tail -1 | tee -a "$OUT/torch_transformer_big.log"
  done
  ;;
esac
