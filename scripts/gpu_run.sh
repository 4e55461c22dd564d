#!/usr/bin/env bash
# Runs the GPU checks ON THE LENT DEVICE, from the repo root, on the bundle that
# scripts/gpu_bundle.sh built here:   bash gpu-bundle/run.sh
# (device call: carry ["gpu-bundle"]). Steps, most informative first, each
# capped by its own timeout and by what is left of the budget, so that a hang
# cannot starve the steps before it; a failing step does not stop the next
# ones, and each step's one-line result is appended to $OUT/summary.txt as it
# ends (a call cut short still brings back what ran):
#   1. test_cuda_ops        every CUDA op against the CPU reference (Catch2)
#   2. smoke_cuda_bf16      dstrain on a tiny GPT-2, bf16 on the GPU, 30 iterations
#   3. test_comm_nccl       NCCL communicator, world of one (2 ranks need 2 GPUs)
#   4. test_gen_cuda        generation's KV-cache path against the CPU one
#   5. smoke_cuda_fp16, smoke_cuda_fp32, smoke_cpu_fp32   the same run in fp16, fp32, and on the CPU
#   6. test_offload_cuda    the offloaded optimizer's bucketed step against the blocking one,
#                           and its step through the NVMe tier (parameters on the device,
#                           on the host, in the tier) against AdamW in memory
#   7. test_cuda_cudnn      the cudnn attention backend against the CPU op ([cudnn])
#   8. test_flash2_ordered  flash2 attention's ordered-dQ backward ([flash2-ordered])
#   9. test_host_syncs_cuda host synchronisations of a GPU training step (<= 1),
#                           fp32 GPU loss curve against the CPU's, --cuda-graph replays
#                           (AdamW update included) against eager steps bit for bit, and
#                           a replay's launches counted with CUPTI (0 kernels, 1 graph),
#                           OneBitAdam / ZeroOneAdam / OneBitLamb on the CPU's curve, offload_optimizer
#                           nvme and offload_param (cpu, nvme) bit for bit as the cpu offload
#  10. compute-sanitizer    memcheck, racecheck, synccheck on small flash2 cases
#  11. bench_cuda_kernels   (--quick) copy / bf16 GEMM ceilings, then every op vs its
#                           floor: last, with the time left (bench.sh runs it in full)
#   then a summary table    pass/fail counts, losses side by side
# Logs go to $OUT (the device tool's output folder; ./gpu-out if unset): at most
# 8 files, since the tool brings back no more. Exit code: non-zero if any step
# failed. Env: BUDGET_S (whole-run time budget, default 510 s, for a device
# call's 600 s limit), BENCH_ARGS (default --quick; "" for all shapes),
# SMOKE_ITERS (default 30). run.sh and bench.sh are two device calls: each
# uses most of a call's 600 s and leaves its own files in $OUT.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -d "$HERE/bin" ]]; then B="$HERE"; else B="$(cd "$HERE/.." && pwd)/gpu-bundle"; fi
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET_S="${BUDGET_S:-510}"
BENCH_ARGS="${BENCH_ARGS---quick}"
SMOKE_ITERS="${SMOKE_ITERS:-30}"
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

chmod +x "$B"/bin/* 2>/dev/null  # in case the copy lost the mode bits
if [[ ! -x "$B/bin/dstrain" ]]; then
  say "gpu_run: no bundle at $B (run scripts/gpu_bundle.sh first, then carry gpu-bundle)"
  exit 2
fi

# --- CUDA libraries ----------------------------------------------------------
# The bundle carries no CUDA/NVIDIA library: use the device's toolkit if it has
# one, then the lib folders of the pip nvidia.* packages (nvidia is a namespace
# package: walk every entry of nvidia.__path__), then the driver's folder.
cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$d" ]] && cuda_dirs+=("$d")
done
while IFS= read -r d; do
  [[ -n "$d" ]] && cuda_dirs+=("$d")
done < <(python3 - 2>/dev/null <<'EOF'
import os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
seen = set()
for base in list(nvidia.__path__):
    base = os.path.realpath(base)
    for root, dirs, files in os.walk(base):
        if root[len(base):].count(os.sep) >= 3:
            dirs[:] = []
        if os.path.basename(root) in ("lib", "lib64") and any(".so" in f for f in files):
            if root not in seen:
                seen.add(root)
                print(root)
EOF
)
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [[ -d "$d" ]] && cuda_dirs+=("$d")
done
# Libraries carried compressed (NAME.xz, see gpu_bundle.sh) unpack to /tmp.
XLIB=/tmp/gpu_bundle_xlib
mkdir -p "$XLIB"
for f in "$B"/lib/*.xz; do
  [[ -e "$f" ]] || continue
  dst="$XLIB/$(basename "${f%.xz}")"
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$f" > "$dst"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$dst"
  fi || echo "gpu_run: could not unpack $f"
done
LIBPATH="$B/lib:$XLIB"
for d in "${cuda_dirs[@]}"; do LIBPATH+=":$d"; done
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# An older libstdc++ on the device: use the one carried in lib/fallback.
# (ldd's output in a variable first: grep -q exiting early under pipefail
# would turn ldd's SIGPIPE into a false answer.)
LDD_OUT="$(ldd "$B/bin/dstrain" 2>&1 || true)"
if grep -qE "version .(GLIBCXX|CXXABI)_[0-9.]+' not found" <<<"$LDD_OUT" &&
   [[ -f "$B/lib/fallback/libstdc++.so.6.xz" ]]; then
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$B/lib/fallback/libstdc++.so.6.xz" "$XLIB/libstdc++.so.6"
  FALLBACK_NOTE="using the bundle's libstdc++ (the device's is older)"
fi

say "=== gpu_run: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(uname -m)), bundle $B"
[[ -f "$B/BUILD_INFO.txt" ]] && sed 's/^/    /' "$B/BUILD_INFO.txt" | tee -a "$SUMMARY"
say "--- nvidia-smi"
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$SUMMARY"
  grep -q '^GPU ' <<<"$(nvidia-smi -L 2>/dev/null || true)" && HAVE_GPU=1
else
  say "nvidia-smi: not found"
fi
say "--- CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
say "--- LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
[[ -n "${FALLBACK_NOTE:-}" ]] && say "--- $FALLBACK_NOTE"
say "--- ldd (CUDA and bundle libraries; 'not found' flagged)"
ldd_missing=0
resolved=""
for b in "$B"/bin/*; do
  out="$(ldd "$b" 2>&1)"
  if grep -q "not found" <<<"$out"; then
    ldd_missing=1
    say "  $(basename "$b"): MISSING: $(grep 'not found' <<<"$out" | awk '{print $1}' | tr '\n' ' ')"
  else
    say "  $(basename "$b"): ok"
  fi
  resolved+="$(grep -E '=>' <<<"$out" | grep -vE 'not found' | grep -E 'libcu|libnccl|libnv|gpu-bundle' | awk '{print $1, $3}')"$'\n'
done
# The CUDA backend module (dlopen'ed for --device cuda, lib/core/cuda_module.h):
# the programs find it in ../lib from bin/ or, unpacked, on LD_LIBRARY_PATH.
MODULE="$B/lib/libds_cuda_backend.so"
[[ -f "$MODULE" ]] || MODULE="$XLIB/libds_cuda_backend.so"
if [[ -f "$MODULE" ]]; then
  out="$(ldd "$MODULE" 2>&1)"
  if grep -q "not found" <<<"$out"; then
    ldd_missing=1
    say "  CUDA backend module $MODULE: MISSING: $(grep 'not found' <<<"$out" | awk '{print $1}' | tr '\n' ' ')"
  else
    say "  CUDA backend module $MODULE: ok"
  fi
  resolved+="$(grep -E '=>' <<<"$out" | grep -vE 'not found' | grep -E 'libcu|libnccl|libnv|gpu-bundle' | awk '{print $1, $3}')"$'\n'
else
  ldd_missing=1
  say "  CUDA backend module libds_cuda_backend.so: NOT IN THE BUNDLE (--device cuda will fail)"
fi
say "  resolved to:"
sort -u <<<"$resolved" | sed '/^$/d; s/^/    /' | tee -a "$SUMMARY"
# NCCL is not linked (dstrain dlopens it, lib/comm/nccl/nccl_api.h): name the
# library it will load, from the same folders (the pip package nvidia-nccl-cu13
# on the lent machines), unless DS_NCCL_LIBRARY is already set.
if [[ -z "${DS_NCCL_LIBRARY:-}" ]]; then
  IFS=: read -r -a libdirs <<<"$LD_LIBRARY_PATH"
  for d in "${libdirs[@]}"; do
    if [[ -n "$d" && -e "$d/libnccl.so.2" ]]; then export DS_NCCL_LIBRARY="$d/libnccl.so.2"; break; fi
  done
fi
say "  NCCL (loaded at run time): ${DS_NCCL_LIBRARY:-NOT FOUND (GPU jobs with NCCL will fail; set DS_NCCL_LIBRARY)}"
# cuDNN likewise (cuda/attn/cudnn_api.h; pip nvidia-cudnn-cu13 on the lent
# machines, never in the bundle), for --attention-backend cudnn.
if [[ -z "${DS_CUDNN_LIBRARY:-}" ]]; then
  IFS=: read -r -a libdirs <<<"$LD_LIBRARY_PATH"
  for d in "${libdirs[@]}"; do
    if [[ -n "$d" && -e "$d/libcudnn.so.9" ]]; then export DS_CUDNN_LIBRARY="$d/libcudnn.so.9"; break; fi
  done
fi
say "  cuDNN (loaded at run time): ${DS_CUDNN_LIBRARY:-NOT FOUND (the cudnn attention backend will fail; set DS_CUDNN_LIBRARY)}"

# --- step runner -------------------------------------------------------------
declare -a NAMES=() STATUS=() DETAIL=()
failed=0
remaining() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

# run_step NAME TIMEOUT LOG CMD...: runs CMD under timeout, output to LOG.
run_step() {
  local name="$1" limit="$2" logf="$3"; shift 3
  local left; left=$(remaining)
  (( left - 15 < limit )) && limit=$(( left - 15 ))
  NAMES+=("$name")
  if (( limit < 10 )); then
    STATUS+=("SKIPPED"); DETAIL+=("time budget ($BUDGET_S s) used up"); failed=1
    say "=== $name: skipped, time budget used up"
    return 1
  fi
  say "=== $name (timeout ${limit}s): $*"
  local t1 rc; t1=$(date +%s)
  (cd "$WORK" && timeout -k 10 "$limit" "$@") > "$logf" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t1 ))
  tail -n 6 "$logf" | sed 's/^/    | /'
  # 77: the test binary ran, nothing failed, some cases could not run here
  # (e.g. the 2-process NCCL case on one GPU); the log names them.
  if (( rc == 0 )); then STATUS+=("ok"); elif (( rc == 77 )); then STATUS+=("ok, some cases skipped (rc 77)");
  else STATUS+=("FAIL rc=$rc"); failed=1; fi
  (( rc == 124 || rc == 137 )) && STATUS[-1]="TIMEOUT (${limit}s)"
  DETAIL+=("${dt}s")
  say "=== $name: ${STATUS[-1]} in ${dt}s"
  return $rc
}

# On a machine where nvidia-smi sees a GPU, "SKIP: no CUDA device" is a failure
# (driver/runtime mismatch, libraries not found...), not a pass.
skip_on_gpu() {
  if (( HAVE_GPU )) && grep -q '^SKIP: no CUDA device' "$1" 2>/dev/null; then
    STATUS[-1]="FAIL (SKIP on GPU)"; failed=1
    say "=== ${NAMES[-1]}: says 'no CUDA device' although nvidia-smi sees one"
  fi
}

# Catch2 (v2) result line -> "P passed, F failed of N test cases".
catch_counts() {
  local logf="$1" line skips
  skips=$(grep -c '^SKIP' "$logf" 2>/dev/null)
  line=$(grep -E '^All tests passed|^test cases:' "$logf" | tail -n1)
  if [[ "$line" == "All tests passed"* ]]; then
    echo "$(sed -E 's/All tests passed \((.*)\)/all passed (\1)/' <<<"$line"), ${skips} SKIP lines"
  elif [[ -n "$line" ]]; then
    echo "$(tr -s ' ' <<<"$line" | sed 's/|/,/g'), ${skips} SKIP lines"
  else
    echo "no Catch2 summary line (crash or timeout?)"
  fi
}

WORK="$(mktemp -d /tmp/gpu_run.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# 1. CUDA ops against the CPU reference.
run_step test_cuda_ops 150 "$OUT/test_cuda_ops.log" "$B/bin/test_cuda_ops" --durations yes
DETAIL[-1]+="; $(catch_counts "$OUT/test_cuda_ops.log")"
skip_on_gpu "$OUT/test_cuda_ops.log"

# 2. Smoke runs of dstrain: same model, data and seed; bf16 on cuda first (the most telling
# single check after the op tests), fp16 and fp32 on cuda and fp32 on the cpu later.
D="$B/data"
SMOKE=(--num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 128
       --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 8
       --train-iters "$SMOKE_ITERS" --lr 1e-3 --log-interval 5 --eval-interval 1000
       --data-path "$D/smoke" --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt")
SMOKE_RUNS=(cuda_bf16 cuda_fp16 cuda_fp32 cpu_fp32)
# --profile: the second step's host synchronisations (docs/distributed.md) in the log and the summary.
PROF=(--profile --profile-dir "$WORK")
run_step smoke_cuda_bf16 60 "$OUT/smoke_cuda_bf16.log" "$B/bin/dstrain" "${SMOKE[@]}" --device cuda --bf16 "${PROF[@]}"

# 3. NCCL communicator (world of one; NCCL warnings into the log).
NCCL_DEBUG="${NCCL_DEBUG:-WARN}" run_step test_comm_nccl 60 "$OUT/test_comm_nccl.log" "$B/bin/test_comm_nccl"
DETAIL[-1]+="; $(catch_counts "$OUT/test_comm_nccl.log")"
skip_on_gpu "$OUT/test_comm_nccl.log"

# 4. dsgen's KV-cache attention and decode against the CPU path; its log is
# appended to test_cuda_ops.log (the tool brings back at most 8 files).
run_step test_gen_cuda 60 "$WORK/test_gen_cuda.log" "$B/bin/test_gen_cuda" --durations yes
DETAIL[-1]+="; $(catch_counts "$WORK/test_gen_cuda.log")"
skip_on_gpu "$WORK/test_gen_cuda.log"
{ echo; echo "=== test_gen_cuda"; cat "$WORK/test_gen_cuda.log"; } >> "$OUT/test_cuda_ops.log"

# 5. the other smoke runs: fp16, fp32 on cuda, then fp32 on the cpu (the curve they are held to).
run_step smoke_cuda_fp16 45 "$OUT/smoke_cuda_fp16.log" "$B/bin/dstrain" "${SMOKE[@]}" --device cuda --fp16 "${PROF[@]}"
run_step smoke_cuda_fp32 45 "$OUT/smoke_cuda_fp32.log" "$B/bin/dstrain" "${SMOKE[@]}" --device cuda "${PROF[@]}"
run_step smoke_cpu_fp32 90 "$OUT/smoke_cpu_fp32.log" "$B/bin/dstrain" "${SMOKE[@]}" --device cpu

# 6. the offloaded optimizer's bucketed step (stream copies, pinned buffers)
# against the blocking one; its log is appended to test_cuda_ops.log too.
run_step test_offload_cuda 60 "$WORK/test_offload_cuda.log" "$B/bin/test_offload_cuda" --durations yes
DETAIL[-1]+="; $(catch_counts "$WORK/test_offload_cuda.log")"
skip_on_gpu "$WORK/test_offload_cuda.log"
{ echo; echo "=== test_offload_cuda"; cat "$WORK/test_offload_cuda.log"; } >> "$OUT/test_cuda_ops.log"

# 7. the cudnn attention backend ([cudnn]: cuDNN's fused SDPA graphs against
# the CPU op; a plan per shape is built on first use, which may compile
# kernels); log appended to test_cuda_ops.log.
run_step test_cuda_cudnn 120 "$WORK/test_cuda_cudnn.log" "$B/bin/test_cuda_ops" "[cudnn]" --durations yes
DETAIL[-1]+="; $(catch_counts "$WORK/test_cuda_cudnn.log")"
{ echo; echo "=== test_cuda_cudnn"; cat "$WORK/test_cuda_cudnn.log"; } >> "$OUT/test_cuda_ops.log"

# 8. flash2 attention's ordered-dQ backward (hidden from the default run: its
# key-tile counters would hang on out-of-order dispatch, so it gets its own
# timeout); its log is appended to test_cuda_ops.log.
run_step test_flash2_ordered 45 "$WORK/test_flash2_ordered.log" "$B/bin/test_cuda_ops" "[flash2-ordered]" --durations yes
DETAIL[-1]+="; $(catch_counts "$WORK/test_flash2_ordered.log")"
{ echo; echo "=== test_flash2_ordered"; cat "$WORK/test_flash2_ordered.log"; } >> "$OUT/test_cuda_ops.log"

# 9. host synchronisations of a GPU training step; its fixture runs
# $DS_BINARY_DIR/apps/dsprep/dsprep, so a folder with that layout points at the
# bundle's dsprep. Log appended to test_cuda_ops.log.
mkdir -p "$WORK/bindir/apps/dsprep"
ln -sf "$B/bin/dsprep" "$WORK/bindir/apps/dsprep/dsprep"
DS_BINARY_DIR="$WORK/bindir" run_step test_host_syncs_cuda 240 "$WORK/test_host_syncs_cuda.log" \
  "$B/bin/test_host_syncs_cuda" --durations yes
DETAIL[-1]+="; $(catch_counts "$WORK/test_host_syncs_cuda.log")"
skip_on_gpu "$WORK/test_host_syncs_cuda.log"
{ echo; echo "=== test_host_syncs_cuda"; cat "$WORK/test_host_syncs_cuda.log"; } >> "$OUT/test_cuda_ops.log"

# 10. compute-sanitizer memcheck / racecheck / synccheck on small flash2 cases
# (cp.async groups, shared-buffer reuse, the ordered-dQ counters); last, so a
# slow sanitizer cannot starve the steps above. Appended to test_cuda_ops.log.
SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [[ -x "$SANITIZER" ]]; then
  for tool in memcheck racecheck synccheck; do
    run_step "sanitize_flash2_$tool" 40 "$WORK/sanitize_$tool.log" "$SANITIZER" --tool "$tool" --error-exitcode 9 \
      "$B/bin/test_cuda_ops" "[flash2-sanitize]"
    { echo; echo "=== compute-sanitizer --tool $tool (flash2)"; tail -n 40 "$WORK/sanitize_$tool.log"; } >> "$OUT/test_cuda_ops.log"
  done
else
  say "=== compute-sanitizer not found: flash2 sanitizer steps not run"
fi

# 11. Kernel benchmark (ceilings first, then each op against its floor), last:
# bench.sh runs it in full in its own call; here it is a quick first look
# (BENCH_ARGS, default --quick) with whatever time the budget has left.
# shellcheck disable=SC2086  # BENCH_ARGS is a word list
run_step bench_cuda_kernels 120 "$OUT/bench_cuda_kernels.log" "$B/bin/bench_cuda_kernels" $BENCH_ARGS
if grep -q '^SKIP' "$OUT/bench_cuda_kernels.log" 2>/dev/null; then DETAIL[-1]+="; SKIP (no device)"; fi
skip_on_gpu "$OUT/bench_cuda_kernels.log"

# --- e) summary ----------------------------------------------------------------
field() {  # field LOG 'lm loss' -> value of that field on the last iteration line
  grep -E '^ *iteration ' "$1" 2>/dev/null | tail -n1 | grep -oE "$2: *[^|]*" | sed -E "s|^$2: *||; s| *$||"
}
for r in "${SMOKE_RUNS[@]}"; do
  logf="$OUT/smoke_$r.log"
  for i in "${!NAMES[@]}"; do
    [[ "${NAMES[$i]}" == "smoke_$r" ]] || continue
    if grep -qE '^ *iteration ' "$logf" 2>/dev/null; then
      DETAIL[i]+="; loss $(field "$logf" 'lm loss'), $(field "$logf" 'elapsed time per iteration \(ms\)') ms/it, $(field "$logf" 'tokens/s') tok/s"
      v=$(grep -oE 'lm loss value: *[^ |]*' "$logf" | tail -n1 | sed 's/.*: *//')
      [[ -n "$v" ]] && DETAIL[i]+=", val $v"
      v=$(grep -oE 'profile: iteration [0-9]+: [0-9]+ host synchronisations' "$logf" | grep -oE '[0-9]+ host' | cut -d' ' -f1)
      [[ -n "$v" ]] && DETAIL[i]+=", $v host syncs/step"
    else
      DETAIL[i]+="; $(grep -v '^\s*$' "$logf" 2>/dev/null | tail -n1 | cut -c1-160)"
    fi
  done
done

say ""
say "=================== SUMMARY (total $(( $(date +%s) - T0 ))s, logs in $OUT) ==================="
if (( ldd_missing )); then say "ldd: some libraries NOT FOUND (see above)"; failed=1; fi
for i in "${!NAMES[@]}"; do
  say "$(printf '%-20s %-19s %s' "${NAMES[$i]}" "${STATUS[$i]}" "${DETAIL[$i]}")"
done
say ""
say "lm loss by iteration (same model, data, seed):"
hdr="$(printf '%8s' iter)"
for r in "${SMOKE_RUNS[@]}"; do hdr+="$(printf ' %14s' "$r")"; done
say "$hdr"
iters=$(cat "$OUT"/smoke_*.log 2>/dev/null | grep -oE '^ *iteration +[0-9]+' | awk '{print $2}' | sort -n -u)
for it in $iters; do
  row="$(printf '%8s' "$it")"
  for r in "${SMOKE_RUNS[@]}"; do
    v=$(grep -E "^ *iteration +$it/" "$OUT/smoke_$r.log" 2>/dev/null | grep -oE 'lm loss: *[^ |]*' | sed 's/.*: *//')
    row+="$(printf ' %14s' "${v:--}")"
  done
  say "$row"
done
say "overall: $([[ $failed == 0 ]] && echo PASS || echo FAIL)"
say "side-by-side benchmarks (dstrain vs PyTorch): the next device call, bash gpu-bundle/bench.sh"
exit "$failed"
