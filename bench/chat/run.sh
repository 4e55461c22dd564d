#!/usr/bin/env bash
# Side-by-side CPU speed of DeepSpeed-Chat's step 1: `dschat sft` against
# transformers + PyTorch 2.x running the same loop (bench/chat/sft_torch.py)
# on the same model, data, batch, sequence length and thread count, fp32
# and bf16 (dschat --dtype bf16; PyTorch bf16 autocast), interleaved. The
# model is an OPT-125m-shaped OPTForCausalLM (12 layers, hidden 768, ffn 3072,
# random weights) with GPT-2's vocabulary plus OPT's two tokens; the data
# are synthetic prompt/answer pairs of about T tokens. Needs a build in
# ${BUILD_DIR:-build}, PyTorch 2.x with transformers (`scripts/setup.sh
# --bench`, or TORCH_PYTHON) and ../shared/data/gpt2-vocab.json (SHARED_DATA).
#   bench/chat/run.sh [--small]     (--small: a 2-layer model, a quick check of the script)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${BUILD_DIR:-build}/apps/dschat/dschat
PY=${TORCH_PYTHON:-.deps/torch-bench/bin/python}
SHARED=${SHARED_DATA:-../shared/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[[ -x $BIN ]] || { echo "run.sh: $BIN not found (build first, or set BUILD_DIR)" >&2; exit 1; }
"$PY" -c 'import torch, transformers, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null ||
  { echo "run.sh: $PY has no PyTorch 2.x with transformers (scripts/setup.sh --bench, or TORCH_PYTHON)" >&2; exit 1; }
[[ -f $SHARED/gpt2-vocab.json ]] || { echo "run.sh: $SHARED/gpt2-vocab.json not found (SHARED_DATA)" >&2; exit 1; }
LAYERS=12; HIDDEN=768; FFN=3072; HEADS=12; B=4; T=256; STEPS=8
[[ ${1:-} == --small ]] && { LAYERS=2; HIDDEN=128; FFN=512; HEADS=4; STEPS=4; }

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/app/data"
"$PY" - "$W" "$SHARED" $LAYERS $HIDDEN $FFN $HEADS $T $((B * STEPS)) <<'PY'
import json, os, random, shutil, sys
from transformers import OPTConfig, OPTForCausalLM
w, shared, L, C, F, H, T, n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
d = os.path.join(w, "model")
vocab = json.load(open(os.path.join(shared, "gpt2-vocab.json"), encoding="utf-8"))
vocab["</s>"], vocab["<pad>"] = len(vocab), len(vocab) + 1
OPTForCausalLM(OPTConfig(vocab_size=len(vocab), hidden_size=C, num_hidden_layers=L, ffn_dim=F, num_attention_heads=H,
                         max_position_embeddings=2048, word_embed_proj_dim=C, pad_token_id=vocab["<pad>"],
                         bos_token_id=vocab["</s>"], eos_token_id=vocab["</s>"])).save_pretrained(d)
json.dump(vocab, open(os.path.join(d, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
shutil.copy(os.path.join(shared, "gpt2-merges.txt"), os.path.join(d, "merges.txt"))
json.dump({"add_bos_token": True, "bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>",
           "tokenizer_class": "GPT2Tokenizer"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
rnd = random.Random(1)
words = "the a of to and in is it that for on with as was at by an be this from or have".split()
def text(k): return " ".join(rnd.choice(words) for _ in range(k))
for split, count in (("train", n), ("eval", 4)):
    with open(os.path.join(w, "app", "data", split + ".json"), "w") as f:
        for _ in range(count):  # every sample longer than T tokens: no padding, the same work on both sides
            f.write(json.dumps({"prompt": "Human: " + text(T) + " Assistant:", "chosen": text(T), "rejected": "x"}) + "\n")
PY

dschat_run() {  # DTYPE: the median step time of dschat's log, after 2 warm-up steps
  (cd "$W/app" && "$ROOT/$BIN" sft --data_path local/jsonfile --data_split 10,0,0 --model_name_or_path "$W/model" \
    --per_device_train_batch_size $B --per_device_eval_batch_size $B --max_seq_len $T --num_train_epochs 1 \
    --learning_rate 1e-5 --weight_decay 0.1 --dtype "$1" 2>&1) |
    sed -n 's/.*elapsed time per iteration (ms): *\([0-9.]*\).*/\1/p' | tail -n +3 | sort -n |
    awk -v d="$1" '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
      printf "{\"side\": \"dschat\", \"dtype\": \"%s\", \"ms_per_step\": %.1f}\n", d, m}'
}
echo "threads: $OMP_NUM_THREADS; $(lscpu | sed -n 's/^Model name: *//p'); model: OPT, $LAYERS layers, hidden $HIDDEN; B $B, T $T"
R=$W/results
for dt in fp32 bf16; do
  dschat_run $dt >> "$R"
  "$PY" bench/chat/sft_torch.py "$W/model" "$W/app/data" --batch $B --seq $T --steps $STEPS --dtype $dt 2>/dev/null >> "$R"
done
"$PY" - "$R" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
get = lambda side, dt: next(r["ms_per_step"] for r in rows if r["side"] == side and r["dtype"] == dt)
torch_v = next(r["torch"] for r in rows if r["side"] == "torch")
print(f"{'dtype':6} {'dschat ms/step':>15} {'torch ' + torch_v + ' ms/step':>26} {'torch / dschat':>15}")
for dt in ("fp32", "bf16"):
    a, b = get("dschat", dt), get("torch", dt)
    print(f"{dt:6} {a:15.1f} {b:26.1f} {b / a:15.2f}")
PY
