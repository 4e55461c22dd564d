#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/rebase/ds_pretrain_gpt_1.3B_rope_slw.sh
# (sequence-length warmup: DeepSpeed's curriculum_learning section in
# ds_config_gpt_slw_TEMPLATE.json, on partial RoPE) run through dsrun + dstrain.
# Its variables, option strings, template and sed lines are kept as the script
# has them; only the launcher line (deepspeed pretrain_gpt.py -> dsrun dstrain),
# the model size (2 layers, hidden 64, seq 64, curriculum from 16), the duration
# (tokens, intervals) and the paths (a generated corpus and its BPE tokenizer)
# differ. The cluster discovery (nvidia-smi, ds_ssh) becomes 4 local CPU ranks
# (TP2 x PP2, as the script's pipeline path), and the checkpoint pointer fix-up
# over ssh is left out (one node).
#   rebase_gpt_rope_slw.sh BUILD_DIR
# Checks: the run trains the number of iterations that --train-tokens gives
# with the curriculum's shorter steps (more than at the full length), logs
# the growing curriculum seqlen, writes it to TensorBoard, loss falls, and a
# second run of the same script resumes from the checkpoint.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" rebase_gpt_rope_slw

seq_len=64
model_size=1.3
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=16
lr=6.0e-3
min_lr=1.0e-4
init_std=0.02
train_tokens=$((16 * global_batch_size * seq_len))
train_samples=$(( train_tokens * 2 / ${seq_len} ))
exit_duration=30000000
lr_warmup_tokens=$((12 * global_batch_size * seq_len))
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
# The script's own curriculum lines: a third of the warmup, from cl_min tokens.
cl_step=$(( ${lr_warmup_tokens} / 3 / ${global_batch_size} / ${seq_len} ))
cl_min=16
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
jobname="gpt_${model_size}B_rebase_rope0.25_cl_step${cl_step}_cl_min${cl_min}"
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
    --use-rotary-position-embeddings \
    --rotary-percent 0.25 \
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

# The repository's ds_config_gpt_slw_TEMPLATE.json, filled in by the same sed lines.
config_json="${WORK}/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}_cl_step${cl_step}_cl_min${cl_min}.json"
template_json="${WORK}/ds_config_gpt_slw_TEMPLATE.json"
cat > "${template_json}" <<'JSON'
{
  "train_batch_size": GBSIZE,
  "train_micro_batch_size_per_gpu": MBSIZE,
  "steps_per_print": LOG_INTERVAL,
  "zero_optimization": {
    "stage": ZERO_STAGE
  },
  "gradient_clipping": 1.0,
  "prescale_gradients": PRESCALE_GRAD,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },
  "wall_clock_breakdown" : false,
  "curriculum_learning": {
    "enabled": true,
    "curriculum_type": "seqlen",
    "min_difficulty": CONFIG_CL_MIN,
    "max_difficulty": CONFIG_CL_MAX,
    "schedule_type": "fixed_linear",
    "schedule_config": {
      "total_curriculum_step": CONFIG_CL_DURATION,
      "difficulty_step": 8
    }
  }
}
JSON
sed "s/GBSIZE/${global_batch_size}/" ${template_json} \
    | sed "s/MBSIZE/${batch_size}/" \
    | sed "s/LOG_INTERVAL/${log_interval}/" \
    | sed "s/ZERO_STAGE/${zero_stage}/" \
    | sed "s/PRESCALE_GRAD/${prescale_grad}/" \
    | sed "s/CONFIG_CL_MIN/${cl_min}/" \
    | sed "s/CONFIG_CL_MAX/${seq_len}/" \
    | sed "s/CONFIG_CL_DURATION/${cl_step}/" \
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
# DeepSpeed's fixed_linear lengths (exact in integers for these values:
# floor(s / cl_step * (seq_len - cl_min) + cl_min), down to a multiple of 8, at
# most seq_len), and the iterations --train-tokens allows with them.
cl_len() {
  local s=$1 d
  d=$(( s * (seq_len - cl_min) / cl_step + cl_min ))
  d=$(( d - d % 8 ))
  (( d > seq_len )) && d=${seq_len}
  echo $d
}
iters=0
tokens=0
while (( tokens < train_tokens )); do
  iters=$(( iters + 1 ))
  tokens=$(( tokens + global_batch_size * $(cl_len ${iters}) ))
done
full_iters=$(( train_tokens / global_batch_size / seq_len ))
(( iters > full_iters )) || fail "expected more iterations with the curriculum ($iters) than without ($full_iters)"
check_trained "${log1}" ${iters} ${iters}
check_loss_falls "${log1}"
grep -qE "iteration +2/.*\| curriculum seqlen: +$(cl_len 2) \|" "${log1}" ||
  fail "iteration 2 does not log curriculum seqlen $(cl_len 2)" "${log1}"
grep -qE "iteration +${iters}/.*\| curriculum seqlen: +${seq_len} \|" "${log1}" ||
  fail "iteration ${iters} does not log curriculum seqlen ${seq_len}" "${log1}"
grep -q "seqlen/curriculum_seqlen" "${tensorboard_path}"/events.out.tfevents.* ||
  fail "no seqlen/curriculum_seqlen scalars in ${tensorboard_path}" "${log1}"
[[ "$(cat "${checkpoint_path}/latest")" == "global_step${iters}" ]] || fail "latest is not global_step${iters}" "${log1}"
grep -q '"consumed_tokens": '"${tokens}" "${checkpoint_path}/global_step${iters}/state.json" ||
  fail "the checkpoint does not hold consumed_tokens ${tokens}" "${log1}"

# The same script again with 4 more full-length steps' worth of tokens: it
# resumes from the checkpoint at the full length (the schedule now differs;
# --override-opt_param-scheduler takes the flags'), one step per global batch
# of tokens, within --train-samples (unchanged).
train_tokens=$(( train_tokens + 4 * global_batch_size * seq_len ))
megatron_options="${megatron_options/--train-tokens ${lr_decay_tokens}/--train-tokens ${train_tokens}}"
log2="${log_path}/${jobname}_run2.log"
${DSRUN} --num_gpus ${num_gpus} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} &>> ${log2} ||
  fail "resumed run exited $?" "${log2}"
iters2=$(( iters + (train_tokens - tokens + global_batch_size * seq_len - 1) / (global_batch_size * seq_len) ))
(( iters2 <= train_samples / global_batch_size )) || iters2=$(( train_samples / global_batch_size ))
check_trained "${log2}" $(( iters + log_interval )) ${iters2}
grep -qE "iteration +${iters2}/.*\| curriculum seqlen: +${seq_len} \|" "${log2}" ||
  fail "the resumed run does not log curriculum seqlen ${seq_len}" "${log2}"
echo "PASS: rebase 1.3B rope_slw flags: ${iters} iterations (${full_iters} at the full length), curriculum seqlen $(cl_len 1) -> ${seq_len}, loss falls, resumed to ${iters2}"
