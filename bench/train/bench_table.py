#!/usr/bin/env python3
"""Side-by-side tables of a GPU benchmark run (scripts/gpu_bench.sh), from
  --train FILE    lines "label<TAB>json": bench_train's or torch_ref.py's JSON line
  --kernels FILE  bench_cuda_kernels' output (ceilings line, attention and
                  memory-bound rows)
  --sdpa FILE     sdpa_ref.py's JSON lines
Training rows get TFLOP/s and MFU against two peaks: the datasheet dense bf16
figure (--peak, 989.4 for the H100 SXM and H200) and the measured bf16 GEMM
rate (bench_cuda_kernels' 8192^3 matmul_forward, else sdpa_ref.py's torch
matmul). Missing inputs leave their table out; nothing here is measured."""
import argparse, json, re, sys

ATTN = re.compile(r"^attn (\S+) (fwd|bwd|fwd\+bwd) B(\d+) T(\d+) NH(\d+) HS(\d+)\s+([\d.]+) ms\s+([\d.]+) TFLOP/s")
MEM = re.compile(r"^(.*?)\s+([\d.]+) ms\s+([\d.]+) GB/s .*?([\d.]+)% of copy")
CEIL = re.compile(r"^ceilings: copy (\d+) GB/s .*bf16 GEMM (\d+) TFLOP/s")


def read_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        print(f"bench_table.py: {path}: {e.strerror}", file=sys.stderr)
        return []


def json_lines(lines):
    out = []
    for ln in lines:
        try:
            out.append(json.loads(ln))
        except ValueError:
            pass
    return out


def train_table(path, peak, gemm):
    rows = []
    for ln in read_lines(path):
        label, _, js = ln.partition("\t")
        try:
            rows.append((label, json.loads(js)))
        except ValueError:
            rows.append((label, None))
    print(f"\n== training step (FLOPs/token 6*N + 6*L*C*T; MFU vs {peak:.1f} datasheet"
          + (f" and {gemm:.0f} measured GEMM" if gemm else "") + " TFLOP/s)")
    print(f"{'case':<34} {'run':<24} {'tok/s':>10} {'ms/step':>9} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'MFU/gemm':>8} {'syncs':>5} {'GB':>6} {'loss':>7}  vs peer")
    order = {}  # each case's rows together, cases in the order they first ran
    for label, _ in rows:
        order.setdefault(label.partition("|")[0], len(order))
    rows.sort(key=lambda lr: order[lr[0].partition("|")[0]])
    ours = {}
    for label, r in rows:
        case, _, who = label.partition("|")
        if r is None:
            print(f"{case:<34} {who:<24} {'FAILED (see bench.log)':>10}")
            continue
        tf = r["flops_per_token"] * r["tokens_per_s"] / 1e12
        syncs = r.get("host_syncs_per_step")
        ratio = ""
        if who == "dstrain":
            ours[case] = r["tokens_per_s"]
        elif case in ours and r["tokens_per_s"] > 0:
            ratio = f"dstrain {ours[case] / r['tokens_per_s']:.2f}x"
        print(f"{case:<34} {who[:24]:<24} {r['tokens_per_s']:>10.0f} {r['ms_per_step']:>9.2f} {tf:>8.1f} "
              f"{100 * tf / peak:>5.1f}% {(f'{100 * tf / gemm:.1f}%' if gemm else '-'):>8} "
              f"{('-' if syncs is None else f'{syncs:.1f}'):>5} {r.get('max_alloc_gb', -1):>6.1f} "
              f"{r.get('loss_last', float('nan')):>7.3f}  {ratio}")


def attention_table(kernel_lines, sdpa):
    cell = {}  # (B, T, NH, HS, pass) -> {impl: TFLOP/s}
    for ln in kernel_lines:
        m = ATTN.match(ln)
        if m:
            impl, pas, B, T, NH, HS, _, tf = m.groups()
            cell.setdefault((int(B), int(T), int(NH), int(HS), pas), {})[impl] = float(tf)
    errors = []
    for r in sdpa:
        if r.get("kind") != "attn":
            continue
        if "error" in r:
            errors.append(f"{r['impl']} B{r['B']} T{r['T']} NH{r['NH']} HS{r['HS']}: {r['error']}")
            continue
        cell.setdefault((r["B"], r["T"], r["NH"], r["HS"], r["pass"]), {})[r["impl"]] = r["tflops"]
    if not cell:
        return
    impls = ["flash2", "flash2o", "flash", "sdpa-flash", "sdpa-cudnn"]
    print("\n== causal bf16 attention, TFLOP/s (fwd 2*B*NH*T^2*HS; fwd+bwd 3.5x)")
    print(f"{'B T NH HS':<20} {'pass':<8}" + "".join(f"{i:>11}" for i in impls) + "  best ours / best sdpa")
    for key in sorted(cell, key=lambda k: (k[3], k[1], k[4])):
        if key[4] == "bwd":
            continue
        c = cell[key]
        ours = max([c[i] for i in ("flash2", "flash2o", "flash") if i in c], default=0)
        peer = max([c[i] for i in ("sdpa-flash", "sdpa-cudnn") if i in c], default=0)
        ratio = f"{ours / peer:.2f}x" if ours and peer else "-"
        vals = "".join(f"{c[i]:>11.1f}" if i in c else f"{'-':>11}" for i in impls)
        print(f"{'%d %d %d %d' % key[:4]:<20} {key[4]:<8}{vals}  {ratio}")
    for e in errors:
        print("  refused: " + e)


def memory_table(kernel_lines):
    rows = []
    for ln in kernel_lines:
        m = MEM.match(ln)
        if m:
            rows.append((m.group(1), float(m.group(3)), float(m.group(4))))
    if not rows:
        return
    print("\n== memory-bound kernels: GB/s (bytes read + written) as a fraction of the measured copy")
    for name, gbps, pct in rows:
        print(f"  {name:<44} {gbps:>8.0f} GB/s {pct:>6.1f}%")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train")
    p.add_argument("--kernels")
    p.add_argument("--sdpa")
    p.add_argument("--peak", type=float, default=989.4, help="datasheet dense bf16 TFLOP/s")
    a = p.parse_args()
    if a.peak <= 0:
        sys.exit(f"bench_table.py: --peak {a.peak}: must be positive")
    kl = read_lines(a.kernels) if a.kernels else []
    sdpa = json_lines(read_lines(a.sdpa)) if a.sdpa else []
    gemm = 0.0
    copy = 0.0
    for ln in kl:
        m = CEIL.match(ln)
        if m:
            copy, gemm = float(m.group(1)), float(m.group(2))
    for r in sdpa:
        if r.get("kind") == "gemm":
            print(f"torch bf16 GEMM {r['shape']}: {r['tflops']} TFLOP/s")
            gemm = gemm or r["tflops"]
        elif r.get("kind") == "copy":
            print(f"torch device copy: {r['gbps']} GB/s")
    if copy or gemm:
        print(f"ceilings (bench_cuda_kernels): copy {copy:.0f} GB/s, bf16 GEMM {gemm:.0f} TFLOP/s")
    if a.train:
        train_table(a.train, a.peak, gemm)
    attention_table(kl, sdpa)
    memory_table(kl)


if __name__ == "__main__":
    main()
