#!/usr/bin/env python3
"""Loads a dstrain Hugging Face export with transformers and checks that its
next-token loss on the probe's token sequence equals dstrain's (hf_probe).
Exit 77 (skip) when transformers is not importable."""
import subprocess, sys, tempfile

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except Exception as e:  # pragma: no cover - environment dependent
    print(f"SKIP: transformers/torch not importable ({e}); scripts/setup.sh installs them")
    sys.exit(77)

probe = sys.argv[1]
# kind -> (architecture, key-value heads); gqa / mqa are built from block flags without a family
kinds = {"gpt2": ("GPT2LMHeadModel", 4), "llama": ("LlamaForCausalLM", 4), "gqa": ("LlamaForCausalLM", 2),
         "mqa": ("LlamaForCausalLM", 1), "neox": ("GPTNeoXForCausalLM", 4)}
for family, (arch, kv_heads) in kinds.items():
    with tempfile.TemporaryDirectory() as d:
        ours = float(subprocess.check_output([probe, family, d + "/hf"]).decode())
        model = AutoModelForCausalLM.from_pretrained(d + "/hf", torch_dtype=torch.float32)
        ids = torch.tensor([[(t * 7919 + 13) % model.config.vocab_size for t in range(32)]])
        with torch.no_grad():
            theirs = float(model(ids, labels=ids).loss)
        rel = abs(ours - theirs) / abs(theirs)
        got_arch = type(model).__name__
        got_kv = getattr(model.config, "num_key_value_heads", model.config.num_attention_heads)
        eos = model.config.eos_token_id
        if got_arch != arch or got_kv != kv_heads or eos != model.config.vocab_size - 1:
            print(f"FAIL: {family} exported as {got_arch} with {got_kv} kv heads, eos {eos}; "
                  f"expected {arch}, {kv_heads}, {model.config.vocab_size - 1}")
            sys.exit(1)
        print(f"{family}: dstrain {ours:.7f} transformers {transformers.__version__} {theirs:.7f} rel {rel:.2e} "
              f"({type(model).__name__})")
        if rel > 1e-4:
            print(f"FAIL: {family} export does not reproduce dstrain's loss")
            sys.exit(1)
print(f"hf interop: {len(kinds)} passed, 0 failed")
