#!/usr/bin/env bash
# Regenerates the figures the READMEs show from the programs that produce them, so that no figure a user reads
# is copied by hand. Today: the 2020 table in README.md and its plot (tools/bench/plots/lambda_meta.svg), and
# the max tokens per card of the translation models in models/README.md, all from one
# `engine_bench lambda --device meta` run; and engine/README.md's timeline of the worked transformer
# (tools/bench/plots/tour_timeline.svg, checked by tests/tools/tour_test.cpp). tests/tools/docs_test.cpp fails when the committed figures differ
# from what the program prints.
#
# Usage, from the project root after `make`:  tools/bench/update_docs.sh [build]
set -euo pipefail
BUILD=${1:-build}
[ -x "$BUILD/engine_bench" ] || { echo "no $BUILD/engine_bench: run make first" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$BUILD/engine_bench" lambda --device meta --out "$out" > "$out/log.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# The files this script writes aside, a changed tree is not that commit: say so.
git diff --quiet HEAD -- . ':!README.md' ':!models/README.md' ':!tools/bench/plots' 2>/dev/null ||
  commit="$commit + uncommitted changes"
seconds=$(sed -n 's/.* probes (.*), \([0-9.]*\) s\.$/\1/p' "$out/log.txt")

# replace_block FILE BEGIN_PREFIX END_LINE TEXT_FILE: the lines strictly between the line starting with
# BEGIN_PREFIX and the line END_LINE become TEXT_FILE's contents (the marker lines stay).
replace_block() {
  local file=$1 begin=$2 end=$3 text=$4
  grep -q "^$begin" "$file" || { echo "$file: no line starting with '$begin'" >&2; exit 1; }
  grep -qx -- "$end" "$file" || { echo "$file: no line '$end'" >&2; exit 1; }
  awk -v begin="$begin" -v end="$end" -v text="$text" '
    index($0, begin) == 1 { print; while ((getline line < text) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip { print }' "$file" > "$file.new"
  mv "$file.new" "$file"
}

# README.md: the provenance line, then the first table of lambda.md (the max batches; a cuda run adds another).
awk '/^\| model \| unit \| config/ {t = 1} t && !/^\|/ {exit} t {print}' "$out/lambda.md" > "$out/table.md"
{
  echo "On meta, $(date -u +%Y-%m-%d), commit $commit (fp32, naive attention; **ours** / 2020; \`≥\`: the search"
  echo "limit of 65536 fit; ${seconds} s for the whole table on $(nproc) cores)."
  echo
  cat "$out/table.md"
} > "$out/readme_block.md"
replace_block README.md "<!-- BEGIN lambda table" "<!-- END lambda table -->" "$out/readme_block.md"
cp "$out/lambda.svg" tools/bench/plots/lambda_meta.svg

# models/README.md: one line per translation model, "rtx2060 2559, rtx2070 4095, ...", from lambda.csv
# (columns: model, ..., gpu (6), ..., max_batch (8), first_fail (9)).
for model in transformer_big convs2s unsupmt; do
  awk -F, -v m="$model" '$1 == m {
      cell = $6 " " ($9 == "0" ? ">=" : "") $8
      line = line (line == "" ? "" : ", ") cell
    }
    END { print "  " line " (meta, fp32, naive attention; `engine_bench lambda --device meta`)." }' \
    "$out/lambda.csv" > "$out/$model.md"
  replace_block models/README.md "<!-- BEGIN max tokens: $model " "<!-- END max tokens: $model -->" "$out/$model.md"
done

# engine/README.md's tour: the one-layer transformer's step 2 (tests/tools/tour_test.cpp draws the same and compares).
"$BUILD/engine_train" --model transformer_lm --layers 1 --hidden 64 --heads 2 --ffn 256 --vocab 512 --positions 128 \
  --seq 128 --batch 4 --dropout 0 --attention-dropout 0 --device meta --steps 2 \
  --timeline tools/bench/plots/tour_timeline.svg > /dev/null
echo "updated README.md, tools/bench/plots/lambda_meta.svg and models/README.md from engine_bench lambda ($commit),"
echo "and tools/bench/plots/tour_timeline.svg from engine_train"
