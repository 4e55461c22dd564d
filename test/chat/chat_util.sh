# Shared by the DeepSpeed-Chat script tests (sourced after
# test/scripts/script_util.sh's setup_run): the stand-in model in a Hugging
# Face cache layout, and DeepSpeed-Chat's application folder with its data.

# hub_standin REPO MODEL_JSON DATA_JSON: dstrain's export (0 iterations: its
# initial weights) of the model MODEL_JSON describes (a config "model"
# section) on DATA_JSON's tokenizer, as REPO ("facebook/opt-1.3b") in
# $WORK/hub; HF_HUB_CACHE points there.
hub_standin() {
  local repo="$1" model="$2" data="$3"
  local dir="$WORK/hub/models--${repo//\//--}"
  SNAP="$dir/snapshots/0123abc"
  mkdir -p "$dir/refs" "$(dirname "$SNAP")"
  echo -n 0123abc > "$dir/refs/main"
  cat > "$WORK/standin.json" <<EOT
{"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "model": $model, "data": $data,
 "training": {"train_iters": 0, "export_hf": "$SNAP"}}
EOT
  "$DSTRAIN" --config "$WORK/standin.json" > "$WORK/standin.log" 2>&1 ||
    fail "exporting the stand-in failed" "$WORK/standin.log"
  export HF_HUB_CACHE="$WORK/hub"
}

# opt_standin REPO: a tiny OPT (2 layers, hidden 32, ReLU, the corpus's BPE vocabulary).
opt_standin() {
  hub_standin "$1" '{"family": "gpt2", "activation": "relu", "embedding_dropout": 0.0, "num_layers": 2,
    "hidden_size": 32, "num_heads": 4, "seq_length": 64, "max_position_embeddings": 512,
    "make_vocab_size_divisible_by": 1}' \
    "{\"data_path\": \"${DATA}/corpus\", \"vocab_file\": \"${TOK}/vocab.json\", \"merge_file\": \"${TOK}/merges.txt\"}"
  grep -q '"model_type": "opt"' "$SNAP/config.json" || fail "the stand-in is not an OPT" "$SNAP/config.json"
}

# chat_app STEP_FOLDER TRAIN EVAL: DeepSpeed-Chat's application folder with
# data/train.json and data/eval.json (TRAIN and EVAL examples with a prompt,
# a chosen and a rejected answer) two levels above training/STEP_FOLDER,
# which becomes the working directory, as the scripts run.
chat_app() {
  local step="$1" ntrain="$2" neval="$3"
  APP="$WORK/DeepSpeed-Chat"
  mkdir -p "$APP/data" "$APP/training/$step"
  for split in train eval; do
    local n=$([[ $split == train ]] && echo "$ntrain" || echo "$neval")
    for ((i = 0; i < n; i++)); do
      echo "{\"prompt\": \"Human: tell me story $i of the old town. Assistant:\", \"chosen\": \"It was a quiet evening in the town, number $i.\", \"rejected\": \"No.\"}"
    done > "$APP/data/$split.json"
  done
  cd "$APP/training/$step"
}
