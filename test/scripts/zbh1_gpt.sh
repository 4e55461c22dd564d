#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/zero_bubble_pp/zbh1_pretrain_gpt_1.3b.sh
# run through dsrun + dstrain. Its variables and option strings are kept as
# the script has them (the Megatron options are those of rebase/, and it
# fills rebase/ds_config_gpt_TEMPLATE.json with the same sed lines); only the
# launcher line (deepspeed pretrain_gpt.py -> dsrun dstrain), the model size
# (4 layers, hidden 64, seq 64), the pipeline size (8 -> 4 stages), the
# duration (tokens, evaluation iterations) and the paths (a generated corpus and its BPE
# tokenizer) differ. The cluster discovery (nvidia-smi, ds_ssh) and the
# checkpoint-pointer loop over worker nodes become 4 local CPU ranks.
#   zbh1_gpt.sh BUILD_DIR
# Checks: the run trains the expected number of iterations on the ZB-H1
# schedule with exact semantics (16 micro-batches through 4 stages) with
# falling loss, writes TensorBoard events and a checkpoint; the same script
# without the two ZB-H1 flags (1F1B) writes a bit-identical checkpoint.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" zbh1_gpt

seq_len=64
model_size=1.3
num_layers=4
hidden_size=64
num_attn_heads=4
global_batch_size=16
lr=6.0e-3
min_lr=1.0e-6
init_std=0.013
train_tokens=$((24 * global_batch_size * seq_len))
train_samples=$(( train_tokens * 2 / ${seq_len} ))
exit_duration=30000000
lr_warmup_tokens=$((2 * global_batch_size * seq_len))
lr_decay_tokens=${train_tokens}
lr_decay_style="cosine"
mp_size=1
pp_size=4
no_pp="false"
zero_stage=0
num_gpus=4
num_gpus_pernode=4
num_node=$(( ${num_gpus} / ${num_gpus_pernode} ))
dp_size=$(( ${num_gpus} / ${pp_size} / ${mp_size} ))
batch_size=1
log_interval=1
eval_iters=2
eval_interval=10100
num_save=1
save_interval=10100
activation_checkpoint="false"
log_optimizer_state="true"
host="${HOSTNAME:-localhost}"
seed=1234
num_workers=0
data_path="${DATA}/corpus"
vocab_path="${TOK}/vocab.json"
merge_path="${TOK}/merges.txt"
prescale_grad="true"
jobname="gpt_${model_size}B_zbh1"
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
    --enable-zbh1-pipeline \
    --enable-zbh1-exact-semantics \
    --pipeline-model-parallel-size ${pp_size}"

if [[ "${no_pp}" = "true" ]]; then
deepspeed_options="${deepspeed_options} \
    --no-pipeline-parallel"
fi

if [ "${activation_checkpoint}" = "true" ]; then
deepspeed_options="${deepspeed_options} \
    --deepspeed-activation-checkpointing"
fi

log1="${log_path}/${jobname}_zbh1.log"
${DSRUN} --num_gpus ${num_gpus} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log1} ||
  fail "ZB-H1 run exited $?" "${log1}"
iters=$(( train_tokens / global_batch_size / seq_len ))
check_trained "${log1}" 1 ${iters}
check_loss_falls "${log1}"
grep -q "pipeline parallel: 4 stages (ZB-H1, exact semantics)" "${log1}" || fail "no ZB-H1 schedule line" "${log1}"
ls "${tensorboard_path}"/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard event file in ${tensorboard_path}" "${log1}"
[[ "$(cat "${checkpoint_path}/latest")" == "global_step${iters}" ]] || fail "latest is not global_step${iters}" "${log1}"

# The same script on 1F1B (the two ZB-H1 flags dropped), into another
# checkpoint directory: exact semantics sum every gradient in 1F1B's order.
deepspeed_options="${deepspeed_options/--enable-zbh1-pipeline/}"
deepspeed_options="${deepspeed_options/--enable-zbh1-exact-semantics/}"
megatron_options="${megatron_options//${checkpoint_path}/${checkpoint_path}_1f1b}"
log2="${log_path}/${jobname}_1f1b.log"
${DSRUN} --num_gpus ${num_gpus} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log2} ||
  fail "1F1B run exited $?" "${log2}"
grep -q "pipeline parallel: 4 stages (1F1B)" "${log2}" || fail "no 1F1B schedule line" "${log2}"
cmp -s "${checkpoint_path}/global_step${iters}/model.safetensors" \
  "${checkpoint_path}_1f1b/global_step${iters}/model.safetensors" ||
  fail "the ZB-H1 (exact) and 1F1B weights differ after ${iters} iterations" "${log2}"
echo "PASS: zbh1 1.3B flags: ${iters} iterations on ZB-H1 (exact), loss falls, weights equal 1F1B's bit for bit"
