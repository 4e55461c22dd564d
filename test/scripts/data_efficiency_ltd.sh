#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/data_efficiency/gpt/pretrain/
# ds_pretrain_gpt_1.3B_dense_base_script.sh, called as its run script's
# random-LTD block does (ds_pretrain_gpt_1.3B_dense_run.sh: "lr tokens
# ltd_enabled ltd_start ltd_step" = 2.0e-4 300 true 128 200000), run through
# dsrun + dstrain. Its variables, option strings and the sed lines that fill
# ds_config_gpt_1clmetric_TEMPLATE.json are kept as the script has them; only
# the launcher line, the model width (24 layers as the template's layer list
# needs, hidden 64, seq 64), the batch (16), the duration and schedule (tokens
# in hundreds instead of billions, random-LTD from 16 over 20 steps), the
# intervals and the paths (a generated corpus and its BPE tokenizer) differ.
# The cluster discovery (nvidia-smi, ds_ssh) and the checkpoint-pointer loop
# over worker nodes become 2 local CPU ranks.
#   data_efficiency_ltd.sh BUILD_DIR
# Checks: the run trains exactly the iterations that Megatron-DeepSpeed's
# token count gives (an independent transcription of DeepSpeed's reserved-length
# schedule and Megatron's actual_seq_length below), with the reserved length
# logged as upstream, falling loss, full recomputation on, and a checkpoint.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" data_efficiency_ltd

seq_len=64
model_size=1.3
num_layers=24
hidden_size=64
num_attn_heads=4
global_batch_size=16
lr=2.0e-3
min_lr=1.0e-6
init_std=0.013
train_tokens_in_billion=20
train_tokens=$((${train_tokens_in_billion} * 1024))
train_samples=$(( 300 * 1024 * 2 / ${seq_len} ))
exit_duration=30000000
lr_warmup_tokens_in_million=2
lr_warmup_tokens=$((${lr_warmup_tokens_in_million} * 1024))
lr_decay_tokens_in_billion=${train_tokens_in_billion}
lr_decay_tokens=$((${lr_decay_tokens_in_billion} * 1024))
lr_decay_style="cosine"
mp_size=1
pp_size=1
no_pp="true"
zero_stage=1
num_gpus=2
num_gpus_pernode=2
num_node=$(( ${num_gpus} / ${num_gpus_pernode} ))
dp_size=$(( ${num_gpus} / ${pp_size} / ${mp_size} ))
batch_size=$(( ${global_batch_size} / ${dp_size} ))
ltd_enabled=true
ltd_start=16
ltd_step=20
cl_enabled=false
cl_num_metric=1
log_interval=1
eval_iters=2
eval_interval=100
num_save=1
estimated_train_iter=$((${train_tokens} / ${seq_len} / ${global_batch_size}))
save_interval=$((${estimated_train_iter} / ${num_save}))
activation_checkpoint="true"
log_optimizer_state="true"
host="${HOSTNAME:-localhost}"
seed=1234
num_workers=0
data_path="${DATA}/corpus"
vocab_path="${TOK}/vocab.json"
merge_path="${TOK}/merges.txt"
prescale_grad="true"
jobname="gpt_${model_size}B_tok${train_tokens_in_billion}B"
jobname="${jobname}_lr${lr}_min${min_lr}_w${lr_warmup_tokens_in_million}M_d${lr_decay_tokens_in_billion}B_${lr_decay_style}"
jobname="${jobname}_gbs${global_batch_size}_mbs${batch_size}_g${num_gpus}"
if [[ $zero_stage -gt 0 ]]; then
    jobname="${jobname}_z${zero_stage}"
    prescale_grad="false"
fi
jobname="${jobname}_seed${seed}"
if [ "${ltd_enabled}" = "true" ]; then
    jobname="${jobname}_ltd_${ltd_start}_${ltd_step}"
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

if [ "${ltd_enabled}" = "true" ]; then
megatron_options="${megatron_options} \
    --random-ltd"
fi

config_json="${WORK}/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}_seed${seed}"
if [ "${ltd_enabled}" = "true" ]; then
    config_json="${config_json}_ltd_${ltd_start}_${ltd_step}"
fi
config_json="${config_json}.json"
template_json="${WORK}/ds_config_gpt_1clmetric_TEMPLATE.json"
write_data_efficiency_config_template "${template_json}"
sed "s/GBSIZE/${global_batch_size}/" ${template_json} \
    | sed "s/MBSIZE/${batch_size}/" \
    | sed "s/LOG_INTERVAL/${log_interval}/" \
    | sed "s/ZERO_STAGE/${zero_stage}/" \
    | sed "s/PRESCALE_GRAD/${prescale_grad}/" \
    | sed "s/DATA_EFFICIENCY_SEED/${seed}/" \
    | sed "s/LTD_ENABLED/${ltd_enabled}/" \
    | sed "s/LTD_MIN/${ltd_start}/" \
    | sed "s/LTD_MAX/${seq_len}/" \
    | sed "s/LTD_STEP/${ltd_step}/" \
    | sed "s/CL_ENABLED/${cl_enabled}/" \
    | sed "s/DATA_SAMPLING_NUM_WORKERS/${num_workers}/" \
    | sed "s#CL_CLUSTER_PATH#dummy#" \
    | sed "s#CL_1st_METRIC_NAME#dummy#" \
    | sed "s#CL_1st_SAMPLE_PATH#dummy#" \
    | sed "s#CL_1st_METRIC_PATH#dummy#" \
    | sed "s#CL_1st_DIFF_TYPE#value#" \
    | sed "s#CL_1st_CLUSTER_TYPE#single_cluster#" \
    | sed "s/CL_1st_MIN/2048/" \
    | sed "s/CL_1st_MAX/2048/" \
    | sed "s/CL_1st_TOTAL_STEP/1/" \
    | sed "s/CL_1st_DIFF_STEP/1/" \
    | sed "s/CL_1st_ROOT/1/" \
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

log="${log_path}/${jobname}_${host}.log"
${DSRUN} --num_gpus ${num_gpus_pernode} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log} ||
  fail "random-LTD run exited $?" "${log}"

# Iterations until the consumed tokens reach train_tokens: DeepSpeed's
# fixed_linear reserved length R(s) = floor(s / ltd_step * (seq - start) + start)
# in multiples of 16 (the template's seq_per_step), at most seq; Megatron's
# tokens per sample (seq (L - n) + R n) // L while R < seq, n = 22 of L = 24.
iters=$(awk -v T=${seq_len} -v L=${num_layers} -v n=22 -v lo=${ltd_start} -v steps=${ltd_step} \
            -v gbs=${global_batch_size} -v goal=${train_tokens} 'BEGIN {
  tokens = 0; s = 0;
  while (tokens < goal) {
    r = int(s / steps * (T - lo) + lo); r -= r % 16; if (r > T) r = T;
    a = (r < T) ? int((T * (L - n) + r * n) / L) : T;
    tokens += gbs * a; s += 1;
  }
  print s }')
(( iters > train_tokens / global_batch_size / seq_len )) || fail "the schedule should need more iterations than the baseline"
check_trained "${log}" 1 ${iters}
check_loss_falls "${log}"
grep -q "random-LTD: 22 of 24 layers drop tokens in training; reserved length 16 -> 64 over 20 steps" "${log}" ||
  fail "no random-LTD start-up line" "${log}"
for r in 16 32 48 64; do
  grep -q "| random ltd reserved length: $(printf '%5d' $r) |" "${log}" || fail "no iteration with reserved length $r" "${log}"
done
grep -q "recompute full" "${log}" || fail "no full recomputation (--checkpoint-activations)" "${log}"
ls "${tensorboard_path}"/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard event file in ${tensorboard_path}" "${log}"
[[ "$(cat "${checkpoint_path}/latest")" == "global_step${iters}" ]] || fail "latest is not global_step${iters}" "${log}"
echo "PASS: data_efficiency random-LTD block: ${iters} iterations (the baseline's token count would stop at $(( train_tokens / global_batch_size / seq_len ))), reserved 16 -> 64, loss falls"
