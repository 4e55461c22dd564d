#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/universal_checkpointing/megatron_gpt/
# run_bf16.sh followed by run_universal_bf16.sh, through dsrun + dstrain: the
# first trains TP2 x PP2 x DP2 and saves at its exit interval; the second, on
# TP2 x PP2 x DP1 with --universal-checkpoint, loads that checkpoint and goes on.
# Their option strings are kept; only the launcher line, the model size (2
# layers, hidden 64, 4 heads, seq 64), the duration and the paths differ.
# The second script's global batch (4, against 16) changes the LR decay length
# (train_iters x global batch), which Megatron's OptimizerParamScheduler
# refuses on load unless a side is picked: dstrain refuses the same way (checked),
# and the run is then repeated with --use-checkpoint-opt_param-scheduler.
#   universal_checkpoint_gpt.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" universal_checkpoint_gpt
cd "$WORK"

run_script() {  # run_script DP GLOBAL_BATCH LOAD_DP RUN_TAG UNIVERSAL LOG [EXTRA FLAGS]
  local DP=$1 GLOBAL_BATCH=$2 LOAD_DP=$3 RUN_TAG=$4 universal=$5 log=$6
  shift 6
  DATASET=${DATA}/corpus
  VOCAB_PATH=${TOK}/vocab.json
  MERGE_PATH=${TOK}/merges.txt
  CONFIG_JSON="${WORK}/ds_config.json"
  ZERO_STAGE=1
  DTYPE="bf16"
  LAYERS=2
  HIDDEN=64
  SEQ=64
  EXIT_INTERVAL=12
  SIZE_TAG="toy"
  TP=2
  PP=2
  SP=1
  WORLD_SIZE=$((TP*PP*DP*SP))
  MICRO_BATCH=$((GLOBAL_BATCH/WORLD_SIZE))
  TRAIN_ITERS=100000
  LR=6.0e-3
  MIN_LR=6.0e-4
  LOAD_TP=$TP
  LOAD_PP=$PP
  LOAD_SP=$SP
  EXP_DIR="z${ZERO_STAGE}_uni_ckpt"
  CHECKPOINT_PATH=${EXP_DIR}/checkpoints/gpt2/z${ZERO_STAGE}/$DTYPE/tp${TP}_pp${PP}_dp${DP}_sp${SP}_${SIZE_TAG}
  LOAD_CHECKPOINT_PATH=${EXP_DIR}/checkpoints/gpt2/z${ZERO_STAGE}/$DTYPE/tp${LOAD_TP}_pp${LOAD_PP}_dp${LOAD_DP}_sp${LOAD_SP}_${SIZE_TAG}
  LOG_DIR="${EXP_DIR}/tensorboard/$DTYPE/tp${TP}_pp${PP}_dp${DP}_sp${SP}_hd${HIDDEN}_nl${LAYERS}_gbsz${GLOBAL_BATCH}_mbsz${MICRO_BATCH}_z${ZERO_STAGE}_LR_${LR}_${MIN_LR}_${DTYPE}_${SIZE_TAG}_${RUN_TAG}"
  mkdir -p $LOG_DIR

  options=" \
	--tensor-model-parallel-size $TP \
	--pipeline-model-parallel-size $PP \
	--ds-sequence-parallel-size $SP \
        --num-layers $LAYERS \
        --hidden-size $HIDDEN \
        --num-attention-heads 4 \
        --seq-length $SEQ \
        --loss-scale 12 \
        --max-position-embeddings $SEQ \
	--micro-batch-size $MICRO_BATCH \
	--global-batch-size $GLOBAL_BATCH \
	--train-iters $TRAIN_ITERS \
        --lr $LR \
	--min-lr $MIN_LR \
        --lr-decay-style cosine \
        --log-interval 1 \
        --eval-iters 4 \
        --eval-interval 10 \
	--data-path ${DATASET} \
	--vocab-file ${VOCAB_PATH} \
	--merge-file ${MERGE_PATH} \
	--save-interval 100 \
        --split 98,2,0 \
        --clip-grad 1.0 \
	--weight-decay 0.1 \
	--adam-beta1 0.9 \
	--adam-beta2 0.95 \
	--init-method-std 0.006 \
        --${DTYPE} \
	--checkpoint-activations \
	--exit-interval ${EXIT_INTERVAL} \
        --save ${CHECKPOINT_PATH} \
        --load ${LOAD_CHECKPOINT_PATH} \
        --make-vocab-size-divisible-by 256 \
	--tensorboard-dir $LOG_DIR
        "
  if [[ $universal == 1 ]]; then
    options="${options} --universal-checkpoint"
  fi
  options="${options} \
        --deepspeed \
        --deepspeed_config=${CONFIG_JSON} \
        --zero-stage=${ZERO_STAGE} \
        --deepspeed-activation-checkpointing \
"
  if [[ ${ZERO_STAGE} -gt 1 ]]; then
  options="${options} \
    --no-pipeline-parallel"
  fi

  cat <<EOT > $CONFIG_JSON
{
  "train_batch_size" : $GLOBAL_BATCH,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH,
  "steps_per_print": 1,

  "zero_optimization": {
    "stage": $ZERO_STAGE
  },

  "bf16": {
    "enabled": true
  },

  "data_types": {
        "grad_accum_dtype": "fp32"
  },

  "wall_clock_breakdown" : false
}
EOT

  WORKER_STR="--num_nodes 1 --num_gpus $WORLD_SIZE"
  ${DSRUN} --master_port 29700 $WORKER_STR ${DSTRAIN} "$@" ${options} > "$log" 2>&1
}

run_script 2 16 2 save 0 save.log || fail "dstrain exited $?" save.log
check_trained save.log 1 12
check_loss_falls save.log
if run_script 1 4 2 uni_load2_2_2_1 1 refused.log; then fail "a differing LR schedule was loaded silently" refused.log; fi
grep -q "the learning-rate schedule differs from the checkpoint's: decay samples 400000 (flags) vs 1600000 (checkpoint)" \
  refused.log || fail "the refusal does not name both decay lengths" refused.log
run_script 1 4 2 uni_load2_2_2_1 1 universal.log --use-checkpoint-opt_param-scheduler || fail "dstrain exited $?" universal.log
grep -q "loaded checkpoint" universal.log || grep -q "resum" universal.log || fail "the DP1 run did not load" universal.log
check_trained universal.log 13 24
# The DP1 run continues the DP2 run: its median loss is near the last ones, far below the
# initial loss (a single batch may spike: the median is robust to that).
first=$(grep -oE 'lm loss: [0-9.E+-]+' save.log | head -1 | awk '{print $3}')
last=$(grep -oE 'lm loss: [0-9.E+-]+' save.log | tail -1 | awk '{print $3}')
resumed=$(grep -oE 'lm loss: [0-9.E+-]+' universal.log | awk '{print $3}' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
awk -v f="$first" -v l="$last" -v r="$resumed" 'BEGIN { exit !(r < l + 0.3 * (f - l)) }' ||
  fail "resumed median loss $resumed is not a continuation (first $first, last $last)" universal.log
echo "PASS: universal checkpointing scripts: DP2 run to 12, DP1 run loads it (loss $last -> median $resumed) and trains to 24"
