#!/usr/bin/env bash
# Bytes on the wire per training step: the 1-bit optimizers' compressed
# exchanges against AdamW's gradient all-reduce, four data-parallel ranks on
# this machine (Gloo over loopback), measured with the kernel's loopback
# counters (/proc/net/dev, "lo" transmit bytes). Each optimizer runs 6 and 12
# iterations; the difference is 6 steps, without start-up, rendezvous and
# the final evaluation. OneBitAdam and OneBitLamb use freeze_step 2 and
# ZeroOneAdam var_freeze_step 1, so every one of those steps is compressed
# (0/1 Adam's local-step interval stays 1 over so few steps: it synchronises
# every step). The model: 4 layers of hidden 256 on the GPT-2
# vocabulary (16.5M parameters), fp32, ZeRO stage 0, micro-batch 1,
# sequence 128.
#
# usage: bench/comm/onebit_traffic.sh BUILD_DIR WORK_DIR [DATA_DIR]
# DATA_DIR holds tinyshakespeare.txt, gpt2-vocab.json, gpt2-merges.txt
# (default: ../shared/data beside the repository). Nothing else may use
# loopback meanwhile.
set -euo pipefail
. "$(dirname "$0")/../shake_gpt2.sh" "$@"
M=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
   --micro-batch-size 1 --global-batch-size 4 --lr 1e-3 --log-interval 1 --eval-interval 0
   --data-path "$W/shake" --vocab-file "$D/gpt2-vocab.json" --merge-file "$D/gpt2-merges.txt"
   --hidden-dropout 0 --attention-dropout 0)
echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' > "$W/adamw.json"
echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 2}}}' \
  > "$W/onebit.json"
echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "ZeroOneAdam", "params": {"lr": 1e-3, "var_freeze_step": 1}}}' \
  > "$W/zeroone.json"
echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 2}}}' \
  > "$W/onebitlamb.json"
lo_tx() { awk '$1 == "lo:" { print $10 }' /proc/net/dev; }
run() {  # CONFIG ITERS -> loopback bytes sent by the job
  local before after port=$((20000 + RANDOM % 20000))
  before=$(lo_tx)
  "$B/apps/dsrun/dsrun" --num_gpus 4 --master_port "$port" "$B/apps/dstrain/dstrain" --config "$W/$1.json" \
    "${M[@]}" --train-iters "$2" > "$W/$1_$2.log" 2>&1
  after=$(lo_tx)
  echo $((after - before))
}
for opt in adamw onebit zeroone onebitlamb; do
  a=$(run "$opt" 6)
  b=$(run "$opt" 12)
  per_step=$(( (b - a) / 6 ))
  printf "%-10s %12d bytes per step (all 4 ranks), %11d per rank; final loss %s\n" "$opt" "$per_step" \
    $((per_step / 4)) "$(grep -oE "lm loss: [0-9.E+-]+" "$W/${opt}_12.log" | tail -1)"
  eval "${opt}_step=$per_step"
done
for opt in onebit zeroone onebitlamb; do
  eval "o=\$${opt}_step"
  awk -v a="$adamw_step" -v o="$o" -v n="$opt" 'BEGIN { printf "%s / adamw: %.4f (1/%.1f)\n", n, o / a, a / o }'
done
