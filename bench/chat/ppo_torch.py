"""DeepSpeed-Chat's step-3 round in transformers + PyTorch, timed: the peer of
`dschat ppo` in bench/chat/ppo_run.sh. Per generation batch of G prompts
(left-padded to P): generate() greedy to P + A tokens (the actor, KV cache),
the experience (actor, reference, reward and critic forwards), then one PPO
mini-batch of all G rows: the actor's clipped policy loss, backward, step;
the critic's clipped value loss, backward, step (AdamW 0.9/0.95, clipping
1.0), as ppo_trainer.py does on one process. Prints one JSON line: the
median seconds of generation, of the experience forwards and of training
per round after the warm-up rounds.
  ppo_torch.py ACTOR_DIR CRITIC_DIR PROMPTS_JSON --gen-batch G --prompt P --answer A --rounds N
               [--dtype fp32|bf16] [--warmup 1]"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

p = argparse.ArgumentParser()
p.add_argument("actor")
p.add_argument("critic")
p.add_argument("prompts")
p.add_argument("--gen-batch", type=int, default=4)
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--answer", type=int, default=64)
p.add_argument("--rounds", type=int, default=4)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
a = p.parse_args()
G, P, A = a.gen_batch, a.prompt, a.answer


class RewardModel(torch.nn.Module):  # DeepSpeed-Chat's: the backbone and a bias-free v_head
    def __init__(self, base):
        super().__init__()
        self.v_head = torch.nn.Linear(base.config.hidden_size, 1, bias=False)
        self.rwtransformer = base

    def values(self, ids, mask):
        return self.v_head(self.rwtransformer(ids, attention_mask=mask)[0]).squeeze(-1)


tok = AutoTokenizer.from_pretrained(a.actor)
tok.pad_token = tok.eos_token  # DeepSpeed-Chat's get_tokenizer
pad = tok.pad_token_id
vocab = 8 * math.ceil(len(tok) / 8)


def causal():
    m = AutoModelForCausalLM.from_pretrained(a.actor, torch_dtype=torch.float32)
    m.resize_token_embeddings(vocab)
    return m


def critic():
    m = RewardModel(AutoModel.from_pretrained(a.critic, torch_dtype=torch.float32))
    m.rwtransformer.resize_token_embeddings(vocab)
    return m


actor, ref, crit, reward = causal(), causal(), critic(), critic()


def adamw(model):
    no_decay = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]
    named = list(model.named_parameters())
    return torch.optim.AdamW([{"params": [q for n, q in named if not any(d in n.lower() for d in no_decay)],
                               "weight_decay": 0.0},
                              {"params": [q for n, q in named if any(d in n.lower() for d in no_decay)],
                               "weight_decay": 0.0}], lr=1e-6, betas=(0.9, 0.95), eps=1e-8)


a_opt, c_opt = adamw(actor), adamw(crit)
prompts = [json.loads(line)["prompt"] for line in open(a.prompts)]
auto = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16")


def logprobs(logits, labels):
    return F.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


gen_t, exp_t, train_t = [], [], []
for r in range(a.rounds):
    batch = [tok(" " + prompts[(r * G + i) % len(prompts)])["input_ids"][-P:] for i in range(G)]
    ids = torch.tensor([[pad] * (P - len(b)) + b for b in batch])  # DataCollatorRLHF's left padding
    mask = (torch.arange(P)[None, :] >= torch.tensor([P - len(b) for b in batch])[:, None]).long()
    t0 = time.perf_counter()
    actor.eval()
    with torch.no_grad(), auto():
        seq = actor.generate(ids, attention_mask=mask, max_length=P + A, min_new_tokens=A, pad_token_id=pad)
    t1 = time.perf_counter()
    am = seq.ne(pad).long()
    with torch.no_grad(), auto():
        old = logprobs(actor(seq, attention_mask=am).logits[:, :-1], seq[:, 1:])
        ref_lp = logprobs(ref(seq, attention_mask=am).logits[:, :-1], seq[:, 1:])
        score = reward.values(seq, am)[:, -1].float()
        values = crit.values(seq, am)[:, :-1].float()
    t2 = time.perf_counter()
    actor.train()
    start = P - 1
    rewards = -0.1 * (old - ref_lp)
    rewards[:, -1] += score.clamp(-5, 5)
    adv, last = [], 0
    for t in reversed(range(start, rewards.shape[1])):
        nxt = values[:, t + 1] if t < rewards.shape[1] - 1 else 0.0
        last = rewards[:, t] + nxt - values[:, t] + 0.95 * last
        adv.append(last)
    adv = torch.stack(adv[::-1], 1)
    ret = adv + values[:, start:]
    action = am[:, 1:][:, start:]
    with auto():
        lp = logprobs(actor(seq, attention_mask=am, use_cache=False).logits[:, :-1], seq[:, 1:])[:, start:]
    ratio = torch.exp((lp - old[:, start:]) * action)
    loss = torch.sum(torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * action) / action.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
    a_opt.step()
    a_opt.zero_grad()
    with auto():
        v = crit.values(seq, am)[:, :-1][:, start:].float()
    vc = torch.max(torch.min(v, values[:, start:] + 0.2), values[:, start:] - 0.2)
    closs = 0.5 * torch.sum(torch.max((v - ret) ** 2, (vc - ret) ** 2) * action) / action.sum()
    closs.backward()
    torch.nn.utils.clip_grad_norm_(crit.parameters(), 1.0)
    c_opt.step()
    c_opt.zero_grad()
    t3 = time.perf_counter()
    gen_t.append(t1 - t0)
    exp_t.append(t2 - t1)
    train_t.append(t3 - t2)
print(json.dumps({"side": "torch", "dtype": a.dtype, "torch": torch.__version__,
                  "gen_s": statistics.median(gen_t[a.warmup:]), "exp_s": statistics.median(exp_t[a.warmup:]),
                  "train_s": statistics.median(train_t[a.warmup:]), "tokens": int(seq.shape[1])}))
