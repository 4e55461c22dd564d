#!/usr/bin/env bash
# Loss quality of DeepSpeed's optimizers against AdamW on the README demo's
# task: the synthetic demo corpus (dsprep --generate-corpus, 4 MB, seed 1,
# its byte-level BPE of 1024 tokens), the demo model (GPT-2 style, 6 layers,
# hidden 256, 8 heads, sequence 128), global batch 16 over two data-parallel
# ranks (micro-batch 8), ZeRO stage 0, gradient clipping 1, Megatron's
# cosine schedule with ITERS/10 warm-up iterations down to lr/10. Each
# optimizer trains ITERS iterations from the same seed; the script prints
# the final training loss (mean of the last 10 logged) and the validation
# loss at the end (8 batches), and each one's ratio to AdamW's.
#   AdamW       lr 2e-3, betas (0.9, 0.95), weight decay 0.1 (the demo's)
#   Lamb        lr LAMB_LR (default 2e-2), betas (0.9, 0.95), weight decay 0.1
#   OneBitAdam  as AdamW, freeze_step FREEZE (default ITERS/5)
#   ZeroOneAdam as AdamW, var_freeze_step FREEZE
#   OneBitLamb  as Lamb, freeze_step FREEZE
#
# usage: bench/optim/loss_quality.sh BUILD_DIR WORK_DIR [ITERS] [OPTIMIZERS...]
set -euo pipefail
B=$(realpath "$1")
mkdir -p "$2"
W=$(realpath "$2")
ITERS=${3:-300}
shift $(( $# < 3 ? $# : 3 ))
OPTS=("$@")
[ ${#OPTS[@]} -gt 0 ] || OPTS=(AdamW Lamb OneBitAdam ZeroOneAdam OneBitLamb)
LAMB_LR=${LAMB_LR:-2e-2}
FREEZE=${FREEZE:-$((ITERS / 5))}
if [ ! -f "$W/data/corpus.bin" ]; then
  "$B/apps/dsprep/dsprep" --generate-corpus "$W/corpus.txt" --size-mb 4 --seed 1 > /dev/null
  "$B/apps/dsprep/dsprep" --train-tokenizer --input "$W/corpus.txt" --vocab-size 1024 --output-dir "$W/tok" > /dev/null
  "$B/apps/dsprep/dsprep" --input "$W/corpus.txt" --output-prefix "$W/data/corpus" --vocab-file "$W/tok/vocab.json" \
    --merge-file "$W/tok/merges.txt" > /dev/null
fi
params() {  # OPTIMIZER -> the optimizer section
  case $1 in
    AdamW) echo '{"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}' ;;
    Lamb) echo "{\"type\": \"Lamb\", \"params\": {\"lr\": $LAMB_LR, \"betas\": [0.9, 0.95], \"weight_decay\": 0.1}}" ;;
    OneBitAdam) echo "{\"type\": \"OneBitAdam\", \"params\": {\"lr\": 2e-3, \"betas\": [0.9, 0.95], \"weight_decay\": 0.1, \"freeze_step\": $FREEZE}}" ;;
    ZeroOneAdam) echo "{\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 2e-3, \"betas\": [0.9, 0.95], \"weight_decay\": 0.1, \"var_freeze_step\": $FREEZE}}" ;;
    OneBitLamb) echo "{\"type\": \"OneBitLamb\", \"params\": {\"lr\": $LAMB_LR, \"betas\": [0.9, 0.95], \"weight_decay\": 0.1, \"freeze_step\": $FREEZE}}" ;;
    *) echo "unknown optimizer $1" >&2; exit 2 ;;
  esac
}
lr_of() { params "$1" | grep -oE '"lr": [0-9.e-]+' | awk '{ print $2 }'; }
printf "%-12s %10s %10s %10s %10s %8s\n" optimizer lr train valid train/AdamW seconds
for opt in "${OPTS[@]}"; do
  cat > "$W/$opt.json" <<JSON
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
 "optimizer": $(params "$opt"), "zero_optimization": {"stage": 0},
 "csv_monitor": {"enabled": true, "output_path": "$W/logs", "job_name": "$opt"},
 "model": {"family": "gpt2", "num_layers": 6, "hidden_size": 256, "num_heads": 8, "seq_length": 128,
           "max_position_embeddings": 128, "make_vocab_size_divisible_by": 128},
 "data": {"data_path": "$W/data/corpus", "split": "949,50,1", "vocab_file": "$W/tok/vocab.json",
          "merge_file": "$W/tok/merges.txt"},
 "training": {"train_iters": $ITERS, "seed": 1234, "lr_warmup_iters": $((ITERS / 10)), "lr_decay_style": "cosine",
              "min_lr": $(awk -v l="$(lr_of "$opt")" 'BEGIN { print l / 10 }'), "log_interval": 1,
              "eval_interval": $ITERS, "eval_iters": 8}}
JSON
  start=$(date +%s)
  OMP_NUM_THREADS=1 "$B/apps/dsrun/dsrun" --num_gpus 2 --master_port $((20000 + RANDOM % 20000)) \
    "$B/apps/dstrain/dstrain" --config "$W/$opt.json" > "$W/$opt.log" 2>&1
  secs=$(( $(date +%s) - start ))
  train=$(awk -F, 'NR > 1 { l[NR] = $4 } END { s = 0; for (i = NR - 9; i <= NR; ++i) s += l[i]; printf "%.4f", s / 10 }' \
    "$W/logs/$opt/train.csv")
  valid=$(grep -oE "validation loss at iteration $ITERS \| lm loss value: [0-9.E+-]+" "$W/$opt.log" | tail -1 |
    awk '{ printf "%.4f", $NF }')
  [ "$opt" = AdamW ] && base=$train
  printf "%-12s %10s %10s %10s %10s %8d\n" "$opt" "$(lr_of "$opt")" "$train" "${valid:-?}" \
    "$(awk -v a="$train" -v b="${base:-$train}" 'BEGIN { printf "%.4f", a / b }')" "$secs"
done
