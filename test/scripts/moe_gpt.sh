#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/MoE/ scripts run through dsrun +
# dstrain. Their variables, the expert-parallel rule and the option strings
# are kept as the scripts have them; only the launcher line (deepspeed
# pretrain_gpt.py -> dsrun dstrain), the model size (hidden 64, seq 64, 2 or 4
# layers, fewer experts), the duration (tokens, intervals), the learning rates
# (x10, and x30 for the 1.3B one's smaller rate, for the short run) and the paths (a generated corpus and its BPE
# tokenizer) differ. The cluster discovery (nvidia-smi, ds_ssh, NUM_GPUS=64)
# becomes two local CPU ranks, so each script's expert-parallel size
# (min(EP_SIZE, NUM_GPUS), or NUM_GPUS for PR-MoE) is 2 (docs/moe.md).
#   moe_gpt.sh BUILD_DIR SCRIPT
# SCRIPT: 125M_MoE64 (ds_pretrain_gpt_125M_MoE64.sh, 8 experts for 64),
# 1.3B_MoE128 (the same script with other sizes: micro-batch 8, 16 experts
# for 128), 350M_PR-MoE32or64 (PR-MoE: --mlp-type residual, per-layer
# expert counts "4 8" for ten 32s and two 64s; its "EP_SIZE -gt 1" tests read
# the first count) or 1.3B_PR-MoE64or128 (the same with micro-batch 8 and the
# repository's ds_config_gpt_Zero2_TEMPLATE.json: ZeRO stage 2 with expert
# parallelism, prescale_gradients false; the sed lines for ZERO_STAGE and
# PRESCALE_GRAD find nothing to replace in it).
# Checks: the run trains the expected iterations (MoE on every second layer,
# expert parallelism over both ranks, fp16 with the dynamic loss scale,
# activation checkpointing) with falling lm loss and a logged moe loss, writes
# TensorBoard events with the moe loss and a checkpoint with one optimizer
# shard per expert-parallel rank, and a second run of the same script resumes
# from it.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
VARIANT="$2"
case "$VARIANT" in 125M_MoE64 | 1.3B_MoE128 | 350M_PR-MoE32or64 | 1.3B_PR-MoE64or128) ;;
  *) fail "unknown script $VARIANT" ;;
esac
setup_run "$1" "moe_gpt_${VARIANT}"

SEQ_LEN=64
MODEL_SIZE=0.125
NUM_LAYERS=2
[[ $VARIANT == *PR-MoE* ]] && NUM_LAYERS=4
HIDDEN_SIZE=64
NUM_ATTN_HEADS=4
GLOBAL_BATCH_SIZE=16
TRAIN_TOKENS=$((40 * GLOBAL_BATCH_SIZE * SEQ_LEN))
TRAIN_ITERS=$(( ${TRAIN_TOKENS} * 3 / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
EXIT_DURATION=30000000
WARMUP_TOKENS=$((4 * GLOBAL_BATCH_SIZE * SEQ_LEN))
LR_DECAY_TOKENS=${TRAIN_TOKENS}
BATCH_SIZE=4
MP_SIZE=1
PP_SIZE=1
NUM_GPUS=2
NUM_GPUS_PERNODE=2
NUM_NODE=$(( ${NUM_GPUS} / ${NUM_GPUS_PERNODE} ))
EP_SIZE=8
if [[ $VARIANT == 1.3B_MoE128 ]]; then
    MODEL_SIZE=1.3
    BATCH_SIZE=8
    EP_SIZE=16
fi
if [[ $VARIANT == 1.3B_PR-MoE64or128 ]]; then
    MODEL_SIZE=1.3
    BATCH_SIZE=8
fi
if [[ $VARIANT == *PR-MoE* ]]; then
    [[ $VARIANT == 350M_PR-MoE32or64 ]] && MODEL_SIZE=0.35
    EP_SIZE="4 8"
    EP_PARALLEL_SIZE=$NUM_GPUS
elif [[ $EP_SIZE -gt $NUM_GPUS ]]; then
    EP_PARALLEL_SIZE=$NUM_GPUS
else
    EP_PARALLEL_SIZE=$EP_SIZE
fi
LR=4.5e-3
MIN_LR=4.5e-05
if [[ $VARIANT == 1.3B_MoE128 ]]; then
    LR=3.6e-3
    MIN_LR=3.0e-5
elif [[ $VARIANT == 1.3B_PR-MoE64or128 ]]; then
    LR=3.6e-3
    MIN_LR=3.0e-05
elif [[ $VARIANT == 350M_PR-MoE32or64 ]]; then
    LR=3.0e-3
    MIN_LR=1.0e-05
fi
MLC=0.01
MLP_TYPE=""
[[ $VARIANT == *PR-MoE* ]] && MLP_TYPE="--mlp-type residual"
MOE_TRAIN_CAP_FACTOR=1.0
MOE_EVAL_CAP_FACTOR=1.0
MOE_MIN_CAP=4
MOE_DROP_TOKEN="true"
CL_ENABLED="false"
LOG_INTERVAL=4
EVAL_ITERS=2
EVAL_INTERVAL=20
SAVE_INTERVAL=10000
INIT_STD=0.014
ACTIVATION_CHECKPOINT="true"
host="${HOSTNAME:-localhost}"
NAME="gpt-${MODEL_SIZE}B-lr-${LR}-minlr-${MIN_LR}-bs-${GLOBAL_BATCH_SIZE}-gpus-${NUM_GPUS}-mp-${MP_SIZE}-pp-${PP_SIZE}"
if [[ $VARIANT == *PR-MoE* ]]; then
    NAME="${NAME}-ep-pyramid-4+8-mlc-${MLC}-cap-${MOE_TRAIN_CAP_FACTOR}-drop-${MOE_DROP_TOKEN}"
elif [[ ${EP_SIZE%% *} -gt 1 ]]; then
    NAME="${NAME}-ep-${EP_SIZE}-mlc-${MLC}-cap-${MOE_TRAIN_CAP_FACTOR}-drop-${MOE_DROP_TOKEN}"
fi
OUTPUT_BASEPATH=${WORK}/output
mkdir -p "${OUTPUT_BASEPATH}/tensorboard/"
mkdir -p "${OUTPUT_BASEPATH}/checkpoint/"
mkdir -p "${OUTPUT_BASEPATH}/log/"
TENSORBOARD_DIR="${OUTPUT_BASEPATH}/tensorboard/${NAME}_${host}"
mkdir -p ${TENSORBOARD_DIR}
CHECKPOINT_PATH="${OUTPUT_BASEPATH}/checkpoint/${NAME}"
VOCAB_PATH=${TOK}/vocab.json
MERGE_PATH=${TOK}/merges.txt
DATA_PATH=${DATA}/corpus

data_options=" \
         --vocab-file ${VOCAB_PATH} \
         --merge-file ${MERGE_PATH} \
         --data-path ${DATA_PATH} \
         --data-impl mmap"

megatron_options=" \
        --override-opt_param-scheduler \
        --adam-beta1 0.9 \
        --adam-beta2 0.95 \
        --tensor-model-parallel-size ${MP_SIZE} \
        --moe-expert-parallel-size ${EP_PARALLEL_SIZE} \
        --num-experts ${EP_SIZE} \
        --moe-loss-coeff ${MLC} \
        ${MLP_TYPE} \
        --moe-train-capacity-factor ${MOE_TRAIN_CAP_FACTOR} \
        --moe-eval-capacity-factor ${MOE_EVAL_CAP_FACTOR} \
        --moe-min-capacity ${MOE_MIN_CAP} \
        --init-method-std ${INIT_STD} \
        --lr-decay-tokens ${LR_DECAY_TOKENS} \
        --lr-warmup-tokens ${WARMUP_TOKENS} \
        --micro-batch-size ${BATCH_SIZE} \
        --exit-duration-in-mins ${EXIT_DURATION} \
        --global-batch-size ${GLOBAL_BATCH_SIZE} \
        --num-layers ${NUM_LAYERS} \
        --hidden-size ${HIDDEN_SIZE} \
        --num-attention-heads ${NUM_ATTN_HEADS} \
        --seq-length ${SEQ_LEN} \
        --max-position-embeddings ${SEQ_LEN} \
        --train-tokens ${TRAIN_TOKENS} \
        --train-iters ${TRAIN_ITERS} \
        --lr ${LR} \
        --min-lr ${MIN_LR} \
        --lr-decay-style cosine \
        --split 98,2,0 \
        --log-interval ${LOG_INTERVAL} \
        --eval-interval ${EVAL_INTERVAL} \
        --eval-iters ${EVAL_ITERS} \
        --save-interval ${SAVE_INTERVAL} \
        --weight-decay 0.1 \
        --clip-grad 1.0 \
        --hysteresis 2 \
        --num-workers 0 \
        --fp16 \
        --load ${CHECKPOINT_PATH} \
        --save ${CHECKPOINT_PATH} \
        --tensorboard-queue-size 1 \
        --log-timers-to-tensorboard \
        --log-batch-size-to-tensorboard \
        --log-validation-ppl-to-tensorboard \
        --tensorboard-dir ${TENSORBOARD_DIR}"

if [ "${ACTIVATION_CHECKPOINT}" = "true" ]; then
megatron_options="${megatron_options} \
        --checkpoint-activations"
fi

if [[ ${EP_SIZE%% *} -gt 1 ]]; then
megatron_options="${megatron_options} \
        --create-moe-param-group"
fi

if [ "${MOE_DROP_TOKEN}" = "false" ]; then
megatron_options="${megatron_options} \
        --disable-moe-token-dropping"
fi

# The repository's ds_config_gpt_TEMPLATE.json (MoE folder), filled in by the same sed lines.
template_json="${WORK}/ds_config_gpt_TEMPLATE.json"
write_moe_config_template "${template_json}"
if [[ $VARIANT == 1.3B_PR-MoE64or128 ]]; then
    template_json="${WORK}/ds_config_gpt_Zero2_TEMPLATE.json"
    write_moe_config_template "${template_json}" zero2
fi
CL_START_SEQLEN=16
CL_STEP=10
config_json="${WORK}/ds_config_gpt_${NAME}.json"
sed "s/CONFIG_BATCH_SIZE/${GLOBAL_BATCH_SIZE}/" ${template_json} \
    | sed "s/CONFIG_MBSIZE/${BATCH_SIZE}/" \
    | sed "s/LOG_INTERVAL/${LOG_INTERVAL}/" \
    | sed "s/ZERO_STAGE/0/" \
    | sed "s/PRESCALE_GRAD/true/" \
    | sed "s/CONFIG_FP16_ENABLED/true/" \
    | sed "s/CONFIG_BF16_ENABLED/false/" \
    | sed "s/CONFIG_CL_ENABLED/${CL_ENABLED}/" \
    | sed "s/CONFIG_CL_MIN/${CL_START_SEQLEN}/" \
    | sed "s/CONFIG_CL_MAX/${SEQ_LEN}/" \
    | sed "s/CONFIG_CL_DURATION/${CL_STEP}/" \
      > ${config_json}

deepspeed_options=" \
		    --deepspeed \
		    --deepspeed_config ${config_json} \
		    --pipeline-model-parallel-size ${PP_SIZE}"

if [[ ${EP_SIZE%% *} -gt 1 ]]; then
deepspeed_options="${deepspeed_options} \
        --no-pipeline-parallel"
fi

if [ "${ACTIVATION_CHECKPOINT}" = "true" ]; then
deepspeed_options="${deepspeed_options} \
        --deepspeed-activation-checkpointing"
fi

log1="${OUTPUT_BASEPATH}/log/${NAME}_run1.log"
${DSRUN} --num_gpus ${NUM_GPUS} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log1} ||
  fail "first run exited $?" "${log1}"
iters=$(( TRAIN_TOKENS / GLOBAL_BATCH_SIZE / SEQ_LEN ))
check_trained "${log1}" ${iters} ${iters}
check_loss_falls "${log1}"
if [[ $VARIANT == *PR-MoE* ]]; then
  moe_line="mixture of experts: 2 MoE layers (every 2, PR-MoE: a dense MLP beside the experts), experts 4,8, top-1"
  ep_line="expert parallel: 2 ranks, this rank holds block 0 of each MoE layer's experts (2,4 per MoE layer)"
else
  moe_line="mixture of experts: 1 MoE layers (every 2), experts ${EP_SIZE}, top-1"
  ep_line="expert parallel: 2 ranks, this rank holds block 0 of each MoE layer's experts ($(( EP_SIZE / 2 )) per MoE layer)"
fi
grep -qF "${moe_line}" "${log1}" || fail "no MoE start-up line" "${log1}"
grep -qF "${ep_line}" "${log1}" || fail "no expert-parallel start-up line" "${log1}"
if [[ $VARIANT == 1.3B_PR-MoE64or128 ]]; then
  grep -q "model state: .*(ZeRO stage 2, 2 data-parallel ranks, the dense weights' state partitioned over the 2 data-parallel ranks, the experts' over the 1 expert-data-parallel ranks" \
    "${log1}" || fail "not ZeRO stage 2 with the dense weights over the data-parallel ranks, the experts over the expert-data-parallel ones" "${log1}"
fi
grep -qE "moe loss: [0-9.]+E[-+][0-9]+" "${log1}" || fail "no moe loss in the iteration lines" "${log1}"
ls "${TENSORBOARD_DIR}"/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard event file in ${TENSORBOARD_DIR}" "${log1}"
grep -qa "moe loss" "${TENSORBOARD_DIR}"/events.out.tfevents.* || fail "no moe loss in the TensorBoard events" "${log1}"
[[ "$(cat "${CHECKPOINT_PATH}/latest")" == "global_step${iters}" ]] || fail "latest is not global_step${iters}" "${log1}"
for ep in 00 01; do
  ls "${CHECKPOINT_PATH}/global_step${iters}/"optim_pp00_tp00_ep${ep}_rank00000_of_00001.* >/dev/null 2>&1 ||
    fail "no optimizer shard of expert-parallel rank ${ep} in global_step${iters}" "${log1}"
done

# The same script again with twice the tokens: it resumes from the checkpoint.
TRAIN_TOKENS=$(( 2 * TRAIN_TOKENS ))
megatron_options="${megatron_options/--train-tokens ${LR_DECAY_TOKENS}/--train-tokens ${TRAIN_TOKENS}}"
log2="${OUTPUT_BASEPATH}/log/${NAME}_run2.log"
${DSRUN} --num_gpus ${NUM_GPUS} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log2} ||
  fail "resumed run exited $?" "${log2}"
check_trained "${log2}" $(( iters + LOG_INTERVAL )) $(( 2 * iters ))
echo "PASS: ${VARIANT} flags on 2 ranks with EP2: ${iters} iterations, loss falls, moe loss logged, resumed to $(( 2 * iters ))"
