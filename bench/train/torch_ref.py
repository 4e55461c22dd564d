#!/usr/bin/env python3
"""PyTorch peer of bench_train: the same GPT training step (forward, backward,
gradient clipping at 1.0, AdamW) on the same shapes, for side-by-side
throughput. CPU: plain modules, same thread count (OMP_NUM_THREADS). --dtype bf16|fp16 is autocast over fp32 master weights (fp16 with a static
loss scale, as bench_train; bf16 only on the CPU),
F.scaled_dot_product_attention(is_causal=True) where torch has it,
torch.optim.AdamW(fused=True) where torch has it for the device (CUDA; CPU
from torch 2.4), and with --compile torch.compile of the model.
Weights are initialised as dstrain does (N(0, 0.02), output projections
0.02/sqrt(2L), zero biases). Prints one JSON line with bench_train's keys.
FLOPs per token: 6*N + 6*L*C*T (N: parameters in matrix multiplies, i.e. all
but learned position embeddings; the second term causal attention), the
formula dstrain logs its MFU with."""
import argparse, json, math, os, sys, time

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

H100_BF16_DENSE_TFLOPS = 989.4  # H100 SXM / H200 datasheet dense bf16


class Block(nn.Module):
    def __init__(s, C, NH, llama, sdpa):
        super().__init__()
        s.NH, s.llama, s.sdpa = NH, llama, sdpa
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
        if s.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return s.proj(y.transpose(1, 2).reshape(B, T, C))

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
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], -1) * sin.to(x.dtype)


class GPT(nn.Module):
    def __init__(s, L, C, NH, V, T, llama, sdpa, recompute):
        super().__init__()
        s.llama, s.recompute = llama, recompute
        s.wte = nn.Embedding(V, C)
        s.wpe = None if llama else nn.Embedding(max(T, 1024), C)
        s.blocks = nn.ModuleList(Block(C, NH, llama, sdpa) for _ in range(L))
        s.nf = RMSNorm(C) if llama else nn.LayerNorm(C)
        s.head = nn.Linear(C, V, bias=False) if llama else None
        if llama:  # buffers: .to(device) moves them once, not every forward
            cos, sin = rope_cache(T, C // NH)
            s.register_buffer("rope_cos", cos, persistent=False)
            s.register_buffer("rope_sin", sin, persistent=False)
        scaled = 0.02 / math.sqrt(2 * L)
        for name, p in s.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, scaled if name.endswith(("proj.weight", "fc2.weight")) else 0.02)

    def forward(s, idx, tgt):
        B, T = idx.shape
        x = s.wte(idx)
        if s.wpe is not None:
            x = x + s.wpe(torch.arange(T, device=idx.device))
        rope = (s.rope_cos, s.rope_sin) if s.llama else None
        for b in s.blocks:
            if s.recompute == "full":
                x = torch.utils.checkpoint.checkpoint(b, x, rope, use_reentrant=False)
            else:
                x = b(x, rope)
        x = s.nf(x)
        logits = s.head(x) if s.head is not None else x @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))  # f32 under autocast


def torch_version():
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def die(msg):
    print(f"torch_ref.py: {msg}", file=sys.stderr)
    sys.exit(1)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in dict(layers=2, hidden=128, heads=4, vocab=512, seq=64, batch=4, steps=5, warmup=1).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--recompute", default="none", choices=["none", "full"])
    p.add_argument("--attention", default="auto", choices=["auto", "sdpa", "math"],
                   help="auto: SDPA where torch has it (>= 2.0), else the explicit softmax(QK^T)V")
    p.add_argument("--compile", action="store_true", help="torch.compile the whole model")
    p.add_argument("--compile-blocks", action="store_true",
                   help="torch.compile each transformer block instead (regional: one compile for identical blocks)")
    p.add_argument("--loss-scale", type=float, default=1024.0, help="fp16: static loss scale")
    a = p.parse_args()
    for k in ("layers", "hidden", "heads", "vocab", "seq", "batch", "steps", "warmup"):
        if getattr(a, k) <= 0:
            die(f"--{k} {getattr(a, k)}: must be positive")
    if a.hidden % a.heads:
        die(f"--hidden {a.hidden} is not a multiple of --heads {a.heads}")
    if a.device == "cuda" and not torch.cuda.is_available():
        die(f"--device cuda: torch {torch.__version__} sees no CUDA device")
    if a.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        die(f"--attention sdpa: torch {torch.__version__} has no F.scaled_dot_product_attention (needs >= 2.0)")
    if (a.compile or a.compile_blocks) and not hasattr(torch, "compile"):
        die(f"--compile: torch {torch.__version__} has no torch.compile (needs >= 2.0)")
    if a.compile and a.compile_blocks:
        die("--compile and --compile-blocks: choose one")
    if a.device == "cpu" and a.dtype == "fp16":
        die("--dtype fp16: the CPU peer runs fp32 or bf16")
    if a.device == "cpu" and a.dtype == "bf16" and torch_version() < (2, 0):
        die(f"--dtype bf16: torch {torch.__version__} has no CPU bf16 autocast worth measuring (needs >= 2.0)")
    return a


def main():
    a = parse()
    dev = torch.device(a.device)
    if a.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1)
    sdpa = a.attention == "sdpa" or (a.attention == "auto" and hasattr(F, "scaled_dot_product_attention"))
    m = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq, a.family == "llama", sdpa, a.recompute).to(dev)
    n = sum(p.numel() for p in m.parameters())
    n_matmul = n - (m.wpe.weight.numel() if m.wpe is not None else 0)
    # fused= is torch >= 2.0 on CUDA, >= 2.4 on the CPU
    fused = dict(fused=True) if a.device == "cuda" or torch_version() >= (2, 4) else {}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    fwd = torch.compile(m) if a.compile else m
    if a.compile_blocks:
        for b in m.blocks:
            b.compile()
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.dtype)
    scale = a.loss_scale if a.dtype == "fp16" else 1.0
    params = list(m.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=amp, enabled=amp is not None):
            loss = fwd(idx, tgt)
        (loss * scale).backward()
        if scale != 1.0:
            torch._foreach_div_([p.grad for p in params], scale)
        torch.nn.utils.clip_grad_norm_(params, 1.0, **({"foreach": True} if a.device == "cuda" else {}))
        opt.step()
        return loss.item()  # one read per step, as bench_train

    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    t_compile = time.perf_counter()
    loss_first = step()
    for _ in range(a.warmup - 1):
        step()
    sync()
    warm_s = time.perf_counter() - t_compile
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    ms = (time.perf_counter() - t0) * 1000 / a.steps
    tps = a.batch * a.seq / (ms / 1000)
    fpt = 6.0 * n_matmul + 6.0 * a.layers * a.hidden * a.seq
    tflops = fpt * tps / 1e12
    peak = H100_BF16_DENSE_TFLOPS if a.device == "cuda" and amp is not None else 0.0
    impl = "pytorch-" + torch.__version__ + ("-compile" if a.compile else "-compile(blocks)" if a.compile_blocks else "") + ("-sdpa" if sdpa else "")
    print(json.dumps(dict(
        impl=impl, device=a.device, gpu=torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        family=a.family, dtype=a.dtype, recompute=a.recompute, attention="sdpa" if sdpa else "math",
        params=n, L=a.layers, C=a.hidden, NH=a.heads, V=a.vocab, B=a.batch, T=a.seq, steps=a.steps,
        ms_per_step=round(ms, 2), tokens_per_s=round(tps, 1), flops_per_token=fpt,
        flops_formula="6*N_matmul + 6*L*C*T", tflops=round(tflops, 4), peak_tflops_nominal=peak,
        mfu_nominal=round(tflops / peak, 4) if peak else 0.0, host_syncs_per_step=None,
        max_alloc_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2) if a.device == "cuda" else -1,
        loss_first=round(loss_first, 4), loss_last=round(loss, 4), warmup_s=round(warm_s, 1))))
    if not math.isfinite(loss):
        die(f"the loss is not finite after {a.warmup + a.steps} steps ({loss})")


if __name__ == "__main__":
    main()
