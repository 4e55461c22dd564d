#!/usr/bin/env python3
"""Loads a dstrain Hugging Face export with transformers and checks that its
next-token loss on the probe's token sequence equals dstrain's (hf_probe).
Exit 77 (skip) when transformers is not importable."""
import os, subprocess, sys, tempfile

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
         "mqa": ("LlamaForCausalLM", 1), "neox": ("GPTNeoXForCausalLM", 4), "mixtral": ("MixtralForCausalLM", 4),
         "opt": ("OPTForCausalLM", 4), "opt350m": ("OPTForCausalLM", 4)}
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
# The other way: a tiny random Mixtral written by transformers, read by dstrain.
from transformers import MixtralConfig, MixtralForCausalLM
torch.manual_seed(3)
cfg = MixtralConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None)
model = MixtralForCausalLM(cfg).eval()
with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d + "/hf", safe_serialization=True)
    ours = float(subprocess.check_output([probe, "import", d + "/hf"]).decode())
    ids = torch.tensor([[(t * 7919 + 13) % cfg.vocab_size for t in range(32)]])
    with torch.no_grad():
        theirs = float(model(ids, labels=ids).loss)
    rel = abs(ours - theirs) / abs(theirs)
    print(f"mixtral import: dstrain {ours:.7f} transformers {theirs:.7f} rel {rel:.2e}")
    if rel > 1e-4:
        print("FAIL: a transformers Mixtral read by dstrain does not reproduce its loss")
        sys.exit(1)
# pytorch_model.bin (PyTorch's zip format): a tiny LLaMA, a GPT-2 and an OPT saved by
# transformers without safetensors, read by dstrain's restricted reader.
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM
torch.manual_seed(4)
bins = {"llama": LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                              tie_word_embeddings=False)).eval(),
        "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=64)).eval(),
        "opt": OPTForCausalLM(OPTConfig(vocab_size=300, hidden_size=64, word_embed_proj_dim=64, num_hidden_layers=2,
                                        ffn_dim=96, num_attention_heads=4, max_position_embeddings=64,
                                        dropout=0.0)).eval(),
        # OPT-350m's blocks: post-LayerNorm, no final norm, a 32-wide embedding between project_in / project_out.
        "opt350m": OPTForCausalLM(OPTConfig(vocab_size=300, hidden_size=64, word_embed_proj_dim=32,
                                            num_hidden_layers=2, ffn_dim=96, num_attention_heads=4,
                                            max_position_embeddings=64, do_layer_norm_before=False,
                                            dropout=0.0)).eval()}
for name, model in bins.items():
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d + "/hf", safe_serialization=False)
        if not os.path.exists(d + "/hf/pytorch_model.bin"):
            print(f"FAIL: {name}: transformers wrote no pytorch_model.bin")
            sys.exit(1)
        ours = float(subprocess.check_output([probe, "import", d + "/hf"]).decode())
        ids = torch.tensor([[(t * 7919 + 13) % 300 for t in range(32)]])
        with torch.no_grad():
            theirs = float(model(ids, labels=ids).loss)
        rel = abs(ours - theirs) / abs(theirs)
        print(f"{name} pytorch_model.bin import: dstrain {ours:.7f} transformers {theirs:.7f} rel {rel:.2e}")
        if rel > 1e-4:
            print(f"FAIL: a transformers {name} saved as pytorch_model.bin, read by dstrain, does not reproduce its loss")
            sys.exit(1)
print(f"hf interop: {len(kinds) + 1 + len(bins)} passed, 0 failed")
