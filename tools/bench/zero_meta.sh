#!/usr/bin/env bash
# Per-rank memory under data parallel and ZeRO-1/2/3, predicted on the meta device (no GPU, no communication), beside
# DeepSpeed's model-state formulas (Rajbhandari et al. 2020, section 5: with mixed-precision Adam, Psi parameters
# and K = 12 bytes of optimizer state per parameter: DDP 2 Psi + 2 Psi + K Psi, ZeRO-1 2 Psi + 2 Psi + K Psi / N,
# ZeRO-2 2 Psi + (2 + K) Psi / N, ZeRO-3 (2 + 2 + K) Psi / N). For each model x world size x stage, rank 0's (engine_train --json, MiB): the
# peak; the model states as the formulas count them, at the steady state: parameters and optimizer state live after
# the last step (live_at_end), gradients at their own peak (category_peaks: before the update, when the total peak
# may not be); the formula beside ours; and what the formulas leave out (the gradient buckets, category comm, unless
# --bucket-view makes the gradients views into them: PyTorch DDP's gradient_as_bucket_view). Under ZeRO-3 the
# parameters live after the last step are the rank's shards; the last column gives the parameter bytes at the
# step's peak (peak.by_category: under ZeRO-3 the shards plus the units gathered at that moment, which the formulas
# leave out).
# Usage: tools/bench/zero_meta.sh [BIN]    (BIN: the folder of engine_train, default build)
set -euo pipefail
BIN=${1:-build}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "| model | world | ZeRO | peak | param | grad | optimizer | DeepSpeed's model states | ours (param + grad + optimizer) | comm (buckets) | param at the peak |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for model in "bert_base --seq 512 --batch 8" "transformer_big --tokens 4096" "deeplabv3 --batch 8"; do
  name=${model%% *}
  for world in 8 64; do
    for stage in 0 0v 1 1v 2 3; do  # v: --bucket-view
      j="$OUT/${name}_${world}_$stage.json"
      views=""
      [[ $stage == *v ]] && views="--bucket-view"
      # shellcheck disable=SC2086
      "$BIN/engine_train" --model $model --device meta --precision bf16 --steps 2 --world-size "$world" \
        --zero "${stage%v}" $views --json "$j" > /dev/null
      python3 - "$j" "$name" "$world" "$stage" <<'PY'
import json, sys
path, name, world, stage = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
zero = int(stage[0])
label = f"{zero} + bucket views" if stage.endswith("v") else str(zero)
r = json.load(open(path))
psi = r["parameters"]
# K: the optimizer bytes per parameter under bf16 mixed precision: the f32 master (4) plus the state in f32 (Adam's
# two moments: 8; SGD with momentum, deeplabv3's recipe: 4).
k = 4 + (4 if name == "deeplabv3" else 8)
ds = {0: 2 * psi + 2 * psi + k * psi, 1: 2 * psi + 2 * psi + k * psi / world, 2: 2 * psi + (2 + k) * psi / world,
      3: (2 + 2 + k) * psi / world}[zero]
end, peaks = r["live_at_end"], r["category_peaks"]
mib = lambda b: f"{b / 2**20:,.1f}"
param, grad, opt = end.get("param", 0), peaks.get("grad", 0), end.get("optimizer", 0)
print(f"| {name} | {world} | {label} | {mib(r['peak']['bytes'])} | {mib(param)} | {mib(grad)} | {mib(opt)} | {mib(ds)} | "
      f"{mib(param + grad + opt)} | {mib(end.get('comm', 0))} | {mib(r['peak']['by_category'].get('param', 0))} |")
PY
    done
  done
done
