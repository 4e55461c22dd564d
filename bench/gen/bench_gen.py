#!/usr/bin/env python3
"""Generation throughput: dsgen (KV cache) against transformers on the same
model, dtype and CPU threads. Builds a GPT-2-style model with dstrain (one
training step, exported to Hugging Face format), then times a prefill of P
prompt tokens and greedy decoding of N new tokens, batch 1:
  - dsgen --init-from HF --timing (its prefill and decode tokens/s), with
    --bf16 for --dtype bf16;
  - transformers loaded with torch_dtype float32 or bfloat16: one forward of
    the prompt with use_cache, then N single-token forwards with
    past_key_values (what generate() runs), torch.set_num_threads.
Sizes: small = the demo shape (6 layers, 256 hidden, 8 heads), base = GPT-2
124M's blocks (12 layers, 768 hidden, 12 heads); vocabulary 1024, 512 positions.
  bench_gen.py BUILD_DIR [--threads 2] [--prompt 128] [--new 128] [--dtype fp32|bf16] [--size small|base]
Needs torch + transformers (TORCH_PYTHON in bench/train/run.sh's sense: any
interpreter that has both). Prints one table row per engine."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("build")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--prompt", type=int, default=128)
ap.add_argument("--new", type=int, default=128)
ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
ap.add_argument("--size", default="small", choices=["small", "base"])
args = ap.parse_args()
BUILD, THREADS, P, N = args.build, args.threads, args.prompt, args.new
L, C, NH = (6, 256, 8) if args.size == "small" else (12, 768, 12)
REPS = 3
os.environ["OMP_NUM_THREADS"] = str(THREADS)
import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(THREADS)


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


with tempfile.TemporaryDirectory() as d:
    sh([f"{BUILD}/apps/dsprep/dsprep", "--generate-corpus", f"{d}/c.txt", "--size-mb", "0.2", "--seed", "1"])
    sh([f"{BUILD}/apps/dsprep/dsprep", "--train-tokenizer", "--input", f"{d}/c.txt", "--vocab-size", "1024",
        "--output-dir", f"{d}/tok"])
    sh([f"{BUILD}/apps/dsprep/dsprep", "--input", f"{d}/c.txt", "--output-prefix", f"{d}/data",
        "--vocab-file", f"{d}/tok/vocab.json", "--merge-file", f"{d}/tok/merges.txt"])
    cfg = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "model": {"family": "gpt2", "num_layers": L, "hidden_size": C, "num_heads": NH, "seq_length": 128,
                     "max_position_embeddings": 512},
           "data": {"data_path": f"{d}/data", "split": "100,0,0", "vocab_file": f"{d}/tok/vocab.json",
                    "merge_file": f"{d}/tok/merges.txt"},
           "training": {"train_iters": 1, "export_hf": f"{d}/hf", "eval_interval": 1000}}
    json.dump(cfg, open(f"{d}/cfg.json", "w"))
    sh([f"{BUILD}/apps/dstrain/dstrain", "--config", f"{d}/cfg.json"])
    tdtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(f"{d}/hf", torch_dtype=tdtype).eval()
    # dsgen reads text: a prompt of P words (about P tokens; both engines get the ids dsgen encoded).
    prompt = " ".join(["the"] * P)
    json.dump({"prompt": prompt}, open(f"{d}/p.jsonl", "w"))
    pre, dec = [], []
    for _ in range(REPS):
        r = sh([f"{BUILD}/apps/dsgen/dsgen", "--init-from", f"{d}/hf", "--vocab-file", f"{d}/tok/vocab.json",
                "--merge-file", f"{d}/tok/merges.txt", "--prompt-file", f"{d}/p.jsonl", "--output-file",
                f"{d}/o.jsonl", "--max-new-tokens", str(N), "--ignore-eos", "--timing"] + (["--bf16"] if args.dtype == "bf16" else []))
        line = [l for l in r.stderr.splitlines() if "prefill" in l][-1].split()
        # dsgen: prefill T tokens in S s (R tokens/s), decode T tokens in S s (R tokens/s)
        pre.append(float(line[7].strip("(")))
        dec.append(float(line[15].strip("(")))
    out = json.loads(open(f"{d}/o.jsonl").read())
    ptoks = out["prompt_tokens"]
    # transformers on the same prompt ids
    x = torch.tensor([ptoks])
    tp, td = [], []
    with torch.no_grad():
        for _ in range(REPS):
            t0 = time.perf_counter()
            o = model(x, use_cache=True)
            t1 = time.perf_counter()
            past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(N - 1):
                o = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
            tp.append(len(ptoks) / (t1 - t0))
            td.append((N - 1) / (t2 - t1))
    import transformers
    print(f"model: GPT-2 {L}x{C}, {NH} heads, vocab {model.config.vocab_size}; prompt {len(ptoks)} tokens, {N} new, "
          f"batch 1, {args.dtype}, {THREADS} threads, median of {REPS}")
    print("| engine | prefill tokens/s | decode tokens/s |")
    print("|---|---|---|")
    print(f"| dsgen (KV cache) | {statistics.median(pre):.0f} | {statistics.median(dec):.1f} |")
    print(f"| transformers {transformers.__version__} (torch {torch.__version__}) | {statistics.median(tp):.0f} | "
          f"{statistics.median(td):.1f} |")
