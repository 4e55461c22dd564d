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

# opt350m_standin REPO: the same with OPT-350m's blocks: post-LayerNorm
# (do_layer_norm_before false, no final norm) and a 16-wide token embedding
# between project_in and project_out (word_embed_proj_dim).
opt350m_standin() {
  hub_standin "$1" '{"family": "gpt2", "activation": "relu", "embedding_dropout": 0.0, "num_layers": 2,
    "hidden_size": 32, "num_heads": 4, "seq_length": 64, "max_position_embeddings": 512,
    "make_vocab_size_divisible_by": 1, "post_norm": true, "embed_proj_dim": 16}' \
    "{\"data_path\": \"${DATA}/corpus\", \"vocab_file\": \"${TOK}/vocab.json\", \"merge_file\": \"${TOK}/merges.txt\"}"
  grep -q '"do_layer_norm_before": false' "$SNAP/config.json" && grep -q '"word_embed_proj_dim": 16' "$SNAP/config.json" ||
    fail "the stand-in is not shaped as OPT-350m" "$SNAP/config.json"
}

# llama_standin REPO: a tiny LLaMA (2 layers, hidden 32) with a SentencePiece
# BPE tokenizer.model of the corpus (spm_train, byte fallback, as LLaMA's is
# trained), the corpus tokenized with it. Needs spm_train.
llama_standin() {
  spm_train --input="$WORK/corpus.txt" --model_prefix="$WORK/sp" --vocab_size=500 --model_type=bpe --byte_fallback=true \
    --split_digits=true --remove_extra_whitespaces=false --normalization_rule_name=identity --character_coverage=1.0 \
    --input_sentence_size=20000 --shuffle_input_sentence=true --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
    --minloglevel=2 > "$WORK/spm.log" 2>&1 || fail "spm_train failed" "$WORK/spm.log"
  "$DSPREP" --input "$WORK/corpus.txt" --output-prefix "$WORK/sp_corpus" --tokenizer-type Llama2Tokenizer \
    --tokenizer-model "$WORK/sp.model" > "$WORK/prep.log" 2>&1 || fail "tokenizing the corpus failed" "$WORK/prep.log"
  hub_standin "$1" '{"family": "llama", "num_layers": 2, "hidden_size": 32, "num_heads": 4,
    "ffn_hidden_size": 64, "seq_length": 64, "max_position_embeddings": 512, "make_vocab_size_divisible_by": 1}' \
    "{\"data_path\": \"$WORK/sp_corpus\", \"tokenizer_type\": \"Llama2Tokenizer\", \"tokenizer_model\": \"$WORK/sp.model\"}"
  [[ -f $SNAP/tokenizer.model ]] || fail "the stand-in has no tokenizer.model" "$WORK/standin.log"
  grep -q '"model_type": "llama"' "$SNAP/config.json" || fail "the stand-in is not a LLaMA" "$SNAP/config.json"
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
