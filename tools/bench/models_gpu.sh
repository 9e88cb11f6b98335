#!/usr/bin/env bash
# The image and translation models on the GPU, engine vs PyTorch in the same call (PERF.md's configs):
#   deeplabv3 at 513x513 batch 8 (engine sizes voc = paper OS16, torchvision = torchvision's OS8) vs
#   torchvision's deeplabv3_resnet101 (tools/bench/deeplab_torch.py); transformer_big at --tokens 3584 vs
#   nn.Transformer with the same shapes and batch (tools/bench/translation_torch.py); convs2s at --tokens 4000.
# Usage on the GPU machine: BIN=.gpu OUT=$OUT tools/bench/models_gpu.sh
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/models_gpu}
mkdir -p "$OUT"
run_engine() {  # name, then engine_train flags
  local name=$1; shift
  timeout 90 "$BIN/engine_train" --device cuda --steps 6 "$@" > "$OUT/engine_$name.log" 2>&1
  echo "engine $* | $(grep -E '^step 6|rror' "$OUT/engine_$name.log" | tail -1)"
}
echo "== deeplabv3, batch 8, 513x513"
for p in fp32 bf16; do
  run_engine "deeplab_voc_$p" --model deeplabv3 --batch 8 --precision "$p"
  run_engine "deeplab_tv_$p" --model deeplabv3 --size torchvision --batch 8 --precision "$p"
  timeout 120 python3 tools/bench/deeplab_torch.py --batch 8 --precision "$p" 2>&1 | grep -E "^torch|Error"
done
echo "== transformer_big, --tokens 3584"
for p in fp32 bf16; do
  run_engine "tbig_$p" --model transformer_big --tokens 3584 --precision "$p"
  run_engine "tbig_flash_$p" --model transformer_big --tokens 3584 --precision "$p" --attention flash
  timeout 120 python3 tools/bench/translation_torch.py --tokens 3584 --precision "$p" --attn math 2>&1 | tail -1
done
echo "== convs2s, --tokens 4000"
for p in fp32 bf16; do run_engine "convs2s_$p" --model convs2s --tokens 4000 --precision "$p"; done
