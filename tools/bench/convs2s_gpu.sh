#!/usr/bin/env bash
# convs2s (fairseq's fconv_wmt_en_de) on the GPU in one call: the conv1d kernels' tests, the engine's step in both
# precisions (and a second build's, for a before/after), the same work in PyTorch, and where the engine's step goes.
#   tests      Conv1dCuda.* and GluCuda.* (the conv1d family against the cpu), MatmulCuda.* (its GEMMs)
#   engine     engine_train --model convs2s --tokens 4000, bf16 and fp32 (TF32 off), steps 8; with BIN_BEFORE also
#              that build's engine_train, alternately, for a before/after in the same call
#   torch      tools/bench/convs2s_torch.py at 4000 tokens of 25-token sentences, bf16 and fp32, cuDNN and ConvTBC
#   profile    engine_train --profile of the bf16 and fp32 steps (the op table: conv1d_backward, linear, ...)
# The engine's steps are its own length-bucketed batches under the 4000-token budget, PyTorch's one batch of 160 x 25:
# compare target tokens per second. Usage on the GPU machine:
#   BIN=build [BIN_BEFORE=build_before] OUT=$OUT tools/bench/convs2s_gpu.sh [tests] [engine] [torch] [profile]
set -uo pipefail
PARTS=${*:-tests engine torch profile}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
BIN_BEFORE=${BIN_BEFORE:-}
OUT=${OUT:-/tmp/convs2s_gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if want tests; then
  echo "== tests"
  timeout 240 "$BIN/engine_cuda_tests" --gtest_filter='Conv1dCuda.*:GluCuda.*:MatmulCuda.*' > "$OUT/cuda_tests.log" 2>&1
  grep -E '^\[  (PASSED|FAILED) |FAILED|passed|Failure' "$OUT/cuda_tests.log" | head -20
  timeout 120 "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter='Conv1dCuda.DISABLED_Throughput' \
    2>&1 | grep '^conv1d' | tee "$OUT/conv1d_throughput.log"
fi
if want engine; then
  bins=("$BIN")
  [[ -n "$BIN_BEFORE" ]] && bins+=("$BIN_BEFORE" "$BIN" "$BIN_BEFORE")
  i=0
  for b in "${bins[@]}"; do
    for p in bf16 fp32; do
      log="$OUT/engine_${p}_$i.log"
      timeout 120 "$b/engine_train" --model convs2s --device cuda --precision "$p" --steps 8 > "$log" 2>&1
      echo "$b convs2s $p | $(grep -E '^step (6|7|8)/|rror' "$log" | tr '\n' ' ')"
    done
    i=$((i + 1))
  done
fi
if want torch; then
  for p in bf16 fp32; do
    for c in cudnn tbc; do
      timeout 120 python3 tools/bench/convs2s_torch.py --tokens 4000 --length 25 --precision "$p" --conv "$c" 2>&1 |
        tail -2 | tee -a "$OUT/torch.log"
    done
  done
fi
if want profile; then
  for p in bf16 fp32; do
    timeout 120 "$BIN/engine_train" --model convs2s --device cuda --precision "$p" --steps 6 --profile \
      > "$OUT/profile_$p.log" 2>&1
    echo "== profile $p"
    grep -E '^## Time' -A24 "$OUT/profile_$p.log" | head -26
  done
fi
