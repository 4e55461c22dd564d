#!/usr/bin/env bash
# DeepSpeed-Chat's training/step3_rlhf_finetuning/training_scripts/llama2/
# run_llama2_7b_lora.sh run through dsrun + dschat with only the launcher
# line changed ("deepspeed --master_port 12346 main.py" -> "dsrun
# --master_port 12346 dschat ppo"): its flags as the script has them (ZeRO-3
# for both models, gradient checkpointing for both, the reference model
# offloaded, LoRA dimension 64 on "layers." for the actor and the critic,
# batches of one prompt, 256-token prompts and answers), the actor and
# critic paths it takes as arguments pointing at a tiny stand-in LLaMA
# (meta-llama/Llama-2-7b-hf in a Hugging Face cache layout, exported by
# dstrain with a SentencePiece BPE tokenizer.model; DeepSpeed-Chat's "[PAD]"
# token is added to it), and --data_path substituted by local/jsonfile.
# Checks: exit 0, LoRA on both models, one PPO round per prompt, the actor
# and critic in $OUTPUT with LoRA fused (no lora tensors). Skips (77)
# without spm_train.
#   step3_llama2_lora_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
command -v spm_train > /dev/null || { echo "SKIP: no spm_train (Debian's sentencepiece)"; exit 77; }
setup_run "$1" dschat_step3_llama2
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

llama_standin meta-llama/Llama-2-7b-hf
chat_app step3_rlhf_finetuning 20 10
set -- meta-llama/Llama-2-7b-hf meta-llama/Llama-2-7b-hf  # the script's arguments: actor and critic

# The script from here on, with "deepspeed main.py" replaced and --data_path substituted.
ACTOR_MODEL_PATH=$1
CRITIC_MODEL_PATH=$2
ACTOR_ZERO_STAGE=${3:-}
CRITIC_ZERO_STAGE=${4:-}
OUTPUT=${5:-}
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output_step3_llama2
fi
if [ "$ACTOR_ZERO_STAGE" == "" ]; then
    ACTOR_ZERO_STAGE=3
fi
if [ "$CRITIC_ZERO_STAGE" == "" ]; then
    CRITIC_ZERO_STAGE=3
fi
mkdir -p $OUTPUT

Num_Padding_at_Beginning=1 # this is model related

Actor_Lr=9.65e-6
Critic_Lr=5e-6

"$DSRUN" --master_port 12346 dschat ppo \
   --data_path local/jsonfile \
   --data_split 2,4,4 \
   --actor_model_name_or_path $ACTOR_MODEL_PATH \
   --critic_model_name_or_path $CRITIC_MODEL_PATH \
   --num_padding_at_beginning 1 \
   --per_device_generation_batch_size 1 \
   --per_device_training_batch_size 1 \
   --generation_batches 1 \
   --ppo_epochs 1 \
   --max_answer_seq_len 256 \
   --max_prompt_seq_len 256 \
   --actor_learning_rate ${Actor_Lr} \
   --critic_learning_rate ${Critic_Lr} \
   --actor_weight_decay 0.1 \
   --critic_weight_decay 0.1 \
   --num_train_epochs 1 \
   --lr_scheduler_type cosine \
   --gradient_accumulation_steps 1 \
   --actor_gradient_checkpointing \
   --critic_gradient_checkpointing \
   --offload_reference_model \
   --actor_dropout 0.0 \
   --num_warmup_steps 100 \
   --deepspeed --seed 1234 \
   --actor_zero_stage $ACTOR_ZERO_STAGE \
   --critic_zero_stage $CRITIC_ZERO_STAGE \
   --enable_hybrid_engine \
   --actor_lora_dim 64 \
   --critic_lora_dim 64 \
   --critic_lora_module_name "layers." \
   --actor_lora_module_name "layers." \
   --output_dir $OUTPUT \
    &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
n=$(grep -c 'LoRA: dimension 64 on 14 linear layers' $LOG || true)
[[ $n == 2 ]] || fail "expected LoRA on the actor's and the critic's 14 linears, found $n lines" $LOG
# Phase 3 of 20 examples at 2,4,4 is 8 prompts: 8 generation batches of one, a PPO round each.
n=$(grep -cE '^(\[rank 0\] )?Average reward score: ' $LOG || true)
[[ $n == 8 ]] || fail "expected 8 PPO rounds, found $n" $LOG
[[ -f $OUTPUT/actor/model.safetensors && -f $OUTPUT/critic/pytorch_model.bin ]] || fail "the models are missing" $LOG
! grep -qa lora $OUTPUT/actor/model.safetensors || fail "the actor's export holds LoRA tensors" $LOG
! grep -qa lora $OUTPUT/critic/pytorch_model.bin || fail "the critic's export holds LoRA tensors" $LOG
echo "DeepSpeed-Chat's step-3 LLaMA-2 LoRA script ran with only the launcher line changed: $(grep 'Average reward score' $LOG | tail -1)"
