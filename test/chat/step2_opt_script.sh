#!/usr/bin/env bash
# DeepSpeed-Chat's training/step2_reward_model_finetuning/training_scripts/opt/
# single_node/run_350m.sh run through dsrun + dschat with only the launcher
# line changed ("deepspeed main.py" -> "dsrun dschat reward"): its flags as
# the script has them, --model_name_or_path facebook/opt-350m found in a
# Hugging Face cache layout (HF_HUB_CACHE) that holds a tiny stand-in OPT
# shaped as opt-350m (exported by dstrain: post-LayerNorm blocks, a narrower
# token embedding between project_in and project_out), the script run from
# training/step2_reward_model_finetuning/ two levels below its data, and
# --data_path substituted by local/jsonfile (the hub datasets are not
# downloaded). Checks: exit 0, the reward evaluation before and after its
# epoch, the epoch's loss line, and the reward model (pytorch_model.bin,
# RewardModel's names) in $OUTPUT beside the log.
#   step2_opt_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
setup_run "$1" dschat_step2_opt
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

# The stand-in model, exported by dstrain (0 iterations: its initial weights).
opt350m_standin facebook/opt-350m

# DeepSpeed-Chat's application folder: data/ two levels above the step's folder.
chat_app step2_reward_model_finetuning 40 20

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
