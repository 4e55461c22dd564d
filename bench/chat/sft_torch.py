"""DeepSpeed-Chat's step-1 training loop in transformers + PyTorch, timed: the
peer of `dschat sft` in bench/chat/run.sh. Same data files, tokenizer
handling, batch, sequence length, optimizer (AdamW 0.9/0.95 with the decay
groups), clipping and schedule as DeepSpeed-Chat's main.py, on one process
(DeepSpeed's engine replaced by the plain loop it amounts to on one CPU
process). Prints one JSON line: the median milliseconds of an optimizer
step (forward, backward, clipping, update) after the warm-up steps.
  sft_torch.py MODEL_DIR DATA_DIR --batch B --seq T --steps N [--dtype fp32|bf16] [--warmup 2]"""
import argparse
import json
import math
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("data")
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
a = p.parse_args()

tok = AutoTokenizer.from_pretrained(a.model)
tok.pad_token = tok.eos_token
tok.padding_side = "right"
rows = [json.loads(line) for line in open(a.data + "/train.json")]
texts = [" " + r["prompt"] + " " + r["chosen"] + tok.eos_token for r in rows]
enc = tok(texts, max_length=a.seq, padding="max_length", truncation=True, return_tensors="pt")
labels = torch.where(enc["attention_mask"].bool(), enc["input_ids"], -100)
model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
model.resize_token_embeddings(8 * math.ceil(len(tok) / 8))
model.train()
no_decay = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]
named = list(model.named_parameters())
opt = torch.optim.AdamW([{"params": [q for n, q in named if not any(d in n.lower() for d in no_decay)],
                          "weight_decay": 0.1},
                         {"params": [q for n, q in named if any(d in n.lower() for d in no_decay)],
                          "weight_decay": 0.0}], lr=1e-5, betas=(0.9, 0.95), eps=1e-8)
times = []
for step in range(a.steps):
    i = (step * a.batch) % (len(texts) - a.batch + 1)
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
        loss = model(input_ids=enc["input_ids"][i:i + a.batch], attention_mask=enc["attention_mask"][i:i + a.batch],
                     labels=labels[i:i + a.batch], use_cache=False).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    times.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"side": "torch", "dtype": a.dtype, "torch": torch.__version__,
                  "ms_per_step": statistics.median(times[a.warmup:]), "loss": loss.item()}))
