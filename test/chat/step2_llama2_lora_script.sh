#!/usr/bin/env bash
# DeepSpeed-Chat's training/step2_reward_model_finetuning/training_scripts/
# llama2/run_llama2_7b_lora.sh run through dsrun + dschat with only the
# launcher line changed ("deepspeed main.py" -> "dsrun dschat reward"): its
# flags as the script has them (ZeRO-3, --offload, gradient checkpointing,
# LoRA dimension 128 on "layers.", --num_padding_at_beginning 0),
# --model_name_or_path meta-llama/Llama-2-7b-hf found in a Hugging Face cache
# layout that holds a tiny stand-in LLaMA exported by dstrain with a
# SentencePiece BPE tokenizer.model (spm_train), and --data_path substituted
# by local/jsonfile. Checks: exit 0, LoRA on the 14 linears, the reward
# evaluations before and after the epoch, and the reward model
# (pytorch_model.bin) beside the log. Skips (77) without spm_train.
#   step2_llama2_lora_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
command -v spm_train > /dev/null || { echo "SKIP: no spm_train (Debian's sentencepiece)"; exit 77; }
setup_run "$1" dschat_step2_llama2
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

# The stand-in: a tiny LLaMA with a SentencePiece BPE tokenizer (chat_util.sh).
llama_standin meta-llama/Llama-2-7b-hf

chat_app step2_reward_model_finetuning 40 20

# The script from here on, with "deepspeed main.py" replaced and --data_path substituted.
OUTPUT=""
ZERO_STAGE=""
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output_step2_llama_7b_epoch1_lr9.65e-6
fi
if [ "$ZERO_STAGE" == "" ]; then
    ZERO_STAGE=3
fi
mkdir -p $OUTPUT

"$DSRUN" dschat reward \
   --data_path local/jsonfile \
   --data_split 2,4,4 \
   --model_name_or_path meta-llama/Llama-2-7b-hf \
   --per_device_train_batch_size 8 \
   --per_device_eval_batch_size 8 \
   --max_seq_len 512 \
   --learning_rate 9.65e-6 \
   --weight_decay 0.1 \
   --num_padding_at_beginning 0 \
   --num_train_epochs 1  \
   --gradient_accumulation_steps 1 \
   --lr_scheduler_type cosine \
   --num_warmup_steps 0 \
   --seed 1234 \
   --gradient_checkpointing \
   --zero_stage $ZERO_STAGE \
   --deepspeed \
   --offload \
   --lora_dim 128 \
   --lora_module_name "layers." \
   --output_dir $OUTPUT \
   &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
grep -q 'LoRA: dimension 128 on 14 linear layers' $LOG || fail "LoRA is not on the 14 linears of the 2 layers" $LOG
n=$(grep -c 'chosen_last_scores (higher is better)' $LOG || true)
[[ $n == 2 ]] || fail "expected 2 reward evaluations (before training and after the epoch), found $n" $LOG
for f in config.json pytorch_model.bin tokenizer.model training.log; do
  [[ -f $OUTPUT/$f ]] || fail "$OUTPUT/$f missing" $LOG
done
echo "DeepSpeed-Chat's step-2 LLaMA-2 LoRA script ran with only the launcher line changed: $(grep 'chosen_last_scores' $LOG | tail -1)"
