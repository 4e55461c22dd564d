#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/rebase/ds_pretrain_gpt_125M.sh run
# through dsrun + dstrain. Its variables and option strings are kept as the
# script has them; only the launcher line (deepspeed pretrain_gpt.py -> dsrun
# dstrain), the model size (2 layers, hidden 64, seq 64), the duration (tokens,
# intervals) and the paths (a generated corpus and its BPE tokenizer) differ.
# The cluster discovery (nvidia-smi, ds_ssh) becomes 4 local CPU ranks.
#   rebase_gpt_125m.sh BUILD_DIR
# Checks: the run trains the expected number of iterations (from
# --train-tokens) with falling loss, writes TensorBoard events and a
# checkpoint, and a second run of the same script resumes from it.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" rebase_gpt_125m

seq_len=64
model_size=0.125
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=16
lr=6.0e-3
min_lr=1.0e-4
init_std=0.02
train_tokens=$((24 * global_batch_size * seq_len))
train_samples=$(( train_tokens * 2 / ${seq_len} ))
exit_duration=30000000
lr_warmup_tokens=$((4 * global_batch_size * seq_len))
lr_decay_tokens=${train_tokens}
lr_decay_style="cosine"
mp_size=2
pp_size=2
no_pp="false"
zero_stage=1
num_gpus=4
num_gpus_pernode=4
num_node=$(( ${num_gpus} / ${num_gpus_pernode} ))
dp_size=$(( ${num_gpus} / ${pp_size} / ${mp_size} ))
batch_size=2
log_interval=2
eval_iters=2
eval_interval=12
save_interval=12
activation_checkpoint="true"
log_optimizer_state="true"
host="${HOSTNAME:-localhost}"
seed=1234
num_workers=0
data_path="${DATA}/corpus"
vocab_path="${TOK}/vocab.json"
merge_path="${TOK}/merges.txt"
prescale_grad="true"
jobname="gpt_${model_size}B_rebase"
if [[ $zero_stage -gt 0 ]]; then
    prescale_grad="false"
fi
output_home="${WORK}/output"
log_path="${output_home}/log/"
checkpoint_path="${output_home}/checkpoint/${jobname}"
tensorboard_path="${output_home}/tensorboard/${jobname}_${host}"
mkdir -p ${log_path}
mkdir -p ${checkpoint_path}
mkdir -p ${tensorboard_path}

data_options=" \
    --vocab-file ${vocab_path} \
    --merge-file ${merge_path} \
    --data-path ${data_path} \
    --data-impl mmap"

megatron_options=" \
    --override-opt_param-scheduler \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --tensor-model-parallel-size ${mp_size} \
    --init-method-std ${init_std} \
    --lr-decay-tokens ${lr_decay_tokens} \
    --lr-warmup-tokens ${lr_warmup_tokens} \
    --micro-batch-size ${batch_size} \
    --exit-duration-in-mins ${exit_duration} \
    --global-batch-size ${global_batch_size} \
    --num-layers ${num_layers} \
    --hidden-size ${hidden_size} \
    --num-attention-heads ${num_attn_heads} \
    --seq-length ${seq_len} \
    --max-position-embeddings ${seq_len} \
    --train-tokens ${train_tokens} \
    --train-samples ${train_samples} \
    --lr ${lr} \
    --min-lr ${min_lr} \
    --lr-decay-style ${lr_decay_style} \
    --split 949,50,1 \
    --log-interval ${log_interval} \
    --eval-interval ${eval_interval} \
    --eval-iters ${eval_iters} \
    --save-interval ${save_interval} \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --hysteresis 2 \
    --num-workers ${num_workers} \
    --fp16 \
    --seed ${seed} \
    --load ${checkpoint_path} \
    --save ${checkpoint_path} \
    --no-async-tensor-model-parallel-allreduce \
    --tensorboard-queue-size 1 \
    --log-timers-to-tensorboard \
    --log-batch-size-to-tensorboard \
    --log-validation-ppl-to-tensorboard \
    --tensorboard-dir ${tensorboard_path}"

if [ "${activation_checkpoint}" = "true" ]; then
megatron_options="${megatron_options} \
    --checkpoint-activations"
fi

if [ "${log_optimizer_state}" = "true" ]; then
megatron_options="${megatron_options} \
    --log-optimizer-states-to-tensorboard"
fi

# The repository's ds_config_gpt_TEMPLATE.json, filled in by the same sed lines.
config_json="${WORK}/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}.json"
template_json="${WORK}/ds_config_gpt_TEMPLATE.json"
write_rebase_config_template "${template_json}"
sed "s/GBSIZE/${global_batch_size}/" ${template_json} \
    | sed "s/MBSIZE/${batch_size}/" \
    | sed "s/LOG_INTERVAL/${log_interval}/" \
    | sed "s/ZERO_STAGE/${zero_stage}/" \
    | sed "s/PRESCALE_GRAD/${prescale_grad}/" \
      > ${config_json}

deepspeed_options=" \
    --deepspeed \
    --deepspeed_config ${config_json} \
    --zero-stage ${zero_stage} \
    --pipeline-model-parallel-size ${pp_size}"

if [[ "${no_pp}" = "true" ]]; then
deepspeed_options="${deepspeed_options} \
    --no-pipeline-parallel"
fi

if [ "${activation_checkpoint}" = "true" ]; then
deepspeed_options="${deepspeed_options} \
    --deepspeed-activation-checkpointing"
fi

log1="${log_path}/${jobname}_run1.log"
${DSRUN} --num_gpus ${num_gpus} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log1} ||
  fail "first run exited $?" "${log1}"
iters=$(( train_tokens / global_batch_size / seq_len ))
check_trained "${log1}" ${iters} ${iters}
check_loss_falls "${log1}"
ls "${tensorboard_path}"/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard event file in ${tensorboard_path}" "${log1}"
[[ "$(cat "${checkpoint_path}/latest")" == "global_step${iters}" ]] || fail "latest is not global_step${iters}" "${log1}"

# The same script again with twice the tokens: it resumes from the checkpoint
# (the schedule now differs; --override-opt_param-scheduler takes the flags').
train_tokens=$(( 2 * train_tokens ))
megatron_options="${megatron_options/--train-tokens ${lr_decay_tokens}/--train-tokens ${train_tokens}}"
log2="${log_path}/${jobname}_run2.log"
${DSRUN} --num_gpus ${num_gpus} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log2} ||
  fail "resumed run exited $?" "${log2}"
check_trained "${log2}" $(( iters + log_interval )) $(( 2 * iters ))
echo "PASS: rebase 125M flags: ${iters} iterations, loss falls, resumed to $(( 2 * iters ))"
