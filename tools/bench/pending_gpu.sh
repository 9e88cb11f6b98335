#!/usr/bin/env bash
# The CUDA changes written without a device, tested and measured in one device call, most wanted first (a call may
# be cut short): the conv1d family's tests with weight_norm's, the reductions' and the GEMMs', convs2s before/after
# (ROUNDS=1) and its bf16 profile, every model's ledger against meta, the fp32 flash kernels' tests and their shared
# dropout draws' A/B (GPT-2 small, BERT-Large), PyTorch's convs2s, what cuBLASLt's algorithm query costs the host per
# new shape (cublaslt_probe heuristic). What each part gave: BENCHMARKS.md's twenty-third session (2026-12-07, the
# conv1d flat GEMMs failing a shape check) and twenty-fourth (their fix passing, landed as 3e6ab7d).
# Usage on the GPU machine: BIN=dir OUT=$OUT tools/bench/pending_gpu.sh [tests] [convs2s] [models] [attention]
# [torch] [probe] (default all, in that order), with dir holding the new build's engine_cuda_tests, engine_train and cublaslt_probe
# (nvcc -O2 -std=c++17 -arch=sm_90 tools/bench/cublaslt_probe.cu -lcublasLt) and dir/before/engine_train the build
# before the changes.
set -uo pipefail
PARTS=${*:-tests convs2s models attention torch probe}
want() { [[ " $PARTS " == *" $1 "* ]]; }
B=${BIN:-build/carry}
OUT=${OUT:-/tmp/call}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
tests() {  # seconds, filter, log
  timeout "$1" "$B/engine_cuda_tests" --gtest_filter="$2" > "$OUT/$3" 2>&1
  echo "$2 rc=$?: $(grep -cE '^\[       OK' "$OUT/$3") ok"
  grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' "$OUT/$3" | head -20
}
if want tests; then
  tests 90 'Conv1dCuda.*:GluCuda.*:MatmulCuda.*:WeightNormCuda.*:ReduceCuda.*:LayerNormCuda.*' conv_tests.log
fi
if want convs2s; then
  ROUNDS=1 PROFILE_PRECISIONS=bf16 BIN=$B BIN_BEFORE=$B/before OUT=$OUT/convs2s timeout 120 \
    tools/bench/convs2s_gpu.sh engine profile
fi
want models && tests 100 'ModelsCuda.EveryModelAllocatesExactlyAsMetaPredicts' models_tests.log
if want attention; then
  tests 60 'AttentionCuda.*' attention_tests.log
  for b in "$B/before" "$B"; do
    n=$(basename "$b")
    timeout 40 "$b/engine_train" --model transformer_lm --size small --seq 1024 --batch 8 --precision fp32 --steps 8 \
      --attention flash --device cuda > "$OUT/gpt2_$n.log" 2>&1
    echo "$n gpt2 fp32 flash | $(grep -E '^step 8|rror' "$OUT/gpt2_$n.log" | tail -1)"
    timeout 30 "$b/engine_train" --model bert_squad --size large --seq 384 --batch 16 --precision fp32 --steps 8 \
      --attention flash --device cuda > "$OUT/squad_$n.log" 2>&1
    echo "$n bert_squad fp32 flash | $(grep -E '^step 8|rror' "$OUT/squad_$n.log" | tail -1)"
  done
fi
want torch && TORCH_CONVS=cudnn BIN=$B OUT=$OUT/convs2s timeout 70 tools/bench/convs2s_gpu.sh torch
want probe && timeout 20 "$B/cublaslt_probe" heuristic
