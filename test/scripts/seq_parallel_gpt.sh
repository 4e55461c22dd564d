#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/sequence_parallel/
# ds_pretrain_gpt_1.3B_seq_parallel_32k.sh run through dsrun + dstrain: its
# DeepSpeed config template (ZeRO-1, fp16) and option strings as the script
# has them, DeepSpeed-Ulysses with sp_size 2 on 4 ranks (so 2 data-parallel
# replicas, gradients over the 4 sequence-data-parallel ranks); only the
# launcher line, the model size (2 layers, hidden 64, 4 heads, seq 128), the
# token budget and the paths differ.
#   seq_parallel_gpt.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" seq_parallel_gpt
cd "$WORK"

seq_len=128
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=4
lr=6.0e-3
min_lr=1.0e-6
init_std=0.013
train_tokens=$((30 * global_batch_size * seq_len))
train_samples=$((train_tokens / seq_len))
exit_duration=30000000
lr_warmup_tokens=$((2 * global_batch_size * seq_len))
lr_decay_tokens=${train_tokens}
lr_decay_style="cosine"
sp_size=2
zero_stage=1
num_gpus=4
batch_size=1
log_interval=1
eval_iters=2
eval_interval=100
save_interval=100
seed=1234
num_workers=0
prescale_grad="false"
checkpoint_path="output/checkpoint/seq_parallel"
tensorboard_path="output/tensorboard/seq_parallel"
mkdir -p output/log ${checkpoint_path} ${tensorboard_path}

data_options=" \
    --vocab-file ${TOK}/vocab.json \
    --merge-file ${TOK}/merges.txt \
    --data-path ${DATA}/corpus \
    --data-impl mmap"

megatron_options=" \
    --override-opt_param-scheduler \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --tensor-model-parallel-size 1 \
    --ds-sequence-parallel-size ${sp_size} \
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
    --use-flash-attn-triton \
    --tensorboard-queue-size 1 \
    --log-timers-to-tensorboard \
    --log-batch-size-to-tensorboard \
    --log-validation-ppl-to-tensorboard \
    --tensorboard-dir ${tensorboard_path} \
    --checkpoint-activations \
    --log-optimizer-states-to-tensorboard"

cat <<EOT > ds_config.json
{
  "train_batch_size": ${global_batch_size},
  "train_micro_batch_size_per_gpu": ${batch_size},
  "steps_per_print": ${log_interval},

  "zero_optimization": {
    "stage": ${zero_stage}
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": ${prescale_grad},

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "wall_clock_breakdown" : false
}
EOT

deepspeed_options=" \
    --deepspeed \
    --deepspeed_config ds_config.json \
    --zero-stage ${zero_stage} \
    --pipeline-model-parallel-size 1 \
    --no-pipeline-parallel \
    --deepspeed-activation-checkpointing"

log=output/log/train.log
${DSRUN} --num_gpus ${num_gpus} ${DSTRAIN} ${megatron_options} ${data_options} ${deepspeed_options} \
    > ${log} 2>&1 || fail "dstrain exited $?" ${log}

check_trained $log 1 30
check_loss_falls $log
grep -q "batch: global 4 = micro 1 x grad accum 2 x data parallel 2" $log || fail "batch split" $log
grep -q "DeepSpeed-Ulysses sequence parallel: 2 ranks, this rank holds positions \[0, 64) of every sample and attends over all 128 with 2 of the 4 heads; gradients reduced over 4 sequence-data-parallel ranks" $log ||
  fail "no Ulysses layout line" $log
[[ -f ${checkpoint_path}/latest ]] || fail "no checkpoint written" $log
echo "PASS"
