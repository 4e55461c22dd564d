#!/usr/bin/env python3
"""dstrain's finetune_llama.py data (a .json --data-path, lib/chat/instruction_data)
against Megatron-DeepSpeed's SupervisedDataset and get_batch_pipe written out
with transformers: the Alpaca templates, the tokenizer as Megatron's
_HFTokenizer loads it (use_fast=False, right padding, "[PAD]" added,
model_max_length = seq_length), examples padded to seq_length + 1 with the
source's labels set to the pad id, then tokens = ids[:-1], labels = ids[1:],
loss_mask = labels != pad; and the order of Megatron's pretraining sampler
(sequential, micro x dp groups, rank slices, the last partial group of each
epoch dropped, epochs repeated). dstrain's padding positions hold another id
than "[PAD]" (they follow every real position), so tokens are compared where
the row is real.
Usage: instruction_check.py PROBE SHARED_DATA_DIR. Exit 77 without
transformers or the GPT-2 tokenizer files."""
import json, os, shutil, subprocess, sys, tempfile

try:
    from transformers import AutoTokenizer
except Exception as e:  # pragma: no cover - environment dependent
    print(f"SKIP: transformers not importable ({e})")
    sys.exit(77)
probe, shared = sys.argv[1], sys.argv[2]
if not os.path.exists(os.path.join(shared, "gpt2-vocab.json")):
    print(f"SKIP: no GPT-2 tokenizer files in {shared}")
    sys.exit(77)

PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. "
                   "Write a response that appropriately completes the request.\n\n"
                   "### Instruction:\n{instruction}\n\n### Response:")
records = [
    {"instruction": "Give three tips for staying healthy.", "input": "",
     "output": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Get enough sleep."},
    {"instruction": "Translate the sentence to French.", "input": "The cat sleeps.", "output": "Le chat dort."},
    {"instruction": "What is {input}? Keep braces {like this}.", "input": "2 + 2", "output": "It is 4."},
    {"instruction": "Write a long story about a dragon who learns to read books in a quiet village library.",
     "input": "Make it long enough to be cut at the sequence length, with many many words in it.",
     "output": "Once upon a time " * 30},
    {"instruction": "Say hi.", "output": "hi<|endoftext|> there"},
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Count to five.", "input": "", "output": "1 2 3 4 5"},
]
T, B = 96, 2
with tempfile.TemporaryDirectory() as d:
    tokdir = os.path.join(d, "gpt2")
    os.makedirs(tokdir)
    shutil.copy(os.path.join(shared, "gpt2-vocab.json"), os.path.join(tokdir, "vocab.json"))
    shutil.copy(os.path.join(shared, "gpt2-merges.txt"), os.path.join(tokdir, "merges.txt"))
    json.dump({"tokenizer_class": "GPT2Tokenizer"}, open(os.path.join(tokdir, "tokenizer_config.json"), "w"))
    data = os.path.join(d, "alpaca_data.json")
    json.dump(records, open(data, "w"))

    # Megatron's _HFTokenizer and SupervisedDataset.
    tok = AutoTokenizer.from_pretrained(tokdir, padding_side="right", use_fast=False)
    specials = {}
    for key, text in (("pad_token", "[PAD]"), ("eos_token", "</s>"), ("bos_token", "<s>"), ("unk_token", "<unk>")):
        if getattr(tok, key) is None:
            specials[key] = text
    tok.add_special_tokens(specials)
    tok.model_max_length = T
    pad = tok.pad_token_id

    def tokenize(text):
        ids = tok(text, padding="max_length", max_length=tok.model_max_length + 1, truncation=True).input_ids
        return ids, sum(1 for i in ids if i != pad)

    sources = [(PROMPT_INPUT if r.get("input", "") != "" else PROMPT_NO_INPUT).format_map(r) for r in records]
    examples = []
    for s, r in zip(sources, records):
        ids, _ = tokenize(s + f"{r['output']}{tok.eos_token}")
        _, source_len = tokenize(s)
        labels = list(ids)
        labels[:source_len] = [pad] * source_len
        lab = labels[1:]
        examples.append((ids[:-1], [l if l != pad else -1 for l in lab], sum(1 for l in lab if l != pad)))

    def sampler(dp, groups):  # MegatronPretrainingSampler, drop_last, repeated (--repeated-dataloader)
        usable = len(records) // (B * dp) * (B * dp)
        idx = 0
        for g in range(groups):
            batch = [(idx + k) % usable for k in range(B * dp)]
            idx += B * dp
            yield g, [batch[r * B:(r + 1) * B] for r in range(dp)]

    for dp in (1, 2):
        groups = 5
        out = subprocess.run([probe, data, tokdir, str(T), str(B), str(dp), str(groups)], check=True,
                             capture_output=True, text=True).stdout.splitlines()
        got = {(j["group"], j["rank"]): j for j in (json.loads(l) for l in out if l.startswith("{"))}
        for g, ranks in sampler(dp, groups):
            for r, rows in enumerate(ranks):
                j = got[(g, r)]
                counted = 0
                for b, i in enumerate(rows):
                    tokens, targets, n = examples[i]
                    got_tok = j["tokens"][b * T:(b + 1) * T]
                    got_tgt = j["targets"][b * T:(b + 1) * T]
                    real = [t for t, x in enumerate(tokens) if x != pad]
                    assert got_tgt == targets, f"dp {dp} group {g} rank {r} row {b} (record {i}): targets\n{got_tgt}\n{targets}"
                    assert [got_tok[t] for t in real] == [tokens[t] for t in real], \
                        f"dp {dp} group {g} rank {r} row {b} (record {i}): tokens"
                    assert real == list(range(len(real))), "padding only at the end"
                    counted += n
                want_scale = B * T / counted if counted else 1.0
                assert abs(j["scale"] - want_scale) <= 1e-6 * want_scale, (j["scale"], want_scale)
        print(f"dp {dp}: {groups} groups of {B} x {dp} samples equal Megatron's SupervisedDataset and sampler")
