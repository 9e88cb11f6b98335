#!/usr/bin/env bash
# Ninth session, call 3 of 3 (${BIN:-.gpu/h} as run_h1.sh; the working tree on branch next/hopper-validation): the flash kernels beside PyTorch's SDPA backends on the same shapes,
# then the bert_base 512 x 32 bf16 step with each wgmma variant (ENGINE_FLASH_TUNING), then PyTorch's best BERT step.
set -uo pipefail
[ -f tools/bench/sdpa_torch.py ] || { echo "check out branch next/hopper-validation first (its tools/bench scripts)"; exit 2; }
(cd "${BIN:-.gpu/h}"; for x in engine_train engine_cuda_tests; do [ -x $x ] || { xz -d -k -f $x.xz; chmod +x $x; }; done)
t0=$(date +%s)
BIN=${BIN:-.gpu/h} OUT=$OUT bash tools/bench/transformer_gpu.sh variants
echo "elapsed $(( $(date +%s) - t0 )) s"
timeout 200 python3 tools/bench/bert_torch.py --best --seq 512 --batch 32 --precision bf16 --steps 10 --warmup 3 \
  2>&1 | grep -E "^torch|rror" | tee $OUT/torch_bert_base.log
echo "elapsed $(( $(date +%s) - t0 )) s"
