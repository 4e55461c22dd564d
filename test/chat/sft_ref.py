"""DeepSpeed-Chat's step-1 samples, made by transformers itself.

Usage: sft_ref.py OUT_DIR SHARED_DATA_DIR
Writes tokenizer directories (GPT-2's vocabulary as vocab.json + merges.txt,
as tokenizer.json, and OPT-style: special tokens "</s>"/"<pad>" added, a bos
added first) under OUT_DIR, then prints one JSON line per (tokenizer, text,
max_seq_len): the ids and attention mask DeepSpeed-Chat's create_dataset_split
gives (tokenizer(text + eos, max_length, padding="max_length",
truncation=True) with pad = eos, right padding), and len(tokenizer).
Exits 77 when transformers cannot be imported."""
import json
import os
import shutil
import sys

try:
    from transformers import AutoTokenizer
except ImportError:
    print("SKIP: transformers is not importable by", sys.executable)
    sys.exit(77)

out, shared = sys.argv[1], sys.argv[2]
vocab, merges = os.path.join(shared, "gpt2-vocab.json"), os.path.join(shared, "gpt2-merges.txt")


def files_dir(name, model_type, extra_vocab=(), config=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    json.dump({"model_type": model_type}, open(os.path.join(d, "config.json"), "w"))
    v = json.load(open(vocab, encoding="utf-8"))
    for tok in extra_vocab:
        v[tok] = len(v)
    json.dump(v, open(os.path.join(d, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
    shutil.copy(merges, os.path.join(d, "merges.txt"))
    if config is not None:
        json.dump(config, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return d


def fast_dir(name, source):
    d = os.path.join(out, name)
    AutoTokenizer.from_pretrained(source).save_pretrained(d)
    return d


gpt2_files = files_dir("gpt2_files", "gpt2")
opt_files = files_dir("opt_files", "opt", ["</s>", "<pad>"], {
    "add_bos_token": True, "bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>",
    "pad_token": "<pad>", "tokenizer_class": "GPT2Tokenizer"})
dirs = [("gpt2_files", gpt2_files, None), ("opt_files", opt_files, None),
        ("gpt2_fast", fast_dir("gpt2_fast", gpt2_files), None), ("opt_fast", fast_dir("opt_fast", opt_files), None),
        ("gpt2_fast_eot", os.path.join(out, "gpt2_fast"), "<|eot|>"), ("opt_files_eot", opt_files, "<|eot|>")]

texts = [
    " Human: What is the capital of France? Assistant: Paris.",
    "\n\nHuman: hi</s> there<|endoftext|>again\n\nAssistant: héllo wörld 你好 🙂",
    " Human: an answer with the end token <|eot|> inside and spaces   around  it",
    " Human: " + "a long prompt that will be cut " * 8 + "Assistant: yes",
    "x",
]
for name, d, eot in dirs:
    t = AutoTokenizer.from_pretrained(d)
    t.pad_token = t.eos_token  # DeepSpeed-Chat's get_tokenizer (not LLaMA)
    t.padding_side = "right"
    if eot is not None:
        t.add_special_tokens({"additional_special_tokens": [eot]})
    for text in texts:
        for max_len in (48, 12):
            enc = t(text + t.eos_token, max_length=max_len, padding="max_length", truncation=True)
            print(json.dumps({"dir": d, "name": name, "eot": eot, "text": text, "max_len": max_len,
                              "ids": enc["input_ids"], "mask": enc["attention_mask"], "size": len(t),
                              "eos": t.eos_token_id, "pad": t.pad_token_id}))
