#!/usr/bin/env bash
# The README's demo: installs dependencies, builds, generates a synthetic
# corpus (no download), trains a byte-level BPE tokenizer on it, tokenizes it
# into a Megatron .bin/.idx dataset, and trains a small GPT-2-style model on
# the CPU for a few minutes with checkpoints and a Hugging Face export, draws
# its loss curves (dsplot) and prints a few generations from it with dsgen.
# Everything is written under demo-out/.
#   scripts/demo.sh [extra dstrain flags, e.g. --train-iters 50]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
OUT=demo-out
bash scripts/setup.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target dstrain dsprep dsrun dsgen dsplot

rm -rf "$OUT"
mkdir -p "$OUT"
"$BUILD/apps/dsprep/dsprep" --generate-corpus "$OUT/corpus.txt" --size-mb 4 --seed 1
"$BUILD/apps/dsprep/dsprep" --train-tokenizer --input "$OUT/corpus.txt" --vocab-size 1024 --output-dir "$OUT/tokenizer"
"$BUILD/apps/dsprep/dsprep" --input "$OUT/corpus.txt" --output-prefix "$OUT/data/corpus" \
  --vocab-file "$OUT/tokenizer/vocab.json" --merge-file "$OUT/tokenizer/merges.txt"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
DSTRAIN="$BUILD/apps/dstrain/dstrain --config configs/demo.json $*"
if [[ -x "$BUILD/apps/dsrun/dsrun" ]]; then
  # One local rank through the launcher, as on a GPU box: dsrun --include localhost:0
  "$BUILD/apps/dsrun/dsrun" --include localhost:0 --no_local_rank $DSTRAIN
else
  $DSTRAIN
fi
# The training and validation curves from the CSV monitor files (the PNG through
# librsvg, which setup.sh installs).
"$BUILD/apps/dsplot/dsplot" "$OUT/logs/demo" --metrics loss,lr,grad_norm -o "$OUT/curves.svg" -o "$OUT/curves.png"
echo
echo "demo: a few generations from the trained model (dsgen, greedy, KV cache):"
"$BUILD/apps/dsgen/dsgen" --load "$OUT/checkpoints" --max-new-tokens 48 \
  --prompt "Before dawn, Hugo was in the" --prompt "At noon, Vera" --prompt "There were six"
echo
echo "demo: checkpoints in $OUT/checkpoints, Hugging Face export in $OUT/hf, CSV logs in $OUT/logs/demo, curves in $OUT/curves.svg and .png"
