#!/usr/bin/env python3
"""PyTorch peer of bench_cuda_kernels' attention rows: causal bf16
F.scaled_dot_product_attention forward and forward+backward TFLOP/s with one
backend forced at a time (torch.nn.attention.sdpa_kernel: FLASH_ATTENTION,
CUDNN_ATTENTION), at the shapes bench_cuda_kernels times
((B, T, NH, HS) = (8, 1024, 12, 64), (4, 2048, 16, 128), (2, 4096, 16, 128),
(1, 8192, 16, 128)) and with its FLOP convention: forward 4*B*NH*T^2*HS/2
(causal: half the square), forward+backward 3.5x that (the backward's
recomputation not counted). q, k, v are (B, T, NH, HS) tensors seen as
(B, NH, T, HS), the layout a GPT's qkv projection gives. With --ceilings also
the two ceilings through torch: a 1 GiB device copy (bytes read + written)
and an 8192^3 bf16 matmul (cuBLAS), both on random data.
Prints one JSON line per measurement (bench/train/bench_table.py pairs them
with bench_cuda_kernels' rows); a backend that refuses a shape gets a line
with "error"."""
import argparse, json, sys

import torch
import torch.nn.functional as F

SHAPES = [(8, 1024, 12, 64), (4, 2048, 16, 128), (2, 4096, 16, 128), (1, 8192, 16, 128)]


def time_ms(fn, warm=3, reps=20):
    """Median milliseconds of reps runs (CUDA events) after warm runs."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def ceilings():
    n = (1 << 30) // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    print(json.dumps(dict(kind="copy", bytes=2 * 4 * n, ms=round(ms, 4), gbps=round(2 * 4 * n / ms / 1e6, 1))))
    del src, dst
    k = 8192
    a = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b, warm=3, reps=10)
    print(json.dumps(dict(kind="gemm", shape=f"{k}^3 bf16", ms=round(ms, 4),
                          tflops=round(2 * k ** 3 / ms / 1e9, 1))))


def attention(backends, shapes, quick):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    g = torch.Generator(device="cuda").manual_seed(13)
    for B, T, NH, HS in shapes:
        if quick and T > 4096:
            continue
        qkv = [torch.randn(B, T, NH, HS, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3)]
        q, k, v = [t.transpose(1, 2) for t in qkv]
        dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=g)
        fwd_flops = 4.0 * B * NH * T * T * HS / 2
        for name in backends:
            row = dict(kind="attn", impl="sdpa-" + name, B=B, T=T, NH=NH, HS=HS)
            try:
                with sdpa_kernel(names[name]):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    def fwdbwd():
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(out, qkv, dout)
                    with torch.no_grad():
                        ms_f = time_ms(fwd)
                    ms_fb = time_ms(fwdbwd)
            except Exception as e:  # the backend refused the shape (or is missing)
                print(json.dumps(dict(row, error=str(e).splitlines()[0][:160] if str(e) else type(e).__name__)))
                continue
            for pas, ms, fl in (("fwd", ms_f, fwd_flops), ("fwd+bwd", ms_fb, 3.5 * fwd_flops)):
                print(json.dumps(dict(row, **{"pass": pas}, ms=round(ms, 4), tflops=round(fl / ms / 1e9, 1))))
            sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="flash,cudnn", help="comma-separated: flash, cudnn")
    p.add_argument("--ceilings", action="store_true", help="also the copy and bf16 GEMM ceilings")
    p.add_argument("--quick", action="store_true", help="skip T 8192 (as bench_cuda_kernels --quick)")
    a = p.parse_args()
    backends = [b for b in a.backends.split(",") if b]
    bad = [b for b in backends if b not in ("flash", "cudnn")]
    if bad or not backends:
        sys.exit(f"sdpa_ref.py: --backends {a.backends}: expected a comma-separated list of flash, cudnn")
    if not torch.cuda.is_available():
        sys.exit(f"sdpa_ref.py: torch {torch.__version__} sees no CUDA device")
    try:
        from torch.nn.attention import sdpa_kernel  # noqa: F401  (torch >= 2.3)
    except ImportError:
        sys.exit(f"sdpa_ref.py: torch {torch.__version__} has no torch.nn.attention.sdpa_kernel (needs >= 2.3)")
    print(json.dumps(dict(kind="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                          cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())))
    if a.ceilings:
        ceilings()
    attention(backends, SHAPES, a.quick)


if __name__ == "__main__":
    main()
