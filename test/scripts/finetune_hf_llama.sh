#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/finetune_hf_llama/finetune_llama.sh
# run through dsrun + dstrain in its three modes (convert_hf2mds, the
# fine-tuning, convert_mds2hf). Its variables and option strings are kept as
# the script has them; only the launcher lines (deepspeed
# tools/hf2megads_weight_converter.py and deepspeed finetune_llama.py ->
# dsrun dstrain), the model size (4 layers, hidden 64, ffn 176, 4 heads,
# sequence 256), the batch (micro 2, global 8), the duration (10 iterations,
# warm-up 2) and the paths differ: the Hugging Face LLaMA is a stand-in that
# dstrain trains and exports here (with its byte-level BPE tokenizer as
# GPT2Tokenizer files), and alpaca_data.json holds 40 records in Stanford
# Alpaca's format. TP 2 x PP 2 as the script has them: 4 CPU ranks.
#   finetune_hf_llama.sh BUILD_DIR
# Checks: the conversion writes iteration 0, the fine-tuning loads it
# (--finetune) and trains on the instruction data with prompts masked and
# falling loss, and the conversion back gives the stand-in's weights bit for bit.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" finetune_hf_llama
cd "$WORK"
mkdir -p examples_deepspeed/finetune_hf_llama

# The stand-in Hugging Face LLaMA (what /data/llama-2-7b-hf/ is to the script).
HF_STANDIN="${WORK}/llama-standin-hf"
"$DSTRAIN" --num-layers 4 --hidden-size 64 --ffn-hidden-size 176 --num-attention-heads 4 --seq-length 256 \
  --max-position-embeddings 256 --swiglu --normalization rmsnorm --use-rotary-position-embeddings \
  --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 4 --global-batch-size 8 \
  --train-iters 20 --lr 3e-3 --log-interval 10 --eval-interval 1000 --eval-iters 1 --data-path "${DATA}/corpus" \
  --vocab-file "${TOK}/vocab.json" --merge-file "${TOK}/merges.txt" --export-hf "$HF_STANDIN" > standin.log 2>&1 ||
  fail "training the stand-in model failed" standin.log
cp "${TOK}/vocab.json" "${TOK}/merges.txt" "$HF_STANDIN/"
echo '{"tokenizer_class": "GPT2Tokenizer"}' > "$HF_STANDIN/tokenizer_config.json"
cp "$HF_STANDIN/model.safetensors" standin.safetensors
# 40 Alpaca records, a third with an input.
{
  echo "["
  for i in $(seq 0 39); do
    input=""
    (( i % 3 == 0 )) && input="the river $i runs under the old bridge"
    sep=","; (( i == 39 )) && sep=""
    printf '  {"instruction": "Describe the %s house number %d.", "input": "%s", "output": "It is a small %s house with %d windows."}%s\n' \
      "$( (( i % 2 )) && echo red || echo blue )" "$i" "$input" "$( (( i % 2 )) && echo red || echo blue )" "$(( i % 7 + 1 ))" "$sep"
  done
  echo "]"
} > examples_deepspeed/finetune_hf_llama/alpaca_data.json
cat > examples_deepspeed/finetune_hf_llama/ds_config_empty.json <<'JSON'
{
  "train_batch_size" : 256,
  "train_micro_batch_size_per_gpu": 16,
  "steps_per_print": 100
}
JSON

run_script() {  # finetune_llama.sh with its variables shrunk; $1 as the script's ("" to fine-tune)
DS_CONFIG=./examples_deepspeed/finetune_hf_llama/ds_config.json
DATASET_PATH=./examples_deepspeed/finetune_hf_llama/alpaca_data.json
HF_LLAMA_PATH=${HF_STANDIN}
MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=8
TP=2
PP=2
HIDDEN_SIZE=64
FFN_HIDDEN_SIZE=176
NUM_LAYERS=4
NUM_HEADS=4
SEQ_LENGTH=256
MEGA_DS_LLAMA_PATH=./"llama-7b-mega-ds-T${TP}P${PP}"
cat <<EOT > $DS_CONFIG
{
  "train_batch_size" : $GLOBAL_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "steps_per_print": 100,
  "zero_optimization": {
    "stage": 0
  },
  "bf16": {
    "enabled": true
  }
}
EOT

if [ "$1" = "convert_hf2mds" ]; then
    DS_CONFIG_PATH="./examples_deepspeed/finetune_hf_llama/ds_config_empty.json"
elif [ "$1" = "convert_mds2hf" ]; then
    DS_CONFIG_PATH="./examples_deepspeed/finetune_hf_llama/ds_config_empty.json"
else
    DS_CONFIG_PATH="./examples_deepspeed/finetune_hf_llama/ds_config.json"
fi

covert_hf2mds_args="${DSRUN} --num_gpus 4 ${DSTRAIN} \
--hf-ckpt-num-shards 2 \
--hf-ckpt-dir $HF_LLAMA_PATH \
--load-mode auto \
--save $MEGA_DS_LLAMA_PATH"

covert_mds2hf_args="${DSRUN} --num_gpus 4 ${DSTRAIN} \
--hf-ckpt-num-shards 2 \
--hf-ckpt-dir $HF_LLAMA_PATH \
--load-mode auto \
--to-hf-ckpt \
--load $MEGA_DS_LLAMA_PATH \
--save $HF_LLAMA_PATH'-hf-out' "

finetune_args="${DSRUN} --num_gpus 4 ${DSTRAIN} \
--load $MEGA_DS_LLAMA_PATH"

comm_args="--tensor-model-parallel-size $TP \
--pipeline-model-parallel-size $PP \
--lr-warmup-iters 2 \
--weight-decay 0.1 \
--clip-grad 1 \
--num-layers $NUM_LAYERS \
--hidden-size $HIDDEN_SIZE \
--num-attention-heads $NUM_HEADS \
--finetune \
--ffn-hidden-size $FFN_HIDDEN_SIZE \
--attention-dropout 0 \
--hidden-dropout 0 \
--no-query-key-layer-scaling \
--disable-bias-linear \
--normalization rmsnorm \
--use-rotary-position-embeddings \
--untie-embeddings-and-output-weights \
--swiglu \
--seq-length $SEQ_LENGTH \
--max-position-embeddings $SEQ_LENGTH \
--micro-batch-size $MICRO_BATCH_SIZE \
--global-batch-size $GLOBAL_BATCH_SIZE \
--train-iters 10 \
--lr 2e-3 \
--tensorboard-dir tensorboard_output \
--lr-decay-iters 320 \
--lr-decay-style cosine \
--log-interval 1 \
--eval-iters 100 \
--eval-interval 100 \
--data-path $DATASET_PATH \
--save-interval 1500 \
--split 100,0,0 \
--bf16 \
--zero-stage 0 \
--tokenizer-type HFTokenizer \
--tokenizer-model $HF_LLAMA_PATH \
--deepspeed_config $DS_CONFIG_PATH \
--deepspeed \
--distributed-backend nccl \
--num-workers 0 \
--no-masked-softmax-fusion \
--no-bias-gelu-fusion \
--no-bias-dropout-fusion \
--no-gradient-accumulation-fusion \
--repeated-dataloader"

if [ "$1" = "convert_hf2mds" ]; then
    task_args="$covert_hf2mds_args"
elif [ "$1" = "convert_mds2hf" ]; then
    task_args="$covert_mds2hf_args"
else
    task_args="$finetune_args"
fi

full_cmd="$task_args $comm_args"

eval "$full_cmd"
}

run_script convert_hf2mds > convert.log 2>&1 || fail "convert_hf2mds exited $?" convert.log
grep -q "converted ${HF_STANDIN} into ./llama-7b-mega-ds-T2P2 (iteration 0)" convert.log || fail "no conversion line" convert.log
[[ "$(cat llama-7b-mega-ds-T2P2/latest)" == "global_step0" ]] || fail "the conversion did not write global_step0" convert.log

run_script "" > finetune.log 2>&1 || fail "the fine-tuning exited $?" finetune.log
grep -q "loaded the weights from ./llama-7b-mega-ds-T2P2 (saved at iteration 0)" finetune.log || fail "no --finetune load" finetune.log
grep -q "instruction dataset ./examples_deepspeed/finetune_hf_llama/alpaca_data.json: 40 Alpaca records" finetune.log ||
  fail "no instruction dataset line" finetune.log
check_trained finetune.log 1 10
check_loss_falls finetune.log

run_script convert_mds2hf > back.log 2>&1 || fail "convert_mds2hf exited $?" back.log
cmp -s standin.safetensors "${HF_STANDIN}-hf-out/model.safetensors" ||
  fail "Hugging Face -> Megatron-DeepSpeed -> Hugging Face changed the weights" back.log
echo "PASS: finetune_llama.sh: convert_hf2mds (TP2 x PP2, iteration 0), fine-tuning on Alpaca records with loss falling, convert_mds2hf bit for bit"
