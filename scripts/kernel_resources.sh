#!/usr/bin/env bash
# Static resource report of every CUDA kernel, no GPU needed: recompiles each
# cuda/**/*.cu of a configured build with `ptxas -v` (sm_90 by default) and
# prints one line per kernel: registers, spill bytes, stack, static shared
# memory. Kernels that spill, or whose registers times their block size could
# not fit an SM's 64K registers, are what to look at before a device session
# (a spill costs speed; too many registers for the launch is a launch failure).
#   bash scripts/kernel_resources.sh [BUILD_DIR] [ARCH]
# BUILD_DIR: a configured CUDA build (default build); ARCH: default 90.
# Env: ALL=1 lists every kernel (default: only those with >= 128 registers or
# any spill). Writes nothing into the build; ptxas output goes to a temp dir.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
ARCH="${2:-90}"
[[ -f "$BUILD/build.ninja" ]] || { echo "kernel_resources: $BUILD is not a configured Ninja build" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mapfile -t cmds < <(ninja -C "$BUILD" -t commands ds_cuda | grep -E '/nvcc .* -c [^ ]+\.cu ')
[[ ${#cmds[@]} -gt 0 ]] || { echo "kernel_resources: no CUDA compile commands in $BUILD (DS_CUDA off?)" >&2; exit 2; }
for cmd in "${cmds[@]}"; do
  src="$(grep -oE ' -c [^ ]+\.cu' <<<"$cmd" | cut -c5-)"
  name="$(basename "$src" .cu)"
  # Same flags, one real architecture, no dependency file, output to tmp.
  c="$(sed -E -e 's/ -MD -MT [^ ]+ -MF [^ ]+//' -e 's/--generate-code=arch=compute_[0-9a-z]+,code=\[[^]]*\]//g' \
            -e "s# -o [^ ]+# -o $tmp/$name.o#" <<<"$cmd")"
  (cd "$BUILD" && eval "$c --generate-code=arch=compute_$ARCH,code=sm_$ARCH -Xptxas -v") > "$tmp/$name.log" 2>&1 ||
    { echo "kernel_resources: compiling $src failed:" >&2; tail -n 20 "$tmp/$name.log" >&2; exit 1; }
done
ALL="${ALL:-0}" python3 - "$tmp" <<'EOF'
import glob, os, re, subprocess, sys
rows = []
for log in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    cur = None
    for line in open(log):
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = {"file": os.path.basename(log)[:-4], "fn": m.group(1), "regs": 0, "spill": 0, "stack": 0, "smem": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["spill"] = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            cur["smem"] = int(m.group(1))
names = subprocess.run(["c++filt"], input="\n".join(r["fn"] for r in rows), capture_output=True, text=True).stdout.split("\n")
shown = 0
print(f"{'file':<18} {'regs':>4} {'spill':>5} {'stack':>5} {'smem':>6}  kernel")
for r, n in zip(rows, names):
    if os.environ["ALL"] != "1" and r["regs"] < 128 and r["spill"] == 0:
        continue
    n = re.sub(r"\(anonymous namespace\)::", "", n)
    n = re.sub(r"\(ds::cuda::[^)]*\)$", "", n)  # drop the parameter list
    print(f"{r['file']:<18} {r['regs']:>4} {r['spill']:>5} {r['stack']:>5} {r['smem']:>6}  {n[:110]}")
    shown += 1
spills = sum(1 for r in rows if r["spill"])
print(f"{len(rows)} kernels, {shown} listed, {spills} spilling "
      "(registers per thread; spill = store + load bytes; smem = static bytes, dynamic shared memory is set at launch)")
EOF
