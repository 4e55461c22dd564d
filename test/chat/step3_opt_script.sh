#!/usr/bin/env bash
# DeepSpeed-Chat's training/step3_rlhf_finetuning/training_scripts/opt/
# single_node/run_1.3b.sh run through dsrun + dschat with only the launcher
# line changed ("deepspeed --master_port 12346 main.py" -> "dsrun
# --master_port 12346 dschat ppo"): its flags as the script has them (ZeRO-2
# for both models, hybrid engine, EMA, TensorBoard into $OUTPUT, prompts and
# answers of 256 tokens), the actor AdamG012/chat-opt-1.3b-sft-deepspeed and
# the critic AdamG012/chat-opt-350m-reward-deepspeed found in a Hugging Face
# cache layout (HF_HUB_CACHE) that holds tiny stand-in OPTs exported by
# dstrain (the critic shaped as opt-350m: post-LayerNorm blocks and
# project_in / project_out; its value head then starts fresh, as a reward
# model without v_head.weight does), the script run from
# training/step3_rlhf_finetuning/ two levels below its data, and --data_path
# substituted by local/jsonfile. Checks: exit 0, one PPO round per
# generation batch with its losses and rewards, the actor, critic and
# actor_ema models in $OUTPUT, and the step-3 TensorBoard file beside them.
#   step3_opt_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
setup_run "$1" dschat_step3_opt
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

# The stand-in models, exported by dstrain (0 iterations: their initial weights).
opt_standin AdamG012/chat-opt-1.3b-sft-deepspeed
opt350m_standin AdamG012/chat-opt-350m-reward-deepspeed

# DeepSpeed-Chat's application folder: data/ two levels above the step's folder.
chat_app step3_rlhf_finetuning 40 10

# The script from here on, with "deepspeed main.py" replaced and --data_path substituted.
ACTOR_MODEL_PATH=""
CRITIC_MODEL_PATH=""
ACTOR_ZERO_STAGE=""
CRITIC_ZERO_STAGE=""
OUTPUT=""
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output
fi
if [ "$ACTOR_ZERO_STAGE" == "" ]; then
    ACTOR_ZERO_STAGE=2
fi
if [ "$CRITIC_ZERO_STAGE" == "" ]; then
    CRITIC_ZERO_STAGE=2
fi

if [ "$ACTOR_MODEL_PATH" == "" ]; then
    ACTOR_MODEL_PATH=AdamG012/chat-opt-1.3b-sft-deepspeed
fi
if [ "$CRITIC_MODEL_PATH" == "" ]; then
    CRITIC_MODEL_PATH=AdamG012/chat-opt-350m-reward-deepspeed
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
   --per_device_generation_batch_size 4 \
   --per_device_training_batch_size 4 \
   --generation_batches 1 \
   --ppo_epochs 1 \
   --max_answer_seq_len 256 \
   --max_prompt_seq_len 256 \
   --actor_learning_rate ${Actor_Lr} \
   --critic_learning_rate ${Critic_Lr} \
   --num_train_epochs 1 \
   --lr_scheduler_type cosine \
   --gradient_accumulation_steps 1 \
   --actor_dropout 0.0 \
   --num_warmup_steps 100 \
   --deepspeed --seed 1234 \
   --enable_hybrid_engine \
   --actor_zero_stage $ACTOR_ZERO_STAGE \
   --critic_zero_stage $CRITIC_ZERO_STAGE \
   --enable_ema \
   --output_dir $OUTPUT \
   --enable_tensorboard \
   --tensorboard_path $OUTPUT \
    &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
# Phase 3 of 40 examples at 2,4,4 is 16 prompts: 4 generation batches of 4, one PPO round each.
n=$(grep -cE '^(\[rank 0\] )?Average reward score: ' $LOG || true)
[[ $n == 4 ]] || fail "expected 4 PPO rounds, found $n" $LOG
grep -qE '^(\[rank 0\] )?Epoch: 0 \| Step: 3 \| PPO Epoch: 1 \| Actor Loss: ' $LOG || fail "no loss line for the last round" $LOG
for m in actor critic actor_ema; do
  [[ -f $OUTPUT/$m/config.json ]] || fail "$OUTPUT/$m/config.json missing" $LOG
done
[[ -f $OUTPUT/actor/model.safetensors && -f $OUTPUT/actor_ema/model.safetensors ]] || fail "the actor's weights are missing" $LOG
[[ -f $OUTPUT/critic/pytorch_model.bin ]] || fail "the critic's pytorch_model.bin is missing" $LOG
ls $OUTPUT/step3_tensorboard_logs/events.out.tfevents.* > /dev/null 2>&1 || fail "no step-3 TensorBoard events" $LOG
echo "DeepSpeed-Chat's step-3 OPT script ran with only the launcher line changed: $(grep 'Average reward score' $LOG | tail -1)"
