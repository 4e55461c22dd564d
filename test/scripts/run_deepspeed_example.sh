#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/run_deepspeed_example.sh run through
# dsrun + dstrain: its DeepSpeed config (ZeRO-2, fp16, wall_clock_breakdown) and
# flags as the script has them; only the launcher line, the model size (2
# layers, hidden 64, seq 64, global batch 32), the duration and the paths differ.
# The script's config says train_batch_size 64 while its flags say a different
# --global-batch-size: Megatron-DeepSpeed trains with the flag's batch (it
# resets DeepSpeed's batch size every step), and so must dstrain.
#   run_deepspeed_example.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" run_deepspeed_example
cd "$WORK"

BASE_PATH=${WORK}
DATA_PATH=${DATA}/corpus
DS_CONFIG=ds_config.json

TP=1
PP=1
NLAYERS=2
HIDDEN=64

GLOBAL_BATCH=64
MICRO_BATCH=4

ZERO_STAGE=2

OUTPUT_DIR=ds_z${ZERO_STAGE}_nl${NLAYERS}_hs${HIDDEN}_gb${GLOBAL_BATCH}_mb${MICRO_BATCH}
mkdir -p $OUTPUT_DIR

cat <<EOT > $DS_CONFIG
{
  "train_batch_size" : $GLOBAL_BATCH,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH,
  "steps_per_print": 1,

  "zero_optimization": {
    "stage": $ZERO_STAGE
  },

  "fp16": {
    "enabled": true,
    "initial_scale_power": 12
  },

  "wall_clock_breakdown" : true
}
EOT

export NCCL_DEBUG=warn

ds_args=""
ds_args=" --deepspeed ${ds_args}"
ds_args=" --no-pipeline-parallel ${ds_args}"
ds_args=" --deepspeed_config=$DS_CONFIG ${ds_args}"
ds_args=" --zero-stage=$ZERO_STAGE ${ds_args}"
ds_args=" --deepspeed-activation-checkpointing ${ds_args}"

${DSRUN} --num_gpus 2 ${DSTRAIN} \
    --tensor-model-parallel-size $TP \
    --pipeline-model-parallel-size $PP \
    --num-layers $NLAYERS \
    --hidden-size $HIDDEN \
    --num-attention-heads 16 \
    --seq-length 64 \
    --loss-scale 12 \
    --max-position-embeddings 1024 \
    --micro-batch-size 4 \
    --global-batch-size 32 \
    --train-iters 16 \
    --lr 6.0e-3 \
    --min-lr 6.0e-4 \
    --lr-decay-style cosine \
    --log-interval 1 \
    --eval-iters 4 \
    --eval-interval 1000 \
    --data-path $DATA_PATH \
    --vocab-file ${TOK}/vocab.json \
    --merge-file ${TOK}/merges.txt \
    --save-interval 1000 \
    --split 98,2,0 \
    --clip-grad 1.0 \
    --weight-decay 0.1 \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --init-method-std 0.006 \
    --fp16 \
    --checkpoint-activations \
    --tensorboard-dir $OUTPUT_DIR \
    $ds_args \
    --exit-interval 5000 > ${OUTPUT_DIR}/output.log 2>&1 || fail "dstrain exited $?" ${OUTPUT_DIR}/output.log

log=${OUTPUT_DIR}/output.log
check_trained $log 1 16
check_loss_falls $log
grep -q "global batch size:    32" $log || fail "the flag's --global-batch-size 32 is not the batch trained" $log
grep -q "batch: global 32 = micro 4 x grad accum 4 x data parallel 2" $log || fail "batch split" $log
# --loss-scale 12 and --clip-grad 1.0 do not reach the DeepSpeed engine: its fp16 section (dynamic from
# 2^12) and its default (no clipping) hold, each with a warning naming both values.
grep -q "loss scale: 4096.0" $log || fail "initial_scale_power 12 not in effect" $log
grep -q "warning: --loss-scale 12.0 differs from the DeepSpeed config's fp16/loss_scale 0.0" $log ||
  fail "no warning naming --loss-scale and the config's value" $log
# Through dsrun a rank's warning carries the agent's "[rank N] " once.
grep -q "^\[rank 0\] warning: --loss-scale 12.0" $log || fail "warning lines: not one [rank 0] prefix" $log
grep -q "warning: --clip-grad 1.0 differs from the DeepSpeed config's gradient_clipping 0.0" $log ||
  fail "no warning naming --clip-grad and the config's value" $log
grep -q "warning: --global-batch-size 32 differs from the DeepSpeed config's train_batch_size 64" $log ||
  fail "no warning naming --global-batch-size and train_batch_size" $log
[[ $(grep -c " time (ms) | forward-backward: " $log) -eq 16 ]] || fail "wall_clock_breakdown: not one time line per log line" $log
ls ${OUTPUT_DIR}/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard event file in ${OUTPUT_DIR}" $log
echo "PASS: run_deepspeed_example flags: 16 iterations of global batch 32, loss falls, wall-clock breakdown logged"
