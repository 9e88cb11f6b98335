#!/usr/bin/env bash
# Max batch per GPU of lambda2020.csv, predicted on the meta device (no GPU needed), beside the 2020 figures.
# Usage: tools/bench/lambda_meta.sh [build] > table.md
set -euo pipefail
BUILD=${1:-build}
CSV=${CSV:-tools/data/lambda2020.csv}
gpus="rtx2060 rtx2070 rtx2080 gtx1080ti rtx2080ti titanrtx rtx6000 rtx8000"
row2020() { grep "^$1," "$CSV" | cut -d, -f6-13 | tr ',' ' '; }
echo "| model | config | $(echo $gpus | sed 's/ / | /g') |"
echo "|---|---|$(for g in $gpus; do printf -- '---:|'; done)"
for spec in "bert_base:--seq 128" "bert_base:--seq 512" "bert_squad:--seq 384" "mtdnn:--seq 512" "mtdnn:--seq 128"; do
  model=${spec%%:*}; flags=${spec#*:}
  cells=""
  for g in $gpus; do
    n=$("$BUILD/engine_train" --model "$model" $flags --device meta --gpu "$g" --find-max-batch 2>/dev/null \
        | sed -n 's/^max batch: \([0-9]*\) .*/\1/p')
    cells="$cells | ${n:-0}"
  done
  echo "| $model | engine, fp32, naive, $flags$cells |"
done
for m in bert_base bert_squad mtdnn; do
  echo "| $m | 2020 study | $(row2020 $m | sed 's/ / | /g') |"
done
