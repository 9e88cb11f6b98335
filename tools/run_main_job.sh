#!/usr/bin/env bash
# The main job (make run): train a model on the best device present and report its memory.
# Today (no CUDA device in the engine yet): a small config trains on the cpu, and the full-size config's
# memory is measured on the meta device, which computes nothing and says so.
set -euo pipefail
BUILD=${1:-build}
echo "== training transformer_lm (tiny) on the cpu =="
"$BUILD/engine_train" --model transformer_lm --size tiny --device cpu --steps 30
echo
echo "== full size (GPT-2 small, seq 1024, batch 8): memory from the meta device (no arithmetic) =="
"$BUILD/engine_train" --model transformer_lm --size small --device meta --memory 24GB --steps 2
