#!/usr/bin/env bash
# convs2s (fairseq's fconv_wmt_en_de) on the GPU in one call: the conv1d kernels' tests, the engine's step in both
# precisions (and a second build's, for a before/after), the same work in PyTorch, and where the engine's step goes.
#   tests      Conv1dCuda.* and GluCuda.* (the conv1d family against the cpu), MatmulCuda.* (its GEMMs)
#   engine     engine_train --model convs2s --tokens 4000, bf16 and fp32 (TF32 off), 70 steps; with BIN_BEFORE also
#              that build's engine_train, alternately (ROUNDS times each, default 2), for a before/after in one call
#   torch      tools/bench/convs2s_torch.py at 4000 tokens of 25-token sentences, bf16 and fp32, cuDNN and ConvTBC
#   profile    engine_train --profile of the bf16 and fp32 steps, step 40 (its shape seen at step 7): the op table
# The engine's steps are its own length-bucketed batches under the 4000-token budget, PyTorch's one batch of 160 x 25:
# compare target tokens per second. Usage on the GPU machine:
#   BIN=build [BIN_BEFORE=build_before] [ROUNDS=2] [TORCH_CONVS="cudnn tbc"] [PROFILE_PRECISIONS="bf16 fp32"] \
#     OUT=$OUT tools/bench/convs2s_gpu.sh [tests] [engine] [torch] [profile]
set -uo pipefail
PARTS=${*:-tests engine torch profile}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
BIN_BEFORE=${BIN_BEFORE:-}
ROUNDS=${ROUNDS:-2}  # engine: runs of each build, alternated
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
  # 70 steps: the 4000-token budget cuts the corpus into 33 batches of different shapes, and a shape's first step
  # pays cuBLASLt's algorithm queries and first kernel loads on the host. Steps 1-3 run batch 0 twice and the most
  # padded one, steps 4-36 every batch once in the epoch's order (31 shapes new), steps 37-70 the same order again.
  bins=()
  for ((r = 0; r < ROUNDS; r++)); do
    bins+=("$BIN")
    [[ -n "$BIN_BEFORE" ]] && bins+=("$BIN_BEFORE")
  done
  i=0
  for b in "${bins[@]}"; do
    for p in bf16 fp32; do
      log="$OUT/engine_${p}_$i.log"
      timeout 120 "$b/engine_train" --model convs2s --device cuda --precision "$p" --steps 70 > "$log" 2>&1
      echo "$b convs2s $p | $(grep -E '^step 70/|rror' "$log" | tr '\n' ' ')"
      grep -E '^step' "$log" | awk -F'|' '{ ms = $3 + 0; tok = ($4 + 0) * ms / 1000 }
        NR >= 4 && NR <= 36 { cm += ms; ct += tok; cn++ } NR >= 37 { wm += ms; wt += tok; wn++ }
        END { if (cn && wn) printf "  steps 4-36 (first pass): %.1f ms, %.0f tok/s; steps 37-70: %.1f ms, %.0f tok/s\n",
                                   cm / cn, ct * 1000 / cm, wm / wn, wt * 1000 / wm }'
    done
    i=$((i + 1))
  done
fi
if want torch; then
  for p in bf16 fp32; do
    for c in ${TORCH_CONVS:-cudnn tbc}; do
      timeout 120 python3 tools/bench/convs2s_torch.py --tokens 4000 --length 25 --precision "$p" --conv "$c" 2>&1 |
        tail -2 | tee -a "$OUT/torch.log"
    done
  done
fi
if want profile; then
  for p in ${PROFILE_PRECISIONS:-bf16 fp32}; do
    timeout 120 "$BIN/engine_train" --model convs2s --device cuda --precision "$p" --steps 40 --profile \
      > "$OUT/profile_$p.log" 2>&1
    echo "== profile $p"
    grep -E '^## Time' -A24 "$OUT/profile_$p.log" | head -26
  done
fi
