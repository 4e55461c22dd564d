"""What the dschat reference tests share (sft_check.py, reward_check.py,
ppo_check.py): a tiny GPT-2 or OPT in a model directory, DeepSpeed-Chat's
RewardModel (its backbone, v_head and forward_value) saved as step 2 saves
it, and DeepSpeed-Chat's LoRA (dschat/utils/module/lora.py's
LinearLayer_LoRA, convert_linear_layer_to_lora and
only_optimize_lora_parameters) written out. Needs torch and transformers."""
import json
import math
import os
import shutil

import torch
from transformers import AutoModel, AutoTokenizer, GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM


def tiny_causal_lm(family, d, shared):
    """A tiny causal LM of `family` ("gpt2", "opt" or "opt350m": OPT-350m's post-LayerNorm blocks and a 16-wide
    token embedding between project_in and project_out) saved in directory d with GPT-2's vocabulary (OPT's: plus
    "</s>" and "<pad>", a bos added first, as OPT's tokenizer)."""
    os.makedirs(d)
    vocab = json.load(open(os.path.join(shared, "gpt2-vocab.json"), encoding="utf-8"))
    shutil.copy(os.path.join(shared, "gpt2-merges.txt"), os.path.join(d, "merges.txt"))
    if family == "gpt2":
        GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0)).save_pretrained(d)
    else:
        vocab["</s>"], vocab["<pad>"] = len(vocab), len(vocab) + 1
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": True, "bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>",
                       "pad_token": "<pad>", "tokenizer_class": "GPT2Tokenizer"}, f)
        OPTForCausalLM(OPTConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                 num_attention_heads=4, max_position_embeddings=64,
                                 word_embed_proj_dim=16 if family == "opt350m" else 32,
                                 do_layer_norm_before=family != "opt350m",
                                 dropout=0.0, attention_dropout=0.0, pad_token_id=vocab["<pad>"],
                                 bos_token_id=vocab["</s>"], eos_token_id=vocab["</s>"])).save_pretrained(d)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    return d


class RewardModel(torch.nn.Module):
    """DeepSpeed-Chat's: the backbone and a bias-free v_head."""

    def __init__(self, base, pad_id=None):
        super().__init__()
        self.config = base.config
        width = getattr(base.config, "word_embed_proj_dim", None) or base.config.hidden_size
        self.v_head = torch.nn.Linear(width, 1, bias=False)
        self.rwtransformer = base
        self.PAD_ID = pad_id

    def forward_value(self, input_ids, attention_mask, prompt_length=0, return_value_only=False):
        hidden = self.rwtransformer(input_ids, attention_mask=attention_mask)[0]
        values = self.v_head(hidden).squeeze(-1)
        if return_value_only:
            return values
        assert prompt_length > 1
        seq_len, scores = input_ids.shape[1], []
        for input_id, value in zip(input_ids, values):
            c_inds = (input_id[prompt_length:] == self.PAD_ID).nonzero()
            c_ind = c_inds[0].item() + prompt_length if len(c_inds) > 0 else seq_len
            scores.append(value[c_ind - 1])
        return {"values": values, "chosen_end_scores": torch.stack(scores)}


def resize_as_dschat(model, tokenizer):
    """create_hf_model's resize to len(tokenizer) rounded up to 8, the new rows the old rows' mean (dschat's)."""
    old = model.get_input_embeddings().weight.data.clone()
    model.resize_token_embeddings(8 * math.ceil(len(tokenizer) / 8))
    model.get_input_embeddings().weight.data[old.shape[0]:] = old.mean(dim=0)


def make_reward_model(family, work, shared, cls=RewardModel):
    """A tiny causal LM of `family` turned into DeepSpeed-Chat's RewardModel (class `cls`) and saved as step 2
    saves one (pytorch_model.bin in 'rwtransformer.' names with 'v_head.weight', config.json, the tokenizer's
    files). Returns (directory, tokenizer with DeepSpeed-Chat's pad, config)."""
    step1 = tiny_causal_lm(family, os.path.join(work, "step1_" + family), shared)
    tk = AutoTokenizer.from_pretrained(step1)
    tk.pad_token = tk.eos_token  # DeepSpeed-Chat's get_tokenizer
    tk.padding_side = "right"
    base = AutoModel.from_pretrained(step1)
    resize_as_dschat(base, tk)
    if family.startswith("opt"):  # a trained OPT's padding position is not zero: make row 1 show
        base.decoder.embed_positions.weight.data[1].normal_(0, 0.5)
    rm = os.path.join(work, "rm_" + family)
    os.makedirs(rm)
    model = cls(base, tk.pad_token_id)
    torch.save(model.state_dict(), os.path.join(rm, "pytorch_model.bin"))
    model.config.save_pretrained(rm)
    for f in os.listdir(step1):
        if f.endswith((".json", ".txt")) and f not in ("config.json", "generation_config.json"):
            shutil.copy(os.path.join(step1, f), os.path.join(rm, f))
    return rm, tk, model.config


class LinearLayer_LoRA(torch.nn.Module):
    """DeepSpeed-Chat's: y = x W^T + b + (x R L) / dim, W frozen."""

    def __init__(self, weight, lora_dim, bias):
        super().__init__()
        self.weight, self.bias = weight, bias
        rows, columns = weight.shape
        self.lora_right_weight = torch.nn.Parameter(torch.zeros(columns, lora_dim))
        self.lora_left_weight = torch.nn.Parameter(torch.zeros(lora_dim, rows))
        self.lora_scaling = 1 / lora_dim
        torch.nn.init.kaiming_uniform_(self.lora_right_weight, a=math.sqrt(5))
        self.weight.requires_grad = False

    def forward(self, x):
        return (torch.nn.functional.linear(x, self.weight, self.bias) +
                (x @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling)

    def fuse(self):  # convert_lora_to_linear_layer
        with torch.no_grad():
            self.weight += self.lora_scaling * (self.lora_left_weight.t() @ self.lora_right_weight.t())


def convert_to_lora(model, part, dim, only_lora=False, force=()):
    """convert_linear_layer_to_lora(model, part, dim), then with only_lora
    only_optimize_lora_parameters(model, force). Returns (model, wrapped linears)."""
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and part in n]
    for n in names:
        parent, child = model.get_submodule(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]
        old = getattr(parent, child)
        setattr(parent, child, LinearLayer_LoRA(old.weight, dim, old.bias))
    if only_lora:
        for n, p in model.named_parameters():
            p.requires_grad = "lora_right_weight" in n or "lora_left_weight" in n or n in force
    return model, len(names)


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        if not ok:
            self.failures.append(what)
            print("FAIL:", what)


def close(a, b, rel, floor=1e-12):
    return abs(a - b) <= rel * max(abs(a), abs(b), floor)
