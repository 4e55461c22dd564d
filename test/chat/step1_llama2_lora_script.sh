#!/usr/bin/env bash
# DeepSpeed-Chat's training/step1_supervised_finetuning/training_scripts/
# llama2/run_llama2_7b_lora.sh run through dsrun + dschat with only the
# launcher line changed ("deepspeed main.py" -> "dsrun dschat sft"): its flags
# as the script has them (ZeRO-3, gradient checkpointing, LoRA dimension 128
# on "layers."), --model_name_or_path meta-llama/Llama-2-7b-hf found in a
# Hugging Face cache layout that holds a tiny stand-in LLaMA exported by
# dstrain with a SentencePiece BPE tokenizer.model (spm_train, byte
# fallback), which dschat reads as transformers' LlamaTokenizer, and
# --data_path substituted by local/jsonfile. Checks: exit 0, LoRA on the 7
# linears of each of the 2 layers, the perplexity lines before training and
# after each of the 4 epochs, and the fused model (no LoRA tensors) beside
# the log. Skips (77) without spm_train.
#   step1_llama2_lora_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
command -v spm_train > /dev/null || { echo "SKIP: no spm_train (Debian's sentencepiece)"; exit 77; }
setup_run "$1" dschat_step1_llama2
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

# The stand-in: a tiny LLaMA with a SentencePiece BPE tokenizer (chat_util.sh).
llama_standin meta-llama/Llama-2-7b-hf

chat_app step1_supervised_finetuning 40 20

# The script from here on, with "deepspeed main.py" replaced and --data_path substituted.
OUTPUT=""
ZERO_STAGE=""
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output_step1_llama2_7b_lora
fi
if [ "$ZERO_STAGE" == "" ]; then
    ZERO_STAGE=3
fi
mkdir -p $OUTPUT

"$DSRUN" dschat sft \
   --data_path local/jsonfile \
   --data_split 2,4,4 \
   --model_name_or_path meta-llama/Llama-2-7b-hf \
   --per_device_train_batch_size 4 \
   --per_device_eval_batch_size 4 \
   --max_seq_len 512 \
   --learning_rate 9.65e-6 \
   --weight_decay 0. \
   --num_train_epochs 4  \
   --gradient_accumulation_steps 1 \
   --lr_scheduler_type cosine \
   --num_warmup_steps 0 \
   --seed 1234 \
   --gradient_checkpointing \
   --zero_stage $ZERO_STAGE \
   --deepspeed \
   --lora_dim 128 \
   --lora_module_name "layers." \
   --output_dir $OUTPUT \
   &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
grep -q 'LoRA: dimension 128 on 14 linear layers' $LOG || fail "LoRA is not on the 14 linears of the 2 layers" $LOG
n=$(grep -c 'ppl: ' $LOG || true)
[[ $n == 5 ]] || fail "expected 5 perplexity lines (before training and after 4 epochs), found $n" $LOG
for f in config.json model.safetensors tokenizer.model training.log; do
  [[ -f $OUTPUT/$f ]] || fail "$OUTPUT/$f missing" $LOG
done
first=$(grep 'ppl: ' $LOG | head -1 | sed 's/.*loss: //'); last=$(grep 'ppl: ' $LOG | tail -1 | sed 's/.*loss: //')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the eval loss did not fall ($first -> $last)" $LOG
echo "DeepSpeed-Chat's step-1 LLaMA-2 LoRA script ran with only the launcher line changed: eval loss $first -> $last"
