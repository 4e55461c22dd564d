#!/usr/bin/env python3
"""PyTorch reference of the same GPT training step (forward + backward + AdamW)
on CPU, for side-by-side throughput with bench_train. Same shapes, same thread
count (OMP_NUM_THREADS / torch.set_num_threads). Prints one JSON line."""
import argparse, json, math, os, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, NH, llama):
        super().__init__()
        s.NH, s.llama = NH, llama
        bias = not llama
        Norm = (lambda c: RMSNorm(c)) if llama else (lambda c: nn.LayerNorm(c))
        s.n1, s.n2 = Norm(C), Norm(C)
        s.qkv = nn.Linear(C, 3 * C, bias=bias)
        s.proj = nn.Linear(C, C, bias=bias)
        Fh = (4 * C * 2 // 3) // 64 * 64 if llama else 4 * C
        s.fc = nn.Linear(C, 2 * Fh if llama else Fh, bias=bias)
        s.fc2 = nn.Linear(Fh, C, bias=bias)

    def attn(s, x, rope):
        B, T, C = x.shape
        q, k, v = s.qkv(x).split(C, dim=2)
        q, k, v = [t.view(B, T, s.NH, C // s.NH).transpose(1, 2) for t in (q, k, v)]
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return s.proj(y)

    def forward(s, x, rope):
        x = x + s.attn(s.n1(x), rope)
        h = s.fc(s.n2(x))
        if s.llama:
            g, u = h.chunk(2, dim=-1)
            h = F.silu(g) * u
        else:
            h = F.gelu(h, approximate="tanh")
        return x + s.fc2(h)


class RMSNorm(nn.Module):
    def __init__(s, C, eps=1e-5):
        super().__init__()
        s.w, s.eps = nn.Parameter(torch.ones(C)), eps

    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w


def rope_cache(T, HS, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, HS, 2).float() / HS)
    f = torch.outer(torch.arange(T).float(), inv)
    return torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()


def apply_rope(x, cs):
    cos, sin = cs
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class GPT(nn.Module):
    def __init__(s, L, C, NH, V, T, llama):
        super().__init__()
        s.llama = llama
        s.wte = nn.Embedding(V, C)
        s.wpe = None if llama else nn.Embedding(max(T, 1024), C)
        s.blocks = nn.ModuleList(Block(C, NH, llama) for _ in range(L))
        s.nf = RMSNorm(C) if llama else nn.LayerNorm(C)
        s.head = nn.Linear(C, V, bias=False) if llama else None
        s.rope = rope_cache(T, C // NH) if llama else None

    def forward(s, idx, tgt):
        B, T = idx.shape
        x = s.wte(idx)
        if s.wpe is not None:
            x = x + s.wpe(torch.arange(T))
        for b in s.blocks:
            x = b(x, s.rope)
        x = s.nf(x)
        logits = s.head(x) if s.head is not None else x @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(layers=2, hidden=128, heads=4, vocab=512, seq=64, batch=4, steps=5, warmup=1).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--family", default="gpt2")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(1)
    m = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq, a.family == "llama")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        m(idx, tgt).backward()
        opt.step()
        dt = (time.perf_counter() - t0) * 1000
        if s >= a.warmup:
            times.append(dt)
    times.sort()
    med = times[len(times) // 2]
    n = sum(p.numel() for p in m.parameters())
    print(json.dumps(dict(impl="pytorch-" + torch.__version__, family=a.family, params=n, B=a.batch, T=a.seq,
                          ms_per_step=round(med, 2), tokens_per_s=round(a.batch * a.seq / (med / 1000), 1))))


if __name__ == "__main__":
    main()
