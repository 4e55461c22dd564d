"""LlamaTokenizer (transformers' SentencePiece tokenizer, which DeepSpeed-Chat
loads for models named "llama") on a tiny SentencePiece BPE model with byte
fallback, trained here as LLaMA's is (bpe, byte_fallback, split_digits, no
whitespace cleanup), in a legacy and a non-legacy directory.

Usage: llama_tok_ref.py OUT_DIR
Prints one JSON line per (directory, text, max_seq_len): DeepSpeed-Chat's
step-1 ids and attention mask (get_tokenizer's "[PAD]", right padding,
text + eos_token) and len(tokenizer). Exits 77 when transformers,
sentencepiece or protobuf cannot be imported."""
import io
import json
import os
import sys

try:
    import google.protobuf  # noqa: F401  (LlamaTokenizer with legacy=False needs it)
    import sentencepiece as spm
    from transformers.models.llama import LlamaTokenizer
except ImportError as e:
    print("SKIP:", e)
    sys.exit(77)

out = sys.argv[1]
corpus = ["Human: What is the capital of France? Assistant: Paris is the capital.",
          "The quick brown fox jumps over the lazy dog 1234 times.",
          "Assistant: I can help with that. Human: thanks!",
          "hello world, hello there, how are you today?"] * 20
model = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=400, model_type="bpe",
                               byte_fallback=True, split_digits=True, remove_extra_whitespaces=False,
                               normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                               character_coverage=1.0, minloglevel=2)
texts = [" Human: What is the capital of France? Assistant: Paris.",
         "\n\nHuman: hi</s> there<s>again\n\nAssistant: héllo wörld 你好 🙂 42",
         " Human:   spaces  around   and ▁ an underline",
         "</s> starts with a special token",
         "x",
         " Human: " + "a long prompt that will be cut " * 4 + "Assistant: yes"]
for legacy in (True, False):
    d = os.path.join(out, f"llama-{'legacy' if legacy else 'new'}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    json.dump({"legacy": legacy, "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
               "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None, "tokenizer_class": "LlamaTokenizer"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    t = LlamaTokenizer.from_pretrained(d, legacy=legacy)
    if t.pad_token is None:  # DeepSpeed-Chat's get_tokenizer for llama
        t.add_special_tokens({"pad_token": "[PAD]"})
        t.padding_side = "right"
    for text in texts:
        for max_len in (64, 12):
            enc = t(text + t.eos_token, max_length=max_len, padding="max_length", truncation=True)
            print(json.dumps({"dir": d, "text": text, "max_len": max_len, "ids": enc["input_ids"],
                              "mask": enc["attention_mask"], "size": len(t), "eos": t.eos_token_id,
                              "pad": t.pad_token_id, "legacy": legacy}))
