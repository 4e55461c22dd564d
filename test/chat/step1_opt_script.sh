#!/usr/bin/env bash
# DeepSpeed-Chat's training/step1_supervised_finetuning/training_scripts/opt/
# single_node/run_1.3b.sh run through dsrun + dschat with only the launcher
# line changed ("deepspeed main.py" -> "dsrun dschat sft"): its flags as the
# script has them, --model_name_or_path facebook/opt-1.3b found in a Hugging
# Face cache layout (HF_HUB_CACHE) that holds a tiny stand-in OPT (exported by
# dstrain: 2 layers, hidden 32, ReLU, a byte-level BPE vocabulary of 300), the
# script run from training/step1_supervised_finetuning/ two levels below its
# data, and --data_path substituted by local/jsonfile (the hub datasets are
# not downloaded). Checks: exit 0, DeepSpeed-Chat's perplexity lines before
# training and after each of the 16 epochs, the model in $OUTPUT beside the
# log, and the TensorBoard events file where the script's DeepSpeed config
# puts it.
#   step1_opt_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
setup_run "$1" dschat_step1_opt
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

# The stand-in model, exported by dstrain (0 iterations: its initial weights).
opt_standin facebook/opt-1.3b

# DeepSpeed-Chat's application folder: data/ two levels above the step's folder.
chat_app step1_supervised_finetuning 40 10

# The script from here on, with "deepspeed main.py" replaced and --data_path substituted.
OUTPUT=""
ZERO_STAGE=""
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output
fi
if [ "$ZERO_STAGE" == "" ]; then
    ZERO_STAGE=2
fi
mkdir -p $OUTPUT

"$DSRUN" dschat sft \
   --data_path local/jsonfile \
   --data_split 2,4,4 \
   --model_name_or_path facebook/opt-1.3b \
   --per_device_train_batch_size 8 \
   --per_device_eval_batch_size 8 \
   --max_seq_len 512 \
   --learning_rate 9.65e-6 \
   --weight_decay 0. \
   --num_train_epochs 16 \
   --gradient_accumulation_steps 1 \
   --lr_scheduler_type cosine \
   --num_warmup_steps 0 \
   --seed 1234 \
   --zero_stage $ZERO_STAGE \
   --deepspeed \
   --enable_tensorboard \
   --tensorboard_path $OUTPUT \
   --output_dir $OUTPUT \
   &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
n=$(grep -c 'ppl: ' $LOG || true)
[[ $n == 17 ]] || fail "expected 17 perplexity lines (before training and after 16 epochs), found $n" $LOG
grep -q 'Beginning of Epoch 16/16' $LOG || fail "no 16th epoch" $LOG
for f in config.json model.safetensors vocab.json merges.txt training.log; do
  [[ -f $OUTPUT/$f ]] || fail "$OUTPUT/$f missing" $LOG
done
ls $OUTPUT/ds_tensorboard_logs/step1_model_tensorboard/events.out.tfevents.* > /dev/null 2>&1 ||
  fail "no TensorBoard events under $OUTPUT/ds_tensorboard_logs/step1_model_tensorboard" $LOG
first=$(grep 'ppl: ' $LOG | head -1 | sed 's/.*loss: //'); last=$(grep 'ppl: ' $LOG | tail -1 | sed 's/.*loss: //')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the eval loss did not fall ($first -> $last)" $LOG
echo "DeepSpeed-Chat's step-1 OPT script ran with only the launcher line changed: eval loss $first -> $last"
