#!/usr/bin/env bash
# Issue 22's multi-GPU measurements in one call (device time is scarce), on a machine of N >= 2 GPUs
# (nvidia-h200-x2, -x4 or -x8; NVLink multicast off as the machine sets it):
#   tests   the cuda data-parallel tests: DataParallelCuda.* (2 GPUs against 1 accumulating, ZeRO-1/2/3, each rank's
#           ledger against meta's, every rank with the default arena) and the NCCL world of one (DistCuda*)
#   scale   bert_base (bf16, flash, seq 512, 32 sequences per rank) and transformer_big (bf16, flash, --tokens 8192 per
#           rank) on 1, 2, 4 and 8 GPUs (up to N), the default arena: the world's throughput, weak scaling, every
#           rank's peak beside meta's prediction of that rank (--world-size W --rank r), the all-reduce inside the
#           step (NCCL's own time between events on its stream: calls, bytes, seconds, bus GB/s) and NCCL's device
#           memory from the whole-device report
#   zero    bert_base on N GPUs with --bucket-view and --zero 1, 2, 3, each rank's peak beside meta's
#   torch   the same GPUs through PyTorch: torch.distributed all-reduce of the engine's bucket sizes
#           (allreduce_torch.py) and transformers' BERT under DDP and FSDP2 (bert_ddp_torch.py)
# Usage on the GPU machine (binaries built here for sm_90, carried in $BIN):
#   BIN=.gpu OUT=$OUT tools/bench/data_parallel_gpu.sh [tests] [scale] [zero] [torch]
set -uo pipefail
PARTS=${*:-tests scale zero torch}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/data_parallel_gpu}
mkdir -p "$OUT"
GPUS=$(nvidia-smi -L | tee "$OUT/gpu.txt" | wc -l)
echo "$GPUS GPUs"
BERT="--model bert_base --seq 512 --batch 32 --precision bf16 --attention flash"
TBIG="--model transformer_big --tokens 8192 --precision bf16 --attention flash"

# run NAME WORLD STEPS FLAGS...: the engine on WORLD GPUs (1: one process) with --json, then meta's prediction of
# every rank, then one line: the mean step and world throughput over steps 3.. (18.. for transformer_big, whose first
# 17 steps meet new batch shapes), each rank's peak against meta's, the in-step all-reduce, NCCL's device memory.
run() {
  local name=$1 world=$2 steps=$3; shift 3
  local json="$OUT/$name.json" nproc=()
  [ "$world" -gt 1 ] && nproc=(--nproc "$world")
  timeout 300 "$BIN/engine_train" --device cuda --steps "$steps" "${nproc[@]}" "$@" --json "$json" \
    > "$OUT/$name.log" 2>&1 || { echo "$name: engine_train failed, see $name.log"; tail -3 "$OUT/$name.log"; return; }
  local ranks=()
  for ((r = 0; r < world; r++)); do
    local m="$OUT/$name.meta$r.json" args=()
    [ "$world" -gt 1 ] && args=(--world-size "$world" --rank "$r")
    timeout 120 "$BIN/engine_train" --device meta --steps "$steps" "${args[@]}" "$@" --json "$m" > /dev/null 2>&1
    ranks+=("$m")
  done
  python3 - "$name" "$world" "$json" "$OUT/$name.log" "${ranks[@]}" <<'EOF'
import json, re, sys
name, world, path, log, metas = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
first = 18 if "transformer_big" in open(path).read(4000) else 3
runs = [json.load(open(path if r == 0 else f"{path}.rank{r}")) for r in range(world)]
steps = [s for s in runs[0]["steps"] if s["step"] >= first]
ms = sum(s["ms"] for s in steps) / len(steps)
rate = sum(s["items_per_second"] for s in steps) / len(steps)
cuda = [run["peak"]["bytes"] for run in runs]
meta = [json.load(open(m))["peak"]["bytes"] for m in metas]
line = f"{name}: {world} GPU(s), steps {first}-{steps[-1]['step']}: mean {ms:.2f} ms, {rate:.1f} {runs[0]['unit']}/s"
line += f" | peak per rank cuda {cuda} meta {meta} ({'equal' if cuda == meta else 'DIFFERENT'})"
reduce = [s["ranks"]["all_reduce"] for s in steps if "ranks" in s]
if reduce and all(r["seconds"] for r in reduce):
    calls, nbytes, sec = reduce[-1]["calls"], reduce[-1]["bytes"], sum(r["seconds"] for r in reduce) / len(reduce)
    bus = sum(r["bus_gb_per_s"] for r in reduce) / len(reduce)
    line += f" | all-reduce {calls} calls {nbytes} B, {sec * 1e3:.2f} ms in the step, bus {bus:.1f} GB/s"
nccl = re.search(r"NCCL communicator \(channels, peer buffers\) ([0-9.]+ (?:[KMG]i)?B)", open(log).read())
if nccl:
    line += f" | NCCL's device memory {nccl.group(1)}"
print(line)
EOF
}

if want tests; then
  echo "== tests"
  timeout 400 "$BIN/engine_cuda_tests" --gtest_filter='DataParallelCuda.*:DistCuda*' > "$OUT/tests.log" 2>&1
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|SKIPPED  \]' "$OUT/tests.log" | tail -8
fi
if want scale; then
  echo "== scale (weak: the per-rank batch fixed)"
  for w in 1 2 4 8; do
    [ "$w" -le "$GPUS" ] || break
    run "bert_base_w$w" "$w" 8 $BERT
    run "transformer_big_w$w" "$w" 30 $TBIG
  done
fi
if want zero; then
  echo "== bucket view and ZeRO on $GPUS GPUs"
  run "bert_base_bucket_view" "$GPUS" 8 $BERT --bucket-view
  for z in 1 2 3; do run "bert_base_zero$z" "$GPUS" 8 $BERT --zero "$z"; done
fi
if want torch; then
  echo "== PyTorch on the same $GPUS GPUs"
  timeout 200 torchrun --standalone --nproc_per_node "$GPUS" tools/bench/allreduce_torch.py --mib 1,8,27.5,64,210 \
    --dtype bf16 2>&1 | grep -vE "^(W|I)[0-9]{4}|OMP_NUM_THREADS|\*{8}" | tail -8
  for mode in "" --fsdp; do
    timeout 300 torchrun --standalone --nproc_per_node "$GPUS" tools/bench/bert_ddp_torch.py --seq 512 --batch 32 \
      $mode 2>&1 | grep -E "^torch|rror" | tail -3
  done
fi
