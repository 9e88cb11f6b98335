#!/usr/bin/env bash
# Issue 6's GPU measurements in one call (device time is scarce), engine and PyTorch on the same GPU:
#   1. convolution TFLOP/s per ResNet-101 / Darknet-53 layer shape, forward / data grad / weight grad, bf16, tf32,
#      fp32: the engine's ConvCudaPerf.DISABLED_TFlops, then cuDNN on the same shapes (tools/bench/conv_torch.py);
#   2. deeplabv3 at 513x513 batch 8 (engine sizes voc = the paper's OS16 and torchvision = OS8, like-for-like)
#      vs torchvision's deeplabv3_resnet101 (tools/bench/deeplab_torch.py) in fp32, tf32 and bf16, plus one
#      engine profile (time by op);
#   3. yolov3 at 608x608 batch 8 in fp32, tf32 and bf16, beside tools/bench/yolov3_torch.py (the same step in PyTorch);
#   4. parity: torchvision vs engine on the GPU, fp32, batch norm in training mode (tools/bench/deeplab_parity.py);
#   5. max batch under a 24 GiB card's arena: torchvision (set_per_process_memory_fraction) vs the engine's meta answer.
#   6. (ab, only when named) two builds of the engine side by side: the second's ConvCuda tests, the convolutions' bf16
#      and tf32 rows of each, then cuDNN, then yolov3 (bf16, fp32) and deeplabv3 (bf16) steps alternated before,
#      after, before, after, then PyTorch's steps of the same.
#   7. (tiles, only when named) the ConvCuda tests, then the bf16 rows of the perf test for the tile shapes
#      (CONV_PERF_RUNS, default by shape, then each shape forced), cuDNN's bf16 with the names of the kernels it ran,
#      and cuBLAS on plain GEMMs of the same sizes (conv_torch.py --gemm).
#   8. (ncu, only when named) Nsight Compute's speed-of-light, warp-state, scheduler, compute and memory sections of one
#      convolution kernel: NCU_KERNEL (a regex of the mangled name; default the forward's 128 x 256 im2col kernel) in
#      the perf test's CONV_PERF_RUNS (default bf16/wg) rows of CONV_PERF_SHAPES (default "Darknet 3x3 128"),
#      NCU_SKIP launches skipped (default 2: past the warm-up), then the same kernel's warp stall reasons (cycles per
#      issued instruction), then cuDNN's forward kernel on the same shape (NCU_CUDNN, a regex of its name) with the
#      same sections, and the engine kernel's sampled stalls per SASS instruction (tools/bench/ncu_hot.py).
#   9. (steps, only when named) yolov3 bf16 batch 8 steps of $BIN_BEFORE and $BIN alternated twice (the last three of
#      10 steps each), then PyTorch's (yolov3_torch.py, channels_last, cudnn.benchmark, AMP).
# Usage on the GPU machine: BIN=.gpu OUT=$OUT tools/bench/vision_gpu.sh [conv] [models] [parity] [maxbatch]
# [ab] [tiles] [ncu] [steps] (BIN_BEFORE=the other build for ab; no argument: the first four parts; name some to split the work over calls
# of the device's 10-minute limit).
set -uo pipefail
PARTS=${*:-conv models parity maxbatch}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/vision_gpu}
mkdir -p "$OUT"
run_engine() {  # name, then engine_train flags
  local name=$1; shift
  timeout 120 "$BIN/engine_train" --device cuda --steps 6 "$@" > "$OUT/engine_$name.log" 2>&1
  echo "engine $* | $(grep -E '^step 6|rror' "$OUT/engine_$name.log" | tail -1)"
}
if want conv; then
echo "== convolutions: engine, then cuDNN"
# The default rows (the perf test's tile-shape and copy variants, bf16/w128 ... bf16/cpa, take another ~100 s: set
# CONV_PERF_RUNS to choose).
CONV_PERF_RUNS=${CONV_PERF_RUNS:-bf16/wg,bf16/v0,tf32,fp32} timeout 250 "$BIN/engine_cuda_tests" \
  --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf*' > "$OUT/conv_engine.log" 2>&1
grep -E "TFLOP|^layer|ratio|vs" "$OUT/conv_engine.log" | head -60
timeout 150 python3 tools/bench/conv_torch.py 2>&1 | tee "$OUT/conv_cudnn.log"
fi
if want models; then
echo "== deeplabv3, batch 8, 513x513"
for p in fp32 tf32 bf16; do
  run_engine "deeplab_voc_$p" --model deeplabv3 --batch 8 --precision "$p"
  run_engine "deeplab_tv_$p" --model deeplabv3 --size torchvision --batch 8 --precision "$p"
  timeout 150 python3 tools/bench/deeplab_torch.py --batch 8 --precision "$p" 2>&1 | grep -E "^torch|Error"
done
timeout 120 "$BIN/engine_train" --device cuda --steps 3 --model deeplabv3 --size torchvision --batch 8 --precision bf16 \
  --profile > "$OUT/engine_deeplab_tv_bf16_profile.log" 2>&1
grep -A25 -iE "^\| op|time by op" "$OUT/engine_deeplab_tv_bf16_profile.log" | head -30
echo "== yolov3, batch 8, 608x608"
for p in fp32 tf32 bf16; do
  run_engine "yolov3_$p" --model yolov3 --batch 8 --precision "$p"
  timeout 150 python3 tools/bench/yolov3_torch.py --batch 8 --precision "$p" 2>&1 | grep -E "^torch yolov3 608|Error"
done
timeout 300 python3 tools/bench/yolov3_torch.py --batch 8 --precision bf16 --compile 2>&1 | grep -E "^torch yolov3 608|Error"
fi
if want parity; then
echo "== deeplabv3 parity on the GPU (fp32, training-mode batch norm)"
timeout 200 python3 tools/bench/deeplab_parity.py --device cuda --engine "$BIN/engine_train" --batch 2 --size 257 \
  --out "$OUT/parity" 2>&1 | tail -6
fi
if want maxbatch; then
echo "== deeplabv3 max batch under a 24 GiB card's arena (titanrtx/rtx6000: 24576 MiB less 600 MiB), torchvision"
for p in fp32 bf16; do
  timeout 200 python3 tools/bench/deeplab_torch.py --precision "$p" --max-batch-cap-gib 23.414 2>&1 | grep -E "^torch|Error"
  "$BIN/engine_train" --model deeplabv3 --size torchvision --precision "$p" --device meta --gpu titanrtx \
    --find-max-batch 2>&1 | grep -E "^max batch:"
done
fi
if want ab; then
echo "== A/B: $BIN_BEFORE (before) and $BIN (after)"
timeout 120 "$BIN/engine_cuda_tests" --gtest_filter='ConvCuda.*' > "$OUT/conv_tests.log" 2>&1
echo "ConvCuda.* of $BIN: $(tail -1 "$OUT/conv_tests.log")"
for b in "$BIN_BEFORE" "$BIN"; do
  CONV_PERF_RUNS=${CONV_PERF_RUNS:-bf16/wg,tf32} timeout 200 "$b/engine_cuda_tests" \
    --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf.DISABLED_TFlops' > "$OUT/conv_ab.log" 2>&1
  echo "-- $b"; grep -E " TFLOP/s \(" "$OUT/conv_ab.log" | sed 's/  */ /g'
done
timeout 150 python3 tools/bench/conv_torch.py --types bf16,tf32 2>&1 | tee "$OUT/conv_cudnn.log"
step() {  # binary, label, steps, engine_train flags
  local b=$1 label=$2 n=$3; shift 3
  timeout 150 "$b/engine_train" --device cuda --steps "$n" "$@" > "$OUT/ab_step.log" 2>&1
  echo "$label $* | $(grep -E "^step ($((n - 2))|$((n - 1))|$n)/|rror" "$OUT/ab_step.log" | tr '\n' ' ')"
}
for round in 1 2; do
  for b in "$BIN_BEFORE" "$BIN"; do
    step "$b" "$b" 10 --model yolov3 --batch 8 --precision bf16
    step "$b" "$b" 10 --model deeplabv3 --size torchvision --batch 8 --precision bf16
    step "$b" "$b" 6 --model yolov3 --batch 8 --precision fp32
  done
done
timeout 150 python3 tools/bench/yolov3_torch.py --batch 8 --precision bf16 2>&1 | grep -E "^torch yolov3 608|Error"
timeout 150 python3 tools/bench/yolov3_torch.py --batch 8 --precision fp32 2>&1 | grep -E "^torch yolov3 608|Error"
timeout 150 python3 tools/bench/deeplab_torch.py --batch 8 --precision bf16 2>&1 | grep -E "^torch|Error"
fi
if want tiles; then
echo "== ConvCuda tests, then the tile shapes' bf16 rows, cuDNN, and cuBLAS on the same GEMM sizes"
timeout 200 "$BIN/engine_cuda_tests" --gtest_filter='ConvCuda.*' > "$OUT/conv_tests.log" 2>&1
echo "ConvCuda.* rc=$?: $(tail -1 "$OUT/conv_tests.log")"
grep -E 'FAILED|Failure' "$OUT/conv_tests.log" | head -10
CONV_PERF_RUNS=${CONV_PERF_RUNS:-bf16/wg,bf16/w128,bf16/w256,bf16/m256} timeout 200 "$BIN/engine_cuda_tests" \
  --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf.DISABLED_TFlops' > "$OUT/conv_tiles.log" 2>&1
grep -E " TFLOP/s \(" "$OUT/conv_tiles.log" | sed 's/  */ /g'
timeout 150 python3 tools/bench/conv_torch.py --types bf16 --kernels 2>&1 | tee "$OUT/conv_cudnn.log"
timeout 150 python3 tools/bench/conv_torch.py --types bf16 --gemm 2>&1 | tee "$OUT/conv_gemm.log"
fi
if want ncu; then
# Bytes through L2 and DRAM and the kernel's time, beside the sections: what each kernel reads per FLOP.
NCU_BYTES=lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,gpu__time_duration.sum
# The warps' stall reasons, cycles per issued instruction (these names ran under ncu 2025 on the H200, 2026-12-07).
NCU_STALLS=""
for r in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle membar \
  mio_throttle no_instruction not_selected selected short_scoreboard sleeping tex_throttle wait; do
  NCU_STALLS=$NCU_STALLS${NCU_STALLS:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
echo "== ncu: ${NCU_KERNEL:=forward_im2col_kernelI.*TmaWsTileILi128ELi256ELi4EEE13__nv_bfloat16} in ${CONV_PERF_SHAPES:=Darknet 3x3 128}"
CONV_PERF_RUNS=${CONV_PERF_RUNS:-bf16/wg} CONV_PERF_SHAPES=$CONV_PERF_SHAPES timeout 300 ncu --kernel-name-base mangled \
  --kernel-name "regex:$NCU_KERNEL" --launch-skip "${NCU_SKIP:-2}" --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --metrics "$NCU_BYTES" "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests \
  --gtest_filter='ConvCudaPerf.DISABLED_TFlops' > "$OUT/conv_ncu.log" 2>&1
echo "ncu rc=$?"
grep -E '^ +[A-Za-z]|----|Section|==PROF==|==ERROR' "$OUT/conv_ncu.log" | head -120
CONV_PERF_RUNS=${CONV_PERF_RUNS:-bf16/wg} CONV_PERF_SHAPES=$CONV_PERF_SHAPES timeout 200 ncu --kernel-name-base mangled \
  --kernel-name "regex:$NCU_KERNEL" --launch-skip "${NCU_SKIP:-2}" --launch-count 1 \
  --metrics "$NCU_STALLS" "$BIN/engine_cuda_tests" \
  --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf.DISABLED_TFlops' > "$OUT/conv_ncu_stalls.log" 2>&1
echo "ncu stalls rc=$?"
grep -E 'stalled|==ERROR' "$OUT/conv_ncu_stalls.log" | sort -k3 -g -r | head -14
# Where the warps wait, per SASS instruction (sampled stall reasons): the mbarrier waits, wgmma's waits or the stores.
CONV_PERF_RUNS=${CONV_PERF_RUNS:-bf16/wg} CONV_PERF_SHAPES=$CONV_PERF_SHAPES timeout 200 ncu --kernel-name-base mangled \
  --kernel-name "regex:$NCU_KERNEL" --launch-skip "${NCU_SKIP:-2}" --launch-count 1 --section SourceCounters \
  --section WarpStateStats -f -o "$OUT/conv_ncu_src" "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests \
  --gtest_filter='ConvCudaPerf.DISABLED_TFlops' > "$OUT/conv_ncu_src.log" 2>&1
echo "ncu source rc=$?"
ncu -i "$OUT/conv_ncu_src.ncu-rep" --page source --csv --print-source sass > "$OUT/conv_ncu_sass.csv" 2>&1
echo "sass rows: $(wc -l < "$OUT/conv_ncu_sass.csv"); the most sampled:"
python3 tools/bench/ncu_hot.py "$OUT/conv_ncu_sass.csv" 30
timeout 200 ncu --kernel-name "regex:${NCU_CUDNN:-sm90_xmma_fprop.*tilesize128x128x64_warpgroupsize1x1x1}" --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --metrics "$NCU_BYTES" \
  python3 tools/bench/conv_torch.py --types bf16 --only "$CONV_PERF_SHAPES" > "$OUT/conv_ncu_cudnn.log" 2>&1
echo "ncu cudnn rc=$?"
grep -E '^ +[A-Za-z]|----|Section|==PROF==|==ERROR' "$OUT/conv_ncu_cudnn.log" | head -120
fi
if want steps; then
echo "== yolov3 bf16 x 8 steps: $BIN_BEFORE (before) and $BIN (after), alternated, then PyTorch"
for round in 1 2; do
  for b in "$BIN_BEFORE" "$BIN"; do
    timeout 90 "$b/engine_train" --device cuda --steps 10 --model yolov3 --batch 8 --precision bf16 > "$OUT/steps.log" 2>&1
    echo "$b | $(grep -E '^step (8|9|10)/|rror' "$OUT/steps.log" | tr '\n' ' ')"
  done
done
timeout 150 python3 tools/bench/yolov3_torch.py --batch 8 --precision bf16 2>&1 | grep -E "^torch yolov3 608|Error"
fi
