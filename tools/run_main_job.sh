#!/usr/bin/env bash
# The main job (make run): train the default model on the best device present and report its memory.
#
#   GPU machine (and an engine built with its cuda device): the full-size model trains on the GPU, fp32 then
#   bf16, then meta predicts the fp32 peak (the same number, byte for byte).
#   Otherwise: a small config trains a few steps on the cpu, then the full-size config's memory is measured
#   on the meta device (shapes and allocations only, no arithmetic), and its max batch on the 2020 study's
#   RTX 2080 Ti profile, so the run ends with the numbers the study is about.
#
# The default model is bert_base (the 2020 table's language model) when this build has it, else
# transformer_lm (MAIN_MODEL=transformer_lm picks it). Usage: tools/run_main_job.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
TRAIN="$BUILD/engine_train"

if [ "${MAIN_MODEL:-}" = transformer_lm ] || ! "$TRAIN" --help | grep -q '^models: .*bert_base'; then
  MODEL=transformer_lm SMALL=tiny FULL=small
else
  MODEL=bert_base SMALL=tiny FULL=base
fi

GPU=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=$(nvidia-smi -L | head -n 1)
fi

# A GPU and a build with the engine's cuda device (one tiny step on it succeeds): the full-size model trains
# there (fp32, then bf16 mixed precision), and the run ends with the meta device's prediction of the same peak.
if [ -n "$GPU" ] && "$TRAIN" --model "$MODEL" --size "$SMALL" --device cuda --steps 1 >/dev/null 2>&1; then
  echo "== training $MODEL ($FULL) on the GPU: $GPU =="
  "$TRAIN" --model "$MODEL" --size "$FULL" --device cuda --steps 20
  echo
  echo "== the same in bf16 mixed precision =="
  "$TRAIN" --model "$MODEL" --size "$FULL" --device cuda --steps 20 --precision bf16
  echo
  echo "== $MODEL ($FULL), fp32: the meta device's prediction of that peak (allocations only, no arithmetic) =="
  "$TRAIN" --model "$MODEL" --size "$FULL" --device meta --steps 2
  exit 0
fi

if [ -n "$GPU" ]; then
  echo "(a GPU is present: $GPU; this build has no cuda device (built without nvcc?), so this run takes the cpu path)"
fi
echo "== training $MODEL ($SMALL) on the cpu, a few steps =="
"$TRAIN" --model "$MODEL" --size "$SMALL" --device cpu --steps 10
echo
echo "== $MODEL ($FULL), full size: memory measured on the meta device (allocations only, no arithmetic) =="
"$TRAIN" --model "$MODEL" --size "$FULL" --device meta --steps 2
echo
echo "== $MODEL ($FULL): max batch on an RTX 2080 Ti (meta device, the card's memory less its context reserve) =="
"$TRAIN" --model "$MODEL" --size "$FULL" --device meta --gpu rtx2080ti --find-max-batch
