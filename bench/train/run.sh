#!/usr/bin/env bash
# Side-by-side CPU training throughput: dstrain (bench_train) vs PyTorch on the
# same shapes and thread count. Needs `scripts/setup.sh --bench` (python3-torch)
# and a build in ${BUILD_DIR:-build}.
#   bench/train/run.sh            small model + GPT-2-124M shape at T=128
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BUILD_DIR:-build}/bench/train/bench_train
PY=/usr/bin/python3   # Debian's python3-torch lives there
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
run() {
  local label=$1; shift
  local ours theirs
  ours=$("$BIN" "$@")
  theirs=$("$PY" bench/train/torch_ref.py "$@")
  "$PY" - "$label" "$ours" "$theirs" <<'PYEOF'
import json, sys
label, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{label:<28} dstrain {a['tokens_per_s']:>9.0f} tok/s ({a['ms_per_step']:>8.1f} ms) | "
      f"{b['impl']:<16} {b['tokens_per_s']:>9.0f} tok/s ({b['ms_per_step']:>8.1f} ms) | "
      f"ratio {a['tokens_per_s']/b['tokens_per_s']:.2f}x")
PYEOF
}
echo "threads: $OMP_NUM_THREADS"
run "small gpt2 (L2 C128 T64 B4)" --layers 2 --hidden 128 --heads 4 --vocab 512 --seq 64 --batch 4 --steps 10
run "small llama (L2 C128 T64 B4)" --family llama --layers 2 --hidden 128 --heads 4 --vocab 512 --seq 64 --batch 4 --steps 10
run "gpt2-124M (T128 B4)" --layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 128 --batch 4 --steps 3
