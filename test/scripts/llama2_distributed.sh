#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/pretrain_llama2_distributed.sh run
# through dsrun + dstrain. Its variables, DeepSpeed config and flags are kept as
# the script has them; only the launcher line (torchrun pretrain_gpt.py -> dsrun
# dstrain), the model size (2 layers, hidden 64, 8 heads with 2 key-value
# heads, seq 64), the duration and the paths differ. The tokenizer.model is a
# real SentencePiece BPE model, trained here by SentencePiece's spm_train on a
# generated corpus, and the dataset is tokenized with it by dsprep.
#   llama2_distributed.sh BUILD_DIR
# Checks: 8 ranks (TP2 x PP2 x DP2, bf16, GQA) train with falling loss; the
# trained model exports to Hugging Face as LLaMA with its key-value heads and
# the tokenizer's bos/eos ids.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
command -v spm_train >/dev/null || { echo "SKIP: spm_train not found (Debian package sentencepiece)"; exit 77; }
setup_run "$1" llama2_distributed
cd "$WORK"
mkdir -p tmp/data
spm_train --input="${WORK}/corpus.txt" --model_prefix=tmp/tokenizer --vocab_size=512 --model_type=bpe \
  --byte_fallback=true --character_coverage=1.0 --minloglevel=2 > spm.log 2>&1 || fail "spm_train failed" spm.log
"$DSPREP" --input "${WORK}/corpus.txt" --output-prefix tmp/data/bookcorpus_train_1m_text_sentence \
  --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tmp/tokenizer.model --append-eod > prep.log 2>&1 ||
  fail "dsprep with the SentencePiece model failed" prep.log

BASE_PATH=./tmp
DS_CONFIG=${BASE_PATH}/deepspeed.json
DATASET_1="./tmp/data/bookcorpus_train_1m_text_sentence"
DATASET="1 ${DATASET_1}"
CHECKPOINT_PATH=./tmp
TOKENIZER_PATH=./tmp/tokenizer.model # offical llama tokenizer.model

TP=2
PP=2
ZERO_STAGE=0

GPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=1
NODE_RANK=0

HIDDEN_SIZE=64
FFN_HIDDEN_SIZE=176
NUM_LAYERS=2
NUM_HEADS=8
SEQ_LENGTH=64
NUM_KV_HEADS=2

MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=16
TRAIN_STEPS=20
LR=3e-3
MIN_LR=3e-4
LR_WARMUP_STEPS=2
WEIGHT_DECAY=0.1
GRAD_CLIP=1

activation_checkpoint="false"

LOG_TO_WANDB=0
WANDB_ARGS=
if [ $LOG_TO_WANDB -eq 1 ]
then
WANDB_ARGS="\
       --wandb-project pretrain-llama2 \
       --wandb-exp-name exp0 \
       --wandb-save-dir ${BASE_PATH}/wandb \
       "
fi

cat <<EOT > $DS_CONFIG
{
  "train_batch_size" : $GLOBAL_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "bf16": {
    "enabled": true
  }
}
EOT

ds_args=""
ds_args=" --deepspeed ${ds_args}"
ds_args=" --deepspeed_config=$DS_CONFIG ${ds_args}"
ds_args=" --zero-stage=$ZERO_STAGE ${ds_args}"

if [ "${activation_checkpoint}" = "true" ]; then
  ds_args="--deepspeed-activation-checkpointing ${ds_args}"
  ds_args="--recompute-granularity full --recompute-method uniform ${ds_args}"
fi

${DSRUN} --num_gpus $GPUS_PER_NODE --master_addr $MASTER_ADDR --master_port $MASTER_PORT \
       ${DSTRAIN} \
       --tensor-model-parallel-size $TP \
       --pipeline-model-parallel-size $PP \
       --num-layers $NUM_LAYERS \
       --hidden-size $HIDDEN_SIZE \
       --ffn-hidden-size $FFN_HIDDEN_SIZE \
       --num-attention-heads $NUM_HEADS \
       --micro-batch-size $MICRO_BATCH_SIZE \
       --global-batch-size $GLOBAL_BATCH_SIZE \
       --seq-length $SEQ_LENGTH \
       --max-position-embeddings $SEQ_LENGTH \
       --train-iters $TRAIN_STEPS \
       --save $CHECKPOINT_PATH \
       --load $CHECKPOINT_PATH \
       --data-path $DATASET \
       --data-impl mmap \
       --tokenizer-type GPTSentencePieceTokenizer \
       --tokenizer-model $TOKENIZER_PATH \
       --split 949,50,1 \
       --distributed-backend nccl \
       --lr $LR \
       --lr-decay-style cosine \
       --min-lr $MIN_LR \
       --weight-decay $WEIGHT_DECAY \
       --clip-grad $GRAD_CLIP \
       --lr-warmup-iters $LR_WARMUP_STEPS \
       --optimizer adam \
       --adam-beta1 0.9 \
       --adam-beta2 0.95 \
       --log-interval 1 \
       --save-interval 10 \
       --eval-interval 10 \
       --eval-iters 2 \
       --bf16 \
       --no-query-key-layer-scaling \
       --attention-dropout 0 \
       --hidden-dropout 0 \
       --use-rotary-position-embeddings \
       --untie-embeddings-and-output-weights \
       --swiglu \
       --normalization rmsnorm \
       --disable-bias-linear \
       --num-key-value-heads $NUM_KV_HEADS \
       $WANDB_ARGS \
       $ds_args > train.log 2>&1 || fail "dstrain exited $?" train.log

check_trained train.log 1 $TRAIN_STEPS
check_loss_falls train.log
grep -q "heads 8" train.log || fail "the model does not have 8 heads" train.log
[[ "$(cat tmp/latest)" == "global_step${TRAIN_STEPS}" ]] || fail "latest is not global_step${TRAIN_STEPS}" train.log

# What the flags built is a LLaMA model: it exports as one, with its kv heads and the tokenizer's ids.
"$DSTRAIN" --load tmp --export-hf hf --train-iters 0 --num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE \
  --ffn-hidden-size $FFN_HIDDEN_SIZE --num-attention-heads $NUM_HEADS --seq-length $SEQ_LENGTH \
  --max-position-embeddings $SEQ_LENGTH --micro-batch-size 1 --global-batch-size 1 --data-path $DATASET \
  --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model $TOKENIZER_PATH --bf16 \
  --use-rotary-position-embeddings --untie-embeddings-and-output-weights --swiglu --normalization rmsnorm \
  --disable-bias-linear --num-key-value-heads $NUM_KV_HEADS --use-checkpoint-opt_param-scheduler > export.log 2>&1 ||
  fail "the export of the trained LLaMA-2 model failed" export.log
/usr/bin/python3 - hf/config.json <<'PY' || fail "hf/config.json does not describe the model" export.log
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "bos_token_id": 1, "eos_token_id": 2}
bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
if bad:
    print("config.json differs (got, want):", bad)
    sys.exit(1)
PY
echo "PASS: LLaMA-2 script flags: TP2 x PP2 x DP2 bf16 GQA with a SentencePiece tokenizer, loss falls, exports as LLaMA"
