#!/usr/bin/env bash
# Side-by-side CPU training throughput: dstrain (bench_train) vs PyTorch 2.x
# (torch_ref.py) on the same shapes and thread count. Each side runs in each
# of its configurations, interleaved (dstrain fp32, torch fp32 eager, dstrain
# bf16, torch bf16 autocast eager, torch bf16 autocast + torch.compile), and
# the table compares the best of each side; the bf16 step is also put against
# the bf16 GEMM rate measured on the same cores (bench_train --gemm-peak).
# Needs a build in ${BUILD_DIR:-build} and PyTorch 2.x: `scripts/setup.sh
# --bench` installs it from PyPI into .deps/torch-bench (TORCH_PYTHON picks
# another interpreter).
#   bench/train/run.sh           GPT-2 124M and a LLaMA shape of similar size, T 256, B 4
#   bench/train/run.sh --small   a 2-layer model of each family (a quick check of the script)
# ROUNDS=n (default 1) repeats the interleaved sequence n times; each
# configuration's best round counts.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BUILD_DIR:-build}/bench/train/bench_train
PY=${TORCH_PYTHON:-.deps/torch-bench/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[[ -x $BIN ]] || { echo "run.sh: $BIN not found (build first, or set BUILD_DIR)" >&2; exit 1; }
"$PY" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null ||
  { echo "run.sh: $PY has no PyTorch 2.x (scripts/setup.sh --bench, or set TORCH_PYTHON)" >&2; exit 1; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
shape() {  # LABEL ARGS...: every configuration of both sides, one JSON line each into $OUT/LABEL
  local label=$1; shift
  local f="$OUT/$label"
  for ((r = 0; r < ${ROUNDS:-1}; r++)); do
    "$BIN" "$@" --dtype fp32 >> "$f"
    "$PY" bench/train/torch_ref.py "$@" --dtype fp32 2>/dev/null >> "$f"
    "$BIN" "$@" --dtype bf16 >> "$f"
    "$PY" bench/train/torch_ref.py "$@" --dtype bf16 2>/dev/null >> "$f"
    "$PY" bench/train/torch_ref.py "$@" --dtype bf16 --compile --warmup 2 2>/dev/null >> "$f"
  done
  echo "$f"
}

echo "threads: $OMP_NUM_THREADS; $(lscpu | sed -n 's/^Model name: *//p'); torch $("$PY" -c 'import torch; print(torch.__version__)')"
peak=$("$BIN" --gemm-peak 4096)
echo "GEMM ceiling: $peak"
files=()
if [[ "${1:-}" == "--small" ]]; then
  files+=("$(shape small-gpt2 --layers 2 --hidden 128 --heads 4 --vocab 512 --seq 64 --batch 4 --steps 10)")
  files+=("$(shape small-llama --family llama --layers 2 --hidden 128 --heads 4 --vocab 512 --seq 64 --batch 4 --steps 10)")
else
  files+=("$(shape gpt2-124M --layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 256 --batch 4 --steps 3)")
  files+=("$(shape llama-110M --family llama --layers 12 --hidden 768 --heads 12 --vocab 32000 --seq 256 --batch 4 --steps 3)")
fi
"$PY" - "$peak" "${files[@]}" <<'PYEOF'
import json, os, sys
peak = json.loads(sys.argv[1])
for path in sys.argv[2:]:
    def name(r):
        return f"{r['impl']} {r['dtype']}"
    best = {}
    for l in open(path):
        if l.strip():
            r = json.loads(l)
            if name(r) not in best or r["ms_per_step"] < best[name(r)]["ms_per_step"]:
                best[name(r)] = r
    rows = list(best.values())
    print(f"\n{os.path.basename(path)}")
    for r in rows:
        print(f"  {name(r):<44} {r['ms_per_step']:>9.1f} ms/step {r['tokens_per_s']:>8.1f} tok/s "
              f"{r['tflops']:.4f} TFLOP/s")
    ours = min((r for r in rows if r["impl"] == "dstrain"), key=lambda r: r["ms_per_step"])
    theirs = min((r for r in rows if r["impl"] != "dstrain"), key=lambda r: r["ms_per_step"])
    print(f"  best: dstrain {ours['dtype']} {ours['ms_per_step']:.1f} ms vs {name(theirs)} "
          f"{theirs['ms_per_step']:.1f} ms: {theirs['ms_per_step'] / ours['ms_per_step']:.2f}x")
    for r in rows:
        if r["impl"] == "dstrain" and r["dtype"] == "bf16":
            print(f"  dstrain bf16 at {r['tflops'] / peak['bf16_tflops']:.0%} of the measured bf16 GEMM rate "
                  f"({peak['bf16_tflops']:.3f} TFLOP/s)")
PYEOF
