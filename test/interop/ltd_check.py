#!/usr/bin/env python3
"""Random-LTD against an independent reference: ltd_probe exports a small
GPT-2, runs one training forward/backward with layers 1 and 2 dropping tokens
and writes the kept positions, its loss and its gradient norms. Here
transformers' GPT2 blocks run the same step as DeepSpeed's random-LTD does
(data_routing/basic_layer.py: gather the kept rows in order, run the layer on
them with the causal mask of the kept length, scatter its output over a copy
of the input), with PyTorch's autograd for the gradients. Exit 77 (skip) when
transformers is not importable."""
import json, subprocess, sys, tempfile

try:
    import torch
    from transformers import GPT2LMHeadModel
except Exception as e:  # pragma: no cover - environment dependent
    print(f"SKIP: transformers/torch not importable ({e}); scripts/setup.sh installs them")
    sys.exit(77)

HF = {"norm1": "ln_1", "norm2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc",
      "mlp.proj": "mlp.c_proj"}


def hf_name(ours):
    if ours == "embed.wte":
        return "transformer.wte.weight"
    if ours == "embed.wpe":
        return "transformer.wpe.weight"
    if ours.startswith("final_norm."):
        return "transformer.ln_f." + ours.split(".")[-1]
    _, layer, rest = ours.split(".", 2)
    module, kind = rest.rsplit(".", 1)
    return f"transformer.h.{layer}.{HF[module]}.{kind}"


with tempfile.TemporaryDirectory() as d:
    subprocess.check_call([sys.argv[1], d])
    probe = json.load(open(d + "/ltd.json"))
    model = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
B, T, R = probe["B"], probe["T"], probe["R"]
layers = probe["layers"]
ids = torch.tensor(probe["tokens"]).view(B, T)
targets = torch.tensor(probe["targets"]).view(B, T).long()
index = torch.tensor(probe["index"]).view(len(layers), B, R).long()
for k in range(len(layers)):
    for b in range(B):
        row = index[k, b].tolist()
        assert row == sorted(set(row)) and len(row) == R and 0 <= row[0] and row[-1] < T, row

tr = model.transformer
h = tr.wte(ids) + tr.wpe(torch.arange(T).unsqueeze(0))
for i, block in enumerate(tr.h):
    if i not in layers:
        h = block(h)[0]
        continue
    kept = index[layers.index(i)]                                    # (B, R)
    part = torch.gather(h, 1, kept.unsqueeze(-1).expand(B, R, h.size(-1)))  # GatherTokens
    out = block(part)[0]                                             # causal over the R kept rows
    h = h.clone().scatter(1, kept.unsqueeze(-1).expand(B, R, h.size(-1)), out)  # ScatterTokens
logits = model.lm_head(tr.ln_f(h))
loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1), targets.view(-1), ignore_index=-1)
loss.backward()
params = dict(model.named_parameters())
rel = abs(loss.item() - probe["loss"]) / abs(loss.item())
print(f"loss: dstrain {probe['loss']:.7f} reference {loss.item():.7f} rel {rel:.2e}")
worst = 0.0
for ours, norm in probe["grad_norms"].items():
    p = params[hf_name(ours)]
    theirs = p.grad.norm().item() if p.grad is not None else 0.0
    err = abs(norm - theirs) / max(theirs, 1e-6)
    worst = max(worst, err)
    if err > 2e-4:
        print(f"FAIL: gradient norm of {ours}: dstrain {norm:.7g} reference {theirs:.7g}")
        sys.exit(1)
print(f"{len(probe['grad_norms'])} gradient norms agree (worst rel {worst:.2e})")
if rel > 1e-5:
    print("FAIL: random-LTD loss differs from the reference")
    sys.exit(1)
