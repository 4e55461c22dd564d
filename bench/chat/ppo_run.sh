#!/usr/bin/env bash
# Side-by-side CPU speed of a DeepSpeed-Chat step-3 round: `dschat ppo`
# against transformers + PyTorch 2.x running the same round
# (bench/chat/ppo_torch.py) on the same models, prompts, batch, lengths and
# thread count, fp32 and bf16, interleaved. Per generation batch of G
# prompts left-padded to P tokens: greedy generation of A tokens with a KV
# cache (dschat: on the actor's training weights), the experience forwards
# (actor, reference, reward, critic), one actor step and one critic step on
# the G rows. The actor and the critic are OPT-125m-shaped (12 layers,
# hidden 768, random weights) with GPT-2's vocabulary plus OPT's two tokens.
# Reports each side's median generation, experience and training seconds per
# round after a warm-up round. Needs a build in ${BUILD_DIR:-build}, PyTorch
# 2.x with transformers (`scripts/setup.sh --bench`, or TORCH_PYTHON) and
# ../shared/data/gpt2-vocab.json (SHARED_DATA).
#   bench/chat/ppo_run.sh [--small]     (--small: a 2-layer model, a quick check of the script)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${BUILD_DIR:-build}/apps/dschat/dschat
PY=${TORCH_PYTHON:-.deps/torch-bench/bin/python}
SHARED=${SHARED_DATA:-../shared/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[[ -x $BIN ]] || { echo "ppo_run.sh: $BIN not found (build first, or set BUILD_DIR)" >&2; exit 1; }
"$PY" -c 'import torch, transformers, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null ||
  { echo "ppo_run.sh: $PY has no PyTorch 2.x with transformers (scripts/setup.sh --bench, or TORCH_PYTHON)" >&2; exit 1; }
[[ -f $SHARED/gpt2-vocab.json ]] || { echo "ppo_run.sh: $SHARED/gpt2-vocab.json not found (SHARED_DATA)" >&2; exit 1; }
LAYERS=12; HIDDEN=768; FFN=3072; HEADS=12; G=4; P=128; A=64; ROUNDS=4
[[ ${1:-} == --small ]] && { LAYERS=2; HIDDEN=128; FFN=512; HEADS=4; ROUNDS=3; }

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/app/data"
"$PY" - "$W" "$SHARED" $LAYERS $HIDDEN $FFN $HEADS $P $((G * ROUNDS)) <<'PY'
import json, os, random, shutil, sys
from transformers import OPTConfig, OPTForCausalLM
w, shared, L, C, F, H, P, n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
vocab = json.load(open(os.path.join(shared, "gpt2-vocab.json"), encoding="utf-8"))
vocab["</s>"], vocab["<pad>"] = len(vocab), len(vocab) + 1
for name, seed in (("actor", 1), ("critic", 2)):
    d = os.path.join(w, name)
    import torch
    torch.manual_seed(seed)
    OPTForCausalLM(OPTConfig(vocab_size=len(vocab), hidden_size=C, num_hidden_layers=L, ffn_dim=F,
                             num_attention_heads=H, max_position_embeddings=2048, word_embed_proj_dim=C,
                             pad_token_id=vocab["<pad>"], bos_token_id=vocab["</s>"],
                             eos_token_id=vocab["</s>"])).save_pretrained(d)
    json.dump(vocab, open(os.path.join(d, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
    shutil.copy(os.path.join(shared, "gpt2-merges.txt"), os.path.join(d, "merges.txt"))
    json.dump({"add_bos_token": True, "bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>",
               "pad_token": "<pad>", "tokenizer_class": "GPT2Tokenizer"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
rnd = random.Random(1)
words = "the a of to and in is it that for on with as was at by an be this from or have".split()
for split, count in (("train", n), ("eval", 4)):
    with open(os.path.join(w, "app", "data", split + ".json"), "w") as f:
        for _ in range(count):  # prompts of P - 8 words: most a few tokens short of P (left padding)
            f.write(json.dumps({"prompt": " ".join(rnd.choice(words) for _ in range(P - 8)), "chosen": "a",
                                "rejected": "b"}) + "\n")
PY

dschat_run() {  # DTYPE: the median latencies of dschat's rounds, after the first
  (cd "$W/app" && "$ROOT/$BIN" ppo --data_path local/jsonfile --data_split 0,0,10 --seed 1 \
    --actor_model_name_or_path "$W/actor" --critic_model_name_or_path "$W/critic" \
    --per_device_generation_batch_size $G --per_device_training_batch_size $G --max_prompt_seq_len $P \
    --max_answer_seq_len $A --actor_learning_rate 1e-6 --critic_learning_rate 1e-6 --num_warmup_steps 0 \
    --dtype "$1" 2>&1) > "$W/dschat_$1.log"
  "$PY" - "$W/dschat_$1.log" "$1" <<'PY'
import json, re, statistics, sys
log = open(sys.argv[1]).read()
lat = [(float(g), float(t)) for g, t in re.findall(r"Generation Latency: ([0-9.]+)s \| Training Latency: ([0-9.]+)s", log)]
exp = [float(x) for x in re.findall(r"experience latency: ([0-9.]+)s", log)]
assert lat and exp, log[-2000:]
med = lambda v: statistics.median(v[1:] if len(v) > 1 else v)
print(json.dumps({"side": "dschat", "dtype": sys.argv[2], "gen_s": med([g for g, _ in lat]), "exp_s": med(exp),
                  "train_s": med([t for _, t in lat])}))
PY
}
echo "threads: $OMP_NUM_THREADS; $(lscpu | sed -n 's/^Model name: *//p'); actor and critic: OPT, $LAYERS layers, hidden $HIDDEN;" \
     "G $G, prompt $P, answer $A tokens, $ROUNDS rounds"
R=$W/results
for dt in fp32 bf16; do
  dschat_run $dt >> "$R"
  "$PY" bench/chat/ppo_torch.py "$W/actor" "$W/critic" "$W/app/data/train.json" --gen-batch $G --prompt $P \
    --answer $A --rounds $ROUNDS --dtype $dt 2>/dev/null >> "$R"
done
"$PY" - "$R" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
get = lambda side, dt, k: next(r[k] for r in rows if r["side"] == side and r["dtype"] == dt)
torch_v = next(r["torch"] for r in rows if r["side"] == "torch")
print(f"{'dtype':6} {'phase':11} {'dschat s':>9} {'torch ' + torch_v + ' s':>20} {'torch / dschat':>15}")
for dt in ("fp32", "bf16"):
    for k, name in (("gen_s", "generation"), ("exp_s", "experience"), ("train_s", "training")):
        a, b = get("dschat", dt, k), get("torch", dt, k)
        print(f"{dt:6} {name:11} {a:9.2f} {b:20.2f} {b / a:15.2f}")
PY
