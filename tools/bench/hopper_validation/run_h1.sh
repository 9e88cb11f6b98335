#!/usr/bin/env bash
# Ninth session (written without a device): h = branch next/hopper-validation (main 2abc3b3 + next/conv-im2col-tma +
# next/flash-wgmma), binaries in ${BIN:-.gpu/h}. Call 1 of 3: the CUDA suite in pieces, so that a kernel that faults (a CUDA
# error ends the process) hides nothing else: (1) everything but the wgmma attention tests, the im2col convolutions on
# (the branch's default); if that run dies, the conv and model tests again with ENGINE_CONV_IM2COL=0 (main's kernels);
# (2) each wgmma attention test in a process of its own.
# Usage: run(command="bash .gpu/run_h1.sh", carry=[".gpu"]).
set -uo pipefail
(cd "${BIN:-.gpu/h}"; for x in engine_train engine_cuda_tests; do xz -d -k -f $x.xz; chmod +x $x; done)
t0=$(date +%s)
nvidia-smi -L
T=${BIN:-.gpu/h}/engine_cuda_tests
summary() {  # log: the totals, the failures, and the test running when a process died
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" $1 | head -20
  grep -q "^\[==========\] .* ran" $1 || echo "  (died during: $(grep '^\[ RUN' $1 | tail -1))"
  grep -B2 -A6 "Failure\|error" $1 | head -40
}
WG='AttentionCuda.WgmmaForwardMatchesReference:AttentionCuda.WgmmaBackwardMatchesReference:AttentionCuda.EveryTileConfigurationIsAccurate'
timeout 400 $T --gtest_filter="-$WG" > $OUT/tests_h.log 2>&1
rc=$?; echo "== suite without the wgmma attention tests: rc=$rc $(( $(date +%s) - t0 )) s"; summary $OUT/tests_h.log
if [ $rc -ne 0 ]; then
  ENGINE_CONV_IM2COL=0 timeout 150 $T --gtest_filter='ConvCuda.*:ModelsCuda.*:-ConvCuda.Im2col*' > $OUT/tests_noim2col.log 2>&1
  echo "== conv + models with ENGINE_CONV_IM2COL=0: rc=$? $(( $(date +%s) - t0 )) s"; summary $OUT/tests_noim2col.log
fi
for t in ${WG//:/ }; do
  timeout 100 $T --gtest_filter="$t" > $OUT/tests_$t.log 2>&1
  echo "== $t: rc=$? $(( $(date +%s) - t0 )) s"; summary $OUT/tests_$t.log
done
echo "elapsed $(( $(date +%s) - t0 )) s"
