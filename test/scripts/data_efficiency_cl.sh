#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/data_efficiency/gpt/: the data
# analysis (ds_analyze_gpt_data_map.sh and ds_analyze_gpt_data_reduce.sh, for
# total_vocab_freq and then vocab_rarity) with `python ../analyze_data.py`
# replaced by dsprep, then pretrain/ds_pretrain_gpt_1.3B_dense_base_script.sh
# called as its run script's "CL+random-LTD" block does (curriculum learning
# by data sampling on vocabulary rarity by percentile and seqlen_truncate,
# with random-LTD), through dsrun + dstrain. The option strings and the sed
# lines that fill ds_config_gpt_2clmetrics_TEMPLATE.json are kept as the
# scripts have them; only the launcher lines, the model width (24 layers as
# the template's layer list needs, hidden 64, seq 64), the batch (16), the
# analysis threads (4, not 40), the duration and schedules (tokens in
# hundreds instead of billions; curriculum and random-LTD over 20 steps; the
# sequence-length curriculum from 16 instead of 80), the intervals and the
# paths (a generated corpus and its BPE tokenizer; the index maps, which the
# analysis does not write here, are written by dstrain's first run) differ.
# The cluster discovery (nvidia-smi, ds_ssh) and the checkpoint-pointer loop
# over worker nodes become 2 local CPU ranks.
#   data_efficiency_cl.sh BUILD_DIR
# Checks: the analysis writes DeepSpeed's index files; the run trains exactly
# the iterations Megatron-DeepSpeed's token count gives for the two schedules
# (an independent transcription below), logs the curriculum seqlen and the
# random-LTD length as upstream, forms the rarity clusters percentile by
# percentile, writes the index maps, its loss falls, and the checkpoint's
# resolved configuration has both features on as given.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" data_efficiency_cl

# ---- ds_analyze_gpt_data_map.sh / ds_analyze_gpt_data_reduce.sh ----
num_workers=1
num_threads=4
num_threads_reduce=4
num_epochs=1
worker_id=0
save_path="${WORK}/analysis_gpt_${num_epochs}epoch/"
seq_len=64
batch_size=10000
data_path="${DATA}/corpus"
vocab_path="${TOK}/vocab.json"
merge_path="${TOK}/merges.txt"
for metric in total_vocab_freq vocab_rarity; do
  for task in map reduce; do
    jobname="gpt-analyzing-${metric}-${num_epochs}epoch-${task}-worker${worker_id}"
    options=" \
        --analyzing-task ${task} \
        --analyzing-data-type GPT \
        --analyzing-metric ${metric} \
        --analyzing-num-workers ${num_workers} \
        --analyzing-num-threads ${num_threads} \
        --vocab-file ${vocab_path} \
        --merge-file ${merge_path} \
        --data-path ${data_path} \
        --data-impl mmap \
        --tokenizer-type GPT2BPETokenizer \
        --micro-batch-size ${batch_size} \
        --global-batch-size ${batch_size} \
        --seq-length ${seq_len} \
        --max-position-embeddings ${seq_len} \
        --num-layers 1 \
        --hidden-size 1 \
        --num-attention-heads 1 \
        --split 949,50,1 \
        --distributed-backend gloo \
        --train-data-exact-num-epochs ${num_epochs} \
        --return-data-index \
        --save-interval 1 \
        --save ${save_path}"
    if [[ ${task} == map ]]; then
      options="${options} --analyzing-worker-id ${worker_id}"
    else
      options="${options} --analyzing-num-threads-reduce ${num_threads_reduce}"
    fi
    ${DSPREP} ${options} &> "${WORK}/${jobname}.log" || fail "dsprep ${task} ${metric} exited $?" "${WORK}/${jobname}.log"
  done
done
for f in total_vocab_freq/total_vocab_freq_metric_value vocab_rarity/vocab_rarity_index_to_sample_percentile_merged \
         vocab_rarity/vocab_rarity_index_to_metric vocab_rarity/vocab_rarity_index_to_sample \
         vocab_rarity/vocab_rarity_sample_to_metric; do
  [[ -f "${save_path}/${f}.bin" && -f "${save_path}/${f}.idx" ]] || fail "the analysis wrote no ${f}"
done

# ---- ds_pretrain_gpt_1.3B_dense_base_script.sh, the CL+random-LTD block ----

seq_len=64
model_size=1.3
num_layers=24
hidden_size=64
num_attn_heads=4
global_batch_size=16
lr=2.0e-3
min_lr=1.0e-6
init_std=0.013
train_tokens_in_billion=40
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
cl_enabled=true
cl_num_metric=2
cl_1st_metric="voc"
cl_1st_index_to_sample_path="${save_path}/vocab_rarity/vocab_rarity_index_to_sample_percentile_merged"
cl_1st_index_to_metric_path="${save_path}/vocab_rarity/vocab_rarity_index_to_metric"
cl_1st_difficulty_type="percentile"
cl_1st_clustering_type="schedule_based"
cl_1st_min=1
cl_1st_max=100
cl_1st_total_step=20
cl_1st_difficulty_step=1
cl_1st_root=2
cl_2nd_metric="seqlen_truncate"
cl_2nd_index_to_sample_path="dummy"
cl_2nd_index_to_metric_path="dummy"
cl_2nd_difficulty_type="value"
cl_2nd_clustering_type="single_cluster"
cl_2nd_min=16
cl_2nd_max=64
cl_2nd_total_step=20
cl_2nd_difficulty_step=8
cl_2nd_root=1
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
doc_idx_path="${DATA}/corpus_train_indexmap_exact1ep_${seq_len}sl_1234s_doc_idx.npy"
sample_idx_path="${DATA}/corpus_train_indexmap_exact1ep_${seq_len}sl_1234s_sample_idx.npy"
shuffle_idx_path="${DATA}/corpus_train_indexmap_exact1ep_${seq_len}sl_1234s_shuffle_idx.npy"
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
if [ "${cl_enabled}" = "true" ]; then
    jobname="${jobname}_cl_${cl_1st_metric}_${cl_1st_min}_${cl_1st_max}_${cl_1st_total_step}_${cl_1st_root}"
    if [[ $cl_num_metric -gt 1 ]]; then
        jobname="${jobname}_${cl_2nd_metric}_${cl_2nd_min}_${cl_2nd_max}_${cl_2nd_total_step}_${cl_2nd_root}"
    fi
fi
output_home="${WORK}/output"
log_path="${output_home}/log/"
checkpoint_path="${output_home}/checkpoint/${jobname}"
tensorboard_path="${output_home}/tensorboard/${jobname}_${host}"
mkdir -p ${log_path}
mkdir -p ${checkpoint_path}
mkdir -p ${tensorboard_path}
if [ "${cl_enabled}" = "true" ]; then
    data_cluster_path="${output_home}/data_cluster/${jobname}"
    mkdir -p ${data_cluster_path}
fi

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

if [ "${cl_enabled}" = "true" ]; then
megatron_options="${megatron_options} \
    --train-doc-idx-path ${doc_idx_path} \
    --train-sample-idx-path ${sample_idx_path} \
    --train-shuffle-idx-path ${shuffle_idx_path} \
    --data-efficiency-curriculum-learning"
fi

config_json="${WORK}/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}_seed${seed}"
if [ "${ltd_enabled}" = "true" ]; then
    config_json="${config_json}_ltd_${ltd_start}_${ltd_step}"
fi
if [ "${cl_enabled}" = "true" ]; then
    config_json="${config_json}_cl_${cl_1st_metric}_${cl_1st_min}_${cl_1st_max}_${cl_1st_total_step}_${cl_1st_root}"
    if [[ $cl_num_metric -gt 1 ]]; then
        config_json="${config_json}_${cl_2nd_metric}_${cl_2nd_min}_${cl_2nd_max}_${cl_2nd_total_step}_${cl_2nd_root}"
    fi
fi
config_json="${config_json}.json"
template_json="${WORK}/ds_config_gpt_2clmetrics_TEMPLATE.json"
write_data_efficiency_config_template "${template_json}" 2
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
    | sed "s#CL_CLUSTER_PATH#${data_cluster_path}#" \
    | sed "s#CL_1st_METRIC_NAME#${cl_1st_metric}#" \
    | sed "s#CL_1st_SAMPLE_PATH#${cl_1st_index_to_sample_path}#" \
    | sed "s#CL_1st_METRIC_PATH#${cl_1st_index_to_metric_path}#" \
    | sed "s#CL_1st_DIFF_TYPE#${cl_1st_difficulty_type}#" \
    | sed "s#CL_1st_CLUSTER_TYPE#${cl_1st_clustering_type}#" \
    | sed "s/CL_1st_MIN/${cl_1st_min}/" \
    | sed "s/CL_1st_MAX/${cl_1st_max}/" \
    | sed "s/CL_1st_TOTAL_STEP/${cl_1st_total_step}/" \
    | sed "s/CL_1st_DIFF_STEP/${cl_1st_difficulty_step}/" \
    | sed "s/CL_1st_ROOT/${cl_1st_root}/" \
    | sed "s#CL_2nd_METRIC_NAME#${cl_2nd_metric}#" \
    | sed "s#CL_2nd_SAMPLE_PATH#${cl_2nd_index_to_sample_path}#" \
    | sed "s#CL_2nd_METRIC_PATH#${cl_2nd_index_to_metric_path}#" \
    | sed "s#CL_2nd_DIFF_TYPE#${cl_2nd_difficulty_type}#" \
    | sed "s#CL_2nd_CLUSTER_TYPE#${cl_2nd_clustering_type}#" \
    | sed "s/CL_2nd_MIN/${cl_2nd_min}/" \
    | sed "s/CL_2nd_MAX/${cl_2nd_max}/" \
    | sed "s/CL_2nd_TOTAL_STEP/${cl_2nd_total_step}/" \
    | sed "s/CL_2nd_DIFF_STEP/${cl_2nd_difficulty_step}/" \
    | sed "s/CL_2nd_ROOT/${cl_2nd_root}/" \
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
  fail "curriculum + random-LTD run exited $?" "${log}"

# Iterations until the consumed tokens reach train_tokens. DeepSpeed's
# curriculum scheduler for seqlen_truncate at curriculum step s (one per
# iteration, from 1): floor(s / total * (max - min) + min) in multiples of 8,
# at most max; random-LTD's reserved length at the engine's step s - 1:
# floor((s-1) / ltd_step * (seq - start) + start) in multiples of 16, at most
# seq; Megatron's tokens per sample: the curriculum length L, or
# (L (layers - n) + R n) // layers while R < L (n = 22 of 24 layers).
iters=$(awk -v T=${seq_len} -v layers=${num_layers} -v n=22 -v lo=${ltd_start} -v steps=${ltd_step} \
            -v cmin=${cl_2nd_min} -v cmax=${cl_2nd_max} -v ctot=${cl_2nd_total_step} -v cstep=${cl_2nd_difficulty_step} \
            -v gbs=${global_batch_size} -v goal=${train_tokens} 'BEGIN {
  tokens = 0; s = 0;
  while (tokens < goal) {
    s += 1;
    L = int(s / ctot * (cmax - cmin) + cmin); L -= L % cstep; if (L > cmax) L = cmax;
    r = int((s - 1) / steps * (T - lo) + lo); r -= r % 16; if (r > T) r = T;
    a = (r < L) ? int((L * (layers - n) + r * n) / layers) : L;
    tokens += gbs * a;
  }
  print s }')
(( iters > train_tokens / global_batch_size / seq_len )) || fail "the schedules should need more iterations than the baseline"
check_trained "${log}" 1 ${iters}
check_loss_falls "${log}"
grep -q "data-sampling curriculum: seqlen_truncate (value single_cluster, fixed_root from 16 to 64), voc (percentile schedule_based, fixed_root from 1 to 100)" "${log}" ||
  fail "no data-sampling start-up line" "${log}"
for L in 16 24 40 64; do
  grep -q "| curriculum seqlen: $(printf '%5d' $L) |" "${log}" || fail "no iteration with curriculum seqlen $L" "${log}"
done
# Rarity percentiles floor(sqrt(s / 20) * 99 + 1): 23 at step 1, 32 at step 2, 100 at step 20.
grep -q "step 1: new cluster 0 of .* samples (difficulties seqlen_truncate 16, voc 23)" "${log}" || fail "no first cluster at percentile 23" "${log}"
grep -q "step 2: new cluster 1 of .* samples (difficulties seqlen_truncate 16, voc 32)" "${log}" || fail "no second cluster at percentile 32" "${log}"
grep -q "(difficulties seqlen_truncate 64, voc 100)" "${log}" || fail "no cluster at percentile 100" "${log}"
grep -q "| random ltd reserved length:    16 |" "${log}" || fail "no iteration with reserved length 16" "${log}"
for f in "${doc_idx_path}" "${sample_idx_path}" "${shuffle_idx_path}"; do
  [[ -f "$f" ]] || fail "the run did not write the index map $f" "${log}"
done
[[ "$(cat "${checkpoint_path}/latest")" == "global_step${iters}" ]] || fail "latest is not global_step${iters}" "${log}"
# The resolved configuration saved with the checkpoint has both features on, fp16 and the curriculum as given.
/usr/bin/python3 - "${checkpoint_path}/global_step${iters}/state.json" <<'PY' || fail "the checkpoint's resolved config" "${log}"
import json, sys
c = json.load(open(sys.argv[1]))["config"]
de = c["data_efficiency"]
cl = de["data_sampling"]["curriculum_learning"]
assert cl["enabled"] and de["data_routing"]["random_ltd"]["enabled"], de
assert c["training"]["data_efficiency_curriculum_learning"] and c["training"]["random_ltd"], c["training"]
assert c["fp16"]["enabled"] and not c["bf16"]["enabled"]
voc, seq = cl["curriculum_metrics"]["voc"], cl["curriculum_metrics"]["seqlen_truncate"]
assert (voc["difficulty_type"], voc["clustering_type"], voc["max_difficulty"]) == ("percentile", "schedule_based", 100), voc
assert (seq["min_difficulty"], seq["max_difficulty"], seq["schedule_config"]["difficulty_step"]) == (16, 64, 8), seq
PY
echo "PASS: data_efficiency analysis + CL + random-LTD block: ${iters} iterations (the baseline's token count would stop at $(( train_tokens / global_batch_size / seq_len ))), curriculum seqlen 16 -> 64, rarity percentiles 23 -> 100, loss falls"
