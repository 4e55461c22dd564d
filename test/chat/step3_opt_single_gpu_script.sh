#!/usr/bin/env bash
# DeepSpeed-Chat's training/step3_rlhf_finetuning/training_scripts/opt/
# single_gpu/run_1.3b.sh run through dsrun + dschat with only the launcher
# line changed ("deepspeed --num_gpus 1 main.py" -> "dsrun --num_gpus 1
# dschat ppo"): its flags as the script has them (ZeRO-0, LoRA of dimension
# 128 on the actor with gradient checkpointing, the hybrid engine,
# --gradient_accumulation_steps 2, main.py's defaults for the rest: fp16,
# generation and training batches of 16, prompts and answers of 256 tokens),
# the actor and critic paths given as the script's first two arguments (hub
# names of stand-ins in a Hugging Face cache layout: an OPT and an
# OPT-350m-shaped critic), the script run from training/step3_rlhf_finetuning/
# two levels below its data, and --data_path local/jsonfile added (main.py's
# default is the hub dataset Dahoas/rm-static, which is not downloaded).
# Phase 3 holds 32 prompts: two generation batches, two PPO rounds of one
# mini-batch each, so the accumulation group spans both rounds and closes
# with one actor and one critic step. Checks: exit 0, both rounds' lines,
# one optimizer step of each model, and the exports.
#   step3_opt_single_gpu_script.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
source "$(dirname "$0")/chat_util.sh"
setup_run "$1" dschat_step3_opt_1gpu
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"
export PATH="$1/apps/dschat:$PATH"

opt_standin AdamG012/chat-opt-1.3b-sft-deepspeed
opt350m_standin AdamG012/chat-opt-350m-reward-deepspeed
chat_app step3_rlhf_finetuning 80 10
set -- AdamG012/chat-opt-1.3b-sft-deepspeed AdamG012/chat-opt-350m-reward-deepspeed "" "" ""

# The script from here on, with "deepspeed --num_gpus 1 main.py" replaced and --data_path added.
ACTOR_MODEL_PATH=$1
CRITIC_MODEL_PATH=$2
ACTOR_ZERO_STAGE=$3
CRITIC_ZERO_STAGE=$4
OUTPUT=$5
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output
fi
if [ "$ACTOR_ZERO_STAGE" == "" ]; then
    ACTOR_ZERO_STAGE=0
fi
if [ "$CRITIC_ZERO_STAGE" == "" ]; then
    CRITIC_ZERO_STAGE=0
fi
mkdir -p $OUTPUT

"$DSRUN" --num_gpus 1 dschat ppo --data_path local/jsonfile \
   --actor_model_name_or_path $ACTOR_MODEL_PATH --critic_model_name_or_path $CRITIC_MODEL_PATH \
   --actor_zero_stage $ACTOR_ZERO_STAGE --critic_zero_stage $CRITIC_ZERO_STAGE \
   --num_padding_at_beginning 1 --gradient_accumulation_steps 2 \
   --deepspeed --actor_lora_dim 128 --enable_hybrid_engine --actor_gradient_checkpointing --actor_dropout 0.0 \
   --output_dir $OUTPUT &> $OUTPUT/training.log || fail "the script's run failed" $OUTPUT/training.log

LOG=$OUTPUT/training.log
n=$(grep -cE '^(\[rank 0\] )?Average reward score: ' $LOG || true)
[[ $n == 2 ]] || fail "expected 2 PPO rounds, found $n" $LOG
grep -qE '^(\[rank 0\] )?Epoch: 0 \| Step: 1 \| PPO Epoch: 1 \| Actor Loss: ' $LOG || fail "no loss line for the last round" $LOG
# One accumulation group of two mini-batches: one step of the actor and one of the critic, after the second round.
steps=$(grep -cE 'iteration +1/ +1 \|' $LOG || true)
[[ $steps == 2 ]] || fail "expected one actor and one critic step, found $steps step lines" $LOG
for m in actor critic; do
  [[ -f $OUTPUT/$m/config.json ]] || fail "$OUTPUT/$m/config.json missing" $LOG
done
echo "DeepSpeed-Chat's single-GPU step-3 OPT script ran with only the launcher line changed: $(grep 'Average reward score' $LOG | tail -1)"
