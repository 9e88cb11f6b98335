#!/usr/bin/env bash
# The CUDA changes written without a device, tested and measured in one device call, most wanted first (a call may
# be cut short): the flash attention tests (the warp-specialized TMA forward, attention_fwd_tma.cu, among the wgmma
# variants), the attention kernel benchmark at head dims 64 and 128 (AttentionCudaBench: every forward and backward
# configuration) beside PyTorch's SDPA backends on the same shapes (tools/bench/sdpa_torch.py), and bert_base's step
# with each forward (ENGINE_FLASH_TUNING); `ab`: the benchmark of $BIN_BEFORE's engine_cuda_tests and $BIN's, twice,
# alternating; `ncu`: Nsight Compute's speed-of-light, warp-state and scheduler sections of the warp-specialized forward
# (head dim 128, overlapped tiles) in the benchmark, or of NCU_KERNEL (a regex of the mangled name) in NCU_SHAPE's
# benchmark; `bwdsplit`: the default backward's dK dV and dQ kernels timed one by one by Nsight Compute at both shapes;
# `keepds`: bert_base's step with dS kept for dQ (the default at short keys) and recomputed (ENGINE_FLASH_KEEP_DS=0);
# `suite`: the whole CUDA suite (make test-cuda's binary; SUITE_FILTER a gtest filter instead). BENCH_SHAPE: one
# benchmark (DISABLED_HeadDim128Seq4096) instead of both. What each part gave: BENCHMARKS.md's twenty-fifth and
# twenty-sixth sessions.
# Usage on the GPU machine: BIN=dir [BIN_BEFORE=dir] [ROUNDS=n] OUT=$OUT tools/bench/pending_gpu.sh [tests] [bench]
# [torch] [bert] [ab] [ncu] [bwdsplit] [keepds] [suite] (default: the first four), run in the order listed here, with
# dir holding a build's engine_cuda_tests and engine_train.
set -uo pipefail
PARTS=${*:-tests bench torch bert}
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
want tests && tests 400 'AttentionCuda.*' attention_tests.log
if want bench; then
  timeout 200 "$B/engine_cuda_tests" --gtest_also_run_disabled_tests \
    --gtest_filter="AttentionCudaBench.${BENCH_SHAPE:-*}" > "$OUT/attention_bench.log" 2>&1
  echo "AttentionCudaBench rc=$?"
  grep -E ' (fwd|bwd) ' "$OUT/attention_bench.log"
fi
if want torch; then
  timeout 150 python3 tools/bench/sdpa_torch.py --shapes 32x12x512x64,8x16x4096x128 > "$OUT/sdpa_torch.log" 2>&1
  echo "sdpa_torch rc=$?"
  grep -E 'cudnn|flash2' "$OUT/sdpa_torch.log" | grep -v unsupported
fi
if want bert; then
  for tuning in -1,-1 5,-1 6,-1; do
    ENGINE_FLASH_TUNING=$tuning timeout 60 "$B/engine_train" --device cuda --model bert_base --seq 512 --batch 32 \
      --precision bf16 --attention flash --steps 30 > "$OUT/bert_$tuning.log" 2>&1
    echo "bert_base ENGINE_FLASH_TUNING=$tuning | $(grep -E '^step 30|rror' "$OUT/bert_$tuning.log" | tail -1)"
    grep -E '^step' "$OUT/bert_$tuning.log" | awk -F'|' 'NR >= 5 { print $3 + 0 }' | sort -n |
      awk '{ a[NR] = $1 } END { if (NR) printf "  steps 5-30: median %.2f ms (%.2f-%.2f)\n", a[int((NR + 1) / 2)], a[1], a[NR] }'
  done
fi
if want ab; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for b in "$BIN_BEFORE" "$B"; do
      timeout 120 "$b/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter='AttentionCudaBench.*' \
        > "$OUT/ab_${round}_$(basename "$b").log" 2>&1
      echo "== round $round, $b: rc=$?"
      grep -E ' fwd ' "$OUT/ab_${round}_$(basename "$b").log"
    done
  done
fi
if want ncu; then
  timeout 200 ncu --kernel-name-base mangled --kernel-name "regex:${NCU_KERNEL:-TmaFwdConfigILi128ELb1E}" --launch-skip 5 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    "$B/engine_cuda_tests" --gtest_also_run_disabled_tests \
    --gtest_filter="AttentionCudaBench.DISABLED_${NCU_SHAPE:-HeadDim128Seq4096}" > "$OUT/ncu_tma.log" 2>&1
  echo "ncu rc=$?"
  grep -vE '^(flash|B x H|[0-9]+x[0-9]+x)' "$OUT/ncu_tma.log" | grep -E '^ +[A-Z]|----|Section' | head -80
fi
if want bwdsplit; then  # the default backward's kernels one by one (ncu's clocks): delta, dK dV, dQ
  # (the first launches of the default's kernels: the dK dV and dQ passes of the wgmma variant rows, dS kept at 512)
  for shape in 64Seq512 128Seq4096; do
    if [[ $shape == 64* ]]; then re='WgDkdvConfigILi64ELi1|WgDqDsConfigILi64ELi1'; else re='WgDkdvConfigILi128ELi2|WgDqConfigILi128ELi2'; fi
    timeout 400 ncu --kernel-name-base mangled --kernel-name regex:"$re" --launch-count 4 \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
      "$B/engine_cuda_tests" --gtest_also_run_disabled_tests --gtest_filter="AttentionCudaBench.DISABLED_HeadDim$shape" \
      > "$OUT/bwdsplit_$shape.log" 2>&1
    echo "bwdsplit $shape rc=$?"
    grep -E '^  [a-z_]+.*\(|gpu__time_duration|sm__throughput' "$OUT/bwdsplit_$shape.log" | sed -E 's/\(const .*//' | head -40
  done
fi
if want keepds; then  # bert_base's step with dS kept for dQ (the default at short keys) and recomputed
  for round in 1 2; do
    for keep in 1 0; do
      ENGINE_FLASH_KEEP_DS=$keep timeout 60 "$B/engine_train" --device cuda --model bert_base --seq 512 --batch 32 \
        --precision bf16 --attention flash --steps 30 > "$OUT/keepds_${round}_$keep.log" 2>&1
      echo "bert_base ENGINE_FLASH_KEEP_DS=$keep | $(grep -E '^step 30|rror' "$OUT/keepds_${round}_$keep.log" | tail -1)"
      grep -E '^step' "$OUT/keepds_${round}_$keep.log" | awk -F'|' 'NR >= 5 { print $3 + 0 }' | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) printf "  steps 5-30: median %.2f ms (%.2f-%.2f)\n", a[int((NR + 1) / 2)], a[1], a[NR] }'
    done
  done
fi
want suite && tests 400 "${SUITE_FILTER:-*}" suite.log
