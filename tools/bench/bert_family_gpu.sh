#!/usr/bin/env bash
# Issue 4's GPU measurements, engine vs PyTorch on the same GPU (device time is scarce: two calls).
#   part 1 (engine): the CUDA tests (helper op families excluded when FILTER says so), the BERT family's
#          training throughput and peak in fp32 and bf16 (naive and flash attention), and the max batch of
#          bert_base seq 512 under a 24 GiB arena, found on the GPU.
#   part 2 (PyTorch): transformers eager and SDPA in fp32 and bf16 autocast at the same configs, one process
#          (tools/bench/bert_torch.py --sweep), and its max batch under the same 24 GiB cap.
# Usage on the GPU machine (binaries built here for sm_90, carried in $BIN):
#   BIN=.gpu OUT=$OUT tools/bench/bert_family_gpu.sh engine|torch
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/bert_family_gpu}
FILTER=${FILTER:-*}
mkdir -p "$OUT"
# model, size flags, seq, batch (PERF.md's configs; mt-dnn on MNLI, a SAN task)
CONFIGS=("bert_base|--size base|128|32" "bert_base|--size base|512|32" "bert_squad|--size large|384|16"
         "mtdnn|--task mnli|512|8")
case "${1:-engine}" in
engine)
  nvidia-smi -L | tee "$OUT/gpu.txt"
  echo "== cuda tests ($FILTER)"
  timeout 260 "$BIN/engine_cuda_tests" --gtest_filter="$FILTER" > "$OUT/cuda_tests.log" 2>&1
  grep -E "^\[  FAILED|passed|failed|cuda peak|steps .*\||bert_base seq 128" "$OUT/cuda_tests.log" | tail -45
  echo "== engine training (last of 6 steps)"
  for cfg in "${CONFIGS[@]}"; do
    IFS='|' read -r model size seq batch <<< "$cfg"
    for run in "fp32 naive" "bf16 naive" "bf16 flash"; do
      set -- $run
      log="$OUT/engine_${model}_${seq}_$1_$2.log"
      timeout 60 "$BIN/engine_train" --model "$model" $size --device cuda --seq "$seq" --batch "$batch" --steps 6 \
        --precision "$1" --attention "$2" > "$log" 2>&1
      echo "engine $model $size seq $seq batch $batch $1 $2 | $(grep -E '^step 6|rror' "$log" | tail -1)"
    done
  done
  echo "== engine max batch, bert_base seq 512, 24 GiB arena on the GPU"
  for run in "fp32 naive" "bf16 naive" "bf16 flash"; do
    set -- $run
    timeout 100 "$BIN/engine_train" --model bert_base --seq 512 --device cuda --memory 24GiB --find-max-batch \
      --precision "$1" --attention "$2" > "$OUT/engine_maxbatch_$1_$2.log" 2>&1
    echo "engine bert_base seq 512 $1 $2 | $(grep -iE 'largest|max batch|rror' "$OUT/engine_maxbatch_$1_$2.log" | tail -2 | tr '\n' ' ')"
  done
  ;;
torch)
  sweep=""
  for cfg in "${CONFIGS[@]}"; do
    IFS='|' read -r model size seq batch <<< "$cfg"
    for p in fp32 bf16; do for a in eager sdpa; do sweep+="${sweep:+,}$model:$seq:$batch:$p:$a"; done; done
  done
  echo "== PyTorch (transformers) training"
  timeout 300 python3 tools/bench/bert_torch.py --size large --steps 5 --warmup 2 --sweep "$sweep" 2>&1 \
    | grep -E "^torch|Error" | tee "$OUT/torch_sweep.log"
  echo "== PyTorch max batch, bert_base seq 512, 24 GiB cap"
  for p in fp32 bf16; do
    timeout 120 python3 tools/bench/bert_torch.py --model bert_base --seq 512 --precision "$p" --attn eager \
      --max-batch-cap-gib 24 2>&1 | grep -E "^torch|Error" | tee -a "$OUT/torch_maxbatch.log"
  done
  ;;
esac
