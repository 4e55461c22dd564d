#!/usr/bin/env bash
# Side-by-side GPU benchmarks ON THE LENT DEVICE, in one call, on the bundle
# scripts/gpu_bundle.sh built here (it copies this script to gpu-bundle/bench.sh):
#   device call: carry ["gpu-bundle"], command `bash gpu-bundle/bench.sh`
# Steps, most wanted first, each under `timeout` and the whole-run budget; a
# failing step is reported and the next one runs:
#   1. GPT-2 124M (L12 C768 NH12 V50304 T1024 B16) bf16 training step:
#      bench_train vs torch_ref.py (torch.compile, SDPA, fused AdamW)
#   2. bench_cuda_kernels: copy and bf16 GEMM ceilings, memory-bound kernels as
#      a fraction of the copy, attention flash2/flash2o/flash/plain
#   3. sdpa_ref.py: SDPA flash and cuDNN backends at the same attention shapes,
#      and torch's copy / GEMM ceilings
#   4. GPT 1.3B (L24 C2048 NH16 T2048 B2) bf16 step, without and with full
#      recomputation (dstrain), and GPT-2 124M with --attention-backend flash2
#   5. LLaMA-style 215M (L12 C1024 NH8 HS128 V32000 T2048 B8, SwiGLU, RMSNorm, RoPE):
#      bench_train vs torch_ref.py
#   6. GPT 1.3B torch peer (blocks compiled one by one), if the budget allows
# Output: $OUT/bench.log (everything), $OUT/train.tsv, $OUT/kernels.txt,
# $OUT/sdpa.jsonl, $OUT/summary.txt (the tables, also printed last). Exit code:
# 1 if a step failed or timed out (skipped ones do not count).
# Env: BUDGET_S (default 470 s for the whole run), PYTHON (default python3),
#      STEPS (timed steps per training run, default 10).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -d "$HERE/bin" ]]; then B="$HERE"; else B="$(cd "$HERE/.." && pwd)/gpu-bundle"; fi
if [[ -d "$B/py" ]]; then PYDIR="$B/py"; else PYDIR=""; fi
REPO="$(cd "$HERE/.." && pwd)"
pyfile() {  # bundle copy first, else the repository's
  if [[ -n "$PYDIR" && -f "$PYDIR/$1" ]]; then echo "$PYDIR/$1"; else find "$REPO/bench" -name "$1" | head -n1; fi
}
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET_S="${BUDGET_S:-470}"
PY="${PYTHON:-python3}"
STEPS="${STEPS:-10}"
T0=$(date +%s)
LOG="$OUT/bench.log"
TRAIN="$OUT/train.tsv"
KERN="$OUT/kernels.txt"
SDPA="$OUT/sdpa.jsonl"
: > "$LOG"; : > "$TRAIN"; : > "$KERN"; : > "$SDPA"
export PYTHONUNBUFFERED=1
say() { printf '%s\n' "$*" | tee -a "$LOG"; }
remaining() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

chmod +x "$B"/bin/* 2>/dev/null  # in case the copy lost the mode bits
if [[ ! -x "$B/bin/bench_train" ]]; then
  say "gpu_bench: no $B/bin/bench_train (run scripts/gpu_bundle.sh here first, then carry gpu-bundle)"
  exit 2
fi

# --- libraries: the device's CUDA toolkit, the pip nvidia.* lib folders, the
# driver's; the bundle's xz-packed libraries unpack to /tmp (as run.sh does).
libdirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -d "$d" ]] && libdirs+=("$d"); done
while IFS= read -r d; do [[ -n "$d" ]] && libdirs+=("$d"); done < <("$PY" - 2>/dev/null <<'EOF'
import os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
for base in sorted({os.path.realpath(b) for b in nvidia.__path__}):
    for name in sorted(os.listdir(base)):
        for sub in ("lib", "lib64"):
            d = os.path.join(base, name, sub)
            if os.path.isdir(d) and any(".so" in f for f in os.listdir(d)):
                print(d)
EOF
)
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [[ -d "$d" ]] && libdirs+=("$d"); done
XLIB=/tmp/gpu_bench_xlib
mkdir -p "$XLIB"
for f in "$B"/lib/*.xz; do
  [[ -e "$f" ]] || continue
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$f" "$XLIB/$(basename "${f%.xz}")" || say "gpu_bench: could not unpack $f"
done
LIBPATH="$B/lib:$XLIB"
for d in "${libdirs[@]}"; do LIBPATH+=":$d"; done
# The Python peers keep the environment's own library path: the bundle's
# libz/libcrypto/libgomp must not stand in for Python's or torch's.
PYRUN=(env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" "$PY")
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LDD_OUT="$(ldd "$B/bin/bench_train" 2>&1 || true)"  # not piped into grep -q (pipefail + SIGPIPE)
if grep -qE "version .(GLIBCXX|CXXABI)_[0-9.]+' not found" <<<"$LDD_OUT" &&
   [[ -f "$B/lib/fallback/libstdc++.so.6.xz" ]]; then
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$B/lib/fallback/libstdc++.so.6.xz" "$XLIB/libstdc++.so.6"
fi

# --- what this run is on -----------------------------------------------------
say "=== gpu_bench: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), budget ${BUDGET_S}s"
[[ -f "$B/BUILD_INFO.txt" ]] && sed 's/^/    /' "$B/BUILD_INFO.txt" | tee -a "$LOG"
if command -v nvidia-smi >/dev/null 2>&1; then
  say "GPU, driver: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -n1)"
else
  say "GPU, driver: nvidia-smi not found"
fi
say "CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
say "libraries dstrain resolves:"
ldd "$B/bin/bench_train" 2>&1 | awk '/libcudart|libcublas|libcudnn|not found/ {print $1, $3}' |
  while read -r name path; do say "    $name -> $(readlink -f "$path" 2>/dev/null || echo "$path")"; done
say "torch: $("${PYRUN[@]}" -c '
import importlib.metadata as md
import torch
def ver(p):
    try:
        return md.version(p)
    except md.PackageNotFoundError:
        return "?"
print(torch.__version__, "| CUDA", torch.version.cuda, "| cuDNN", torch.backends.cudnn.version(),
      "| pip nvidia-cublas", ver("nvidia-cublas"), "| triton", ver("triton"))' 2>&1 | tail -n1)"

# --- step runner -------------------------------------------------------------
# run_step NAME LIMIT STDOUT_FILE CMD...: CMD's stdout to STDOUT_FILE and the
# log, its stderr to the log; the limit shrinks to what the budget has left.
STATUS=()
failed=0
run_step() {
  local name=$1 limit=$2 dst=$3 left rc t why
  shift 3
  left=$(( $(remaining) - 5 ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then
    STATUS+=("$(printf '%-50s SKIPPED (budget spent)' "$name")")
    say "=== $name: skipped, ${left}s of the budget left"
    return 99
  fi
  say "=== $name (timeout ${limit}s): $*"
  t=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$dst.tmp" 2> "$OUT/.stderr"
  rc=$?
  cat "$dst.tmp" "$OUT/.stderr" >> "$LOG"
  cat "$dst.tmp" >> "$dst"
  why="$(grep -v '^\s*$' "$OUT/.stderr" | tail -n1 | cut -c1-110)"
  rm -f "$dst.tmp" "$OUT/.stderr"
  t=$(( $(date +%s) - t ))
  if (( rc == 0 )) && grep -q '^SKIP' "$dst"; then STATUS+=("$(printf '%-50s SKIPPED: %s' "$name" "$(grep -m1 '^SKIP' "$dst" | sed 's/^SKIP: //')")")
  elif (( rc == 0 )); then STATUS+=("$(printf '%-50s ok (%ss)' "$name" "$t")")
  elif (( rc == 124 || rc == 137 )); then STATUS+=("$(printf '%-50s TIMEOUT after %ss' "$name" "$t")"); failed=1
  else STATUS+=("$(printf '%-50s FAILED rc %s (%ss): %s' "$name" "$rc" "$t" "$why")"); failed=1; fi
  return "$rc"
}
# train CASE WHO LIMIT CMD...: a training run whose last stdout line is its
# JSON; one "CASE|WHO<TAB>json" line in train.tsv (no JSON: the table says FAILED).
train() {
  local tcase=$1 who=$2 limit=$3 tmp="$OUT/.train" json
  shift 3
  : > "$tmp"
  run_step "$tcase | $who" "$limit" "$tmp" "$@"
  json="$(grep '^{' "$tmp" | tail -n1)"
  printf '%s|%s\t%s\n' "$tcase" "$who" "${json:-FAILED}" >> "$TRAIN"
  rm -f "$tmp"
}

BT="$B/bin/bench_train"
TR="$(pyfile torch_ref.py)"
W=(--warmup 2 --steps "$STEPS")
GPT2=(--layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 1024 --batch 16)
GPT13=(--layers 24 --hidden 2048 --heads 16 --vocab 50304 --seq 2048 --batch 2)
LLAMA=(--family llama --layers 12 --hidden 1024 --heads 8 --vocab 32000 --seq 2048 --batch 8)

# 1. GPT-2 124M side by side.
train "gpt2-124M T1024 B16 bf16" dstrain 90 "$BT" --device cuda --dtype bf16 "${GPT2[@]}" "${W[@]}"
train "gpt2-124M T1024 B16 bf16" torch.compile 200 "${PYRUN[@]}" "$TR" --device cuda --dtype bf16 --compile "${GPT2[@]}" "${W[@]}"
train "gpt2-124M T1024 B16 bf16" "dstrain cuda-graph" 90 "$BT" --device cuda --dtype bf16 --cuda-graph \
  "${GPT2[@]}" "${W[@]}"
# 1b. A small model, where the launch overhead dominates: eager and replayed (--cuda-graph).
SMALL=(--layers 6 --hidden 256 --heads 4 --vocab 8192 --seq 256 --batch 4)
train "small-7M T256 B4 bf16" dstrain 60 "$BT" --device cuda --dtype bf16 "${SMALL[@]}" "${W[@]}"
train "small-7M T256 B4 bf16" "dstrain cuda-graph" 60 "$BT" --device cuda --dtype bf16 --cuda-graph \
  "${SMALL[@]}" "${W[@]}"
# 2. Our kernels against their floors (ceilings, memory-bound rows, attention).
run_step bench_cuda_kernels 150 "$KERN" "$B/bin/bench_cuda_kernels"
# 3. SDPA's flash and cuDNN backends at the same shapes, and torch's ceilings.
run_step sdpa_ref 120 "$SDPA" "${PYRUN[@]}" "$(pyfile sdpa_ref.py)" --ceilings
# 4. 1.3B on one GPU; GPT-2 with the flash2 attention backend.
train "gpt-1.3B T2048 B2 bf16" dstrain 100 "$BT" --device cuda --dtype bf16 "${GPT13[@]}" "${W[@]}"
train "gpt-1.3B T2048 B2 bf16" "dstrain recompute=full" 100 "$BT" --device cuda --dtype bf16 --recompute full \
  "${GPT13[@]}" "${W[@]}"
train "gpt2-124M T1024 B16 bf16" "dstrain attn=flash2" 90 "$BT" --device cuda --dtype bf16 \
  --attention-backend flash2 "${GPT2[@]}" "${W[@]}"
# 5. LLaMA-style small model side by side.
train "llama-215M T2048 B8 bf16" dstrain 90 "$BT" --device cuda --dtype bf16 "${LLAMA[@]}" "${W[@]}"
train "llama-215M T2048 B8 bf16" torch.compile 200 "${PYRUN[@]}" "$TR" --device cuda --dtype bf16 --compile \
  "${LLAMA[@]}" "${W[@]}"
# 6. The 1.3B torch peer, last: the longest compile.
train "gpt-1.3B T2048 B2 bf16" "torch.compile(blocks)" 200 "${PYRUN[@]}" "$TR" --device cuda --dtype bf16 \
  --compile-blocks "${GPT13[@]}" "${W[@]}"

# --- tables --------------------------------------------------------------------
{
  echo
  gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
  echo "=== gpu_bench summary: ${gpu:-no nvidia-smi}, $(( $(date +%s) - T0 ))s"
  printf '  %s\n' "${STATUS[@]}"
  "${PYRUN[@]}" "$(pyfile bench_table.py)" --train "$TRAIN" --kernels "$KERN" --sdpa "$SDPA" 2>&1
} > "$OUT/summary.txt"
cat "$OUT/summary.txt" >> "$LOG"
cat "$OUT/summary.txt"
exit "$failed"
