#!/usr/bin/env bash
# DeepSpeed-Chat's training/step2_reward_model_finetuning/training_scripts/opt/
# single_node/run_350m.sh run through dsrun + dschat with only the launcher
# line changed ("deepspeed main.py" -> "dsrun dschat reward"): its flags as
# the script has them, --model_name_or_path facebook/opt-350m found in a
# Hugging Face cache layout (HF_HUB_CACHE) that holds a tiny stand-in OPT
# (exported by dstrain: pre-LayerNorm and without opt-350m's projections,
# which dschat does not support yet), the script run from
# training/step2_reward_model_finetuning/ two levels below its data, and
# --data_path substituted by local/jsonfile (the hub datasets are not
# downloaded). Checks: exit 0, the reward evaluation before and after its
# epoch, the epoch's loss line, and the reward model (pytorch_model.bin,
# RewardModel's names) in $OUTPUT beside the log.
#   step2_opt_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
setup_run "$1" dschat_step2_opt
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

# The stand-in model, exported by dstrain (0 iterations: its initial weights).
SNAP="$WORK/hub/models--facebook--opt-350m/snapshots/0123abc"
mkdir -p "$WORK/hub/models--facebook--opt-350m/refs" "$(dirname "$SNAP")"
echo -n 0123abc > "$WORK/hub/models--facebook--opt-350m/refs/main"
cat > "$WORK/standin.json" <<EOT
{"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
 "model": {"family": "gpt2", "activation": "relu", "embedding_dropout": 0.0, "num_layers": 2, "hidden_size": 32,
           "num_heads": 4, "seq_length": 64, "max_position_embeddings": 512, "make_vocab_size_divisible_by": 1},
 "data": {"data_path": "${DATA}/corpus", "vocab_file": "${TOK}/vocab.json", "merge_file": "${TOK}/merges.txt"},
 "training": {"train_iters": 0, "export_hf": "$SNAP"}}
EOT
"$DSTRAIN" --config "$WORK/standin.json" > "$WORK/standin.log" 2>&1 || fail "exporting the stand-in failed" "$WORK/standin.log"
grep -q '"model_type": "opt"' "$SNAP/config.json" || fail "the stand-in is not an OPT" "$SNAP/config.json"
export HF_HUB_CACHE="$WORK/hub"

# DeepSpeed-Chat's application folder: data/ two levels above the step's folder.
APP="$WORK/DeepSpeed-Chat"
mkdir -p "$APP/data" "$APP/training/step2_reward_model_finetuning"
for split in train eval; do
  n=$([[ $split == train ]] && echo 40 || echo 20)
  for ((i = 0; i < n; i++)); do
    echo "{\"prompt\": \"Human: tell me story $i of the old town. Assistant:\", \"chosen\": \"It was a quiet evening in the town, number $i.\", \"rejected\": \"No.\"}"
  done > "$APP/data/$split.json"
done
cd "$APP/training/step2_reward_model_finetuning"

# The script from here on, with "deepspeed main.py" replaced and --data_path substituted.
OUTPUT=""
ZERO_STAGE=""
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output
fi
if [ "$ZERO_STAGE" == "" ]; then
    ZERO_STAGE=0
fi
mkdir -p $OUTPUT

"$DSRUN" dschat reward \
   --data_path local/jsonfile \
   --data_split 2,4,4 \
   --model_name_or_path facebook/opt-350m \
   --num_padding_at_beginning 1 \
   --per_device_train_batch_size 4 \
   --per_device_eval_batch_size 4 \
   --max_seq_len 512 \
   --learning_rate 5e-5 \
   --weight_decay 0.1 \
   --num_train_epochs 1 \
   --dropout 0.0 \
   --gradient_accumulation_steps 1 \
   --lr_scheduler_type cosine \
   --num_warmup_steps 0 \
   --seed 1234 \
   --zero_stage $ZERO_STAGE \
   --deepspeed \
   --output_dir $OUTPUT \
   &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
n=$(grep -c 'chosen_last_scores (higher is better)' $LOG || true)
[[ $n == 2 ]] || fail "expected 2 reward evaluations (before training and after the epoch), found $n" $LOG
grep -q 'Epoch 1/1 with loss ' $LOG || fail "no epoch loss line" $LOG
for f in config.json pytorch_model.bin vocab.json merges.txt training.log; do
  [[ -f $OUTPUT/$f ]] || fail "$OUTPUT/$f missing" $LOG
done
echo "DeepSpeed-Chat's step-2 OPT script ran with only the launcher line changed: $(grep 'chosen_last_scores' $LOG | tail -1)"
