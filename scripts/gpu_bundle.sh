#!/usr/bin/env bash
# Builds the GPU-relevant binaries here (CUDA Release, sm_90 only, the project's
# libraries shared: DS_SHARED_LIBS=ON, so the programs share one copy of the
# CUDA kernels in libds_cuda.so instead of carrying ~4 MiB each) and assembles
# gpu-bundle/ at the repo root for the lent device machine:
#   gpu-bundle/bin/   test_cuda_ops, test_gen_cuda, test_offload_cuda, test_host_syncs_cuda, test_comm_nccl (+ ds_comm_worker, which it
#                     starts from its own folder), bench_cuda_kernels, dstrain,
#                     dsprep, dsrun (stripped copies)
#   gpu-bundle/lib/   libds_cuda_backend.so, the CUDA backend module the programs
#                     load for --device cuda (they look in ../lib from their own
#                     folder, then LD_LIBRARY_PATH: lib/core/cuda_module.h), and
#                     every shared library they and the module need (ldd), our libds_*.so
#                     included, that is neither a
#                     CUDA/NVIDIA library (found on the device) nor a base glibc /
#                     libstdc++ / libgcc_s library
#   gpu-bundle/data/  a tiny generated corpus, BPE vocab and .bin/.idx dataset
#   gpu-bundle/run.sh copy of scripts/gpu_run.sh
#   gpu-bundle/bench.sh copy of scripts/gpu_bench.sh (side-by-side benchmarks), its
#                     Python peers and table in gpu-bundle/py/
# Then, on the device: carry ["gpu-bundle"], command `bash gpu-bundle/run.sh`.
#
# Env: BUILD_DIR (default build-gpu), JOBS (ninja -j, default 1),
#      DS_CPU_ARCH (-march for lib/cpu, default x86-64-v3: the device's CPU is
#      not ours, so no -march=native), MAX_MB (size check, default 40; the
#      bundle was 24 MiB when the libraries became shared, 54 MiB before).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-1}"
CPU_ARCH="${DS_CPU_ARCH:-x86-64-v3}"
MAX_MB="${MAX_MB:-40}"
BUNDLE="$ROOT/gpu-bundle"
TARGETS=(test_cuda_ops test_gen_cuda test_offload_cuda test_host_syncs_cuda test_comm_nccl ds_comm_worker bench_cuda_kernels bench_train dstrain dsprep dsrun)
MODULE=libds_cuda_backend.so  # built by target ds_cuda_backend into $BUILD_DIR/cuda/

log() { printf '[gpu_bundle] %s\n' "$*"; }
die() { printf '[gpu_bundle] ERROR: %s\n' "$*" >&2; exit 1; }

# --- configure -------------------------------------------------------------
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  log "configuring $BUILD_DIR (Release, sm_90, shared libraries, DS_CPU_ARCH=$CPU_ARCH)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DDS_SHARED_LIBS=ON -DDS_CPU_ARCH="$CPU_ARCH"
else
  cache="$BUILD_DIR/CMakeCache.txt"
  arch="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$cache")"
  btype="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")"
  cpu="$(sed -n 's/^DS_CPU_ARCH:[A-Z]*=//p' "$cache")"
  log "reusing $BUILD_DIR (build type '$btype', CUDA archs '$arch', DS_CPU_ARCH '$cpu')"
  [[ "$arch" == "90" && "$btype" == "Release" ]] ||
    die "$BUILD_DIR is not a Release sm_90-only build; use another BUILD_DIR"
  shared="$(sed -n 's/^DS_SHARED_LIBS:[A-Z]*=//p' "$cache")"
  if [[ "$shared" != "ON" ]]; then
    log "turning DS_SHARED_LIBS on in $BUILD_DIR (one copy of the kernels for every program)"
    cmake -S . -B "$BUILD_DIR" -DDS_SHARED_LIBS=ON > /dev/null
  fi
  if [[ "$cpu" == "native" ]]; then
    log "WARNING: DS_CPU_ARCH=native in $BUILD_DIR: lib/cpu may use instructions the device's CPU lacks"
  fi
fi

# --- build -----------------------------------------------------------------
log "building ${TARGETS[*]} (ninja -j$JOBS)"
ninja -C "$BUILD_DIR" -j"$JOBS" "${TARGETS[@]}" ds_cuda_backend

# --- assemble --------------------------------------------------------------
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/data"
for t in "${TARGETS[@]}"; do
  src="$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x -not -path '*/CMakeFiles/*' | head -n1)"
  [[ -n "$src" ]] || die "built target $t not found under $BUILD_DIR"
  cp "$src" "$BUNDLE/bin/$t"
  strip --strip-unneeded "$BUNDLE/bin/$t" 2>/dev/null || log "could not strip $t (kept as is)"
done
# The CUDA backend module: no program links it (dlopen), so ldd of bin/ does
# not see it or its libds_cuda.so; it is carried and scanned by ldd itself.
[[ -f "$BUILD_DIR/cuda/$MODULE" ]] || die "$BUILD_DIR/cuda/$MODULE not built"
cp "$BUILD_DIR/cuda/$MODULE" "$BUNDLE/lib/$MODULE"
strip --strip-unneeded "$BUNDLE/lib/$MODULE" 2>/dev/null || true

# Shared libraries: everything ldd resolves except CUDA/NVIDIA (the device has
# its own, matching its driver) and the base system libraries every glibc Linux
# has. libgomp (OpenMP) is carried: small, and not guaranteed there.
is_skipped() {
  case "$1" in
    libcuda.so*|libcudart.so*|libcublas*|libnccl*|libcudnn*|libnvrtc*|libnvJitLink*|libnvidia-*) return 0 ;;
    libcufft*|libcurand*|libcusolver*|libcusparse*|libnvToolsExt*|libcupti*) return 0 ;;
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) return 0 ;;
    linux-vdso.so*) return 0 ;;
  esac
  return 1
}
declare -A carried=()
missing=0
for b in "$BUNDLE"/bin/* "$BUNDLE/lib/$MODULE"; do
  while read -r line; do
    name="$(awk '{print $1}' <<<"$line")"
    path="$(awk '$2=="=>"{print $3}' <<<"$line")"
    [[ -z "$name" ]] && continue
    if [[ "$line" == *"not found"* ]]; then
      is_skipped "$name" || { log "WARNING: $(basename "$b") needs $name: not found here"; missing=1; }
      continue
    fi
    is_skipped "$name" && continue
    [[ -n "$path" && -f "$path" ]] || continue
    carried["$name"]="$path"
  done < <(ldd "$b" 2>/dev/null)
done
[[ $missing == 0 ]] || die "some needed libraries are not found on this machine"
for name in "${!carried[@]}"; do
  cp -L "${carried[$name]}" "$BUNDLE/lib/$name"
  strip --strip-unneeded "$BUNDLE/lib/$name" 2>/dev/null || true
done
# Fallback only: libstdc++ built with our GCC, in case the device's is older
# (ldd then says "version `GLIBCXX_...' not found"); run.sh uses it only then.
mkdir -p "$BUNDLE/lib/fallback"
stdcxx="$(ldd "$BUNDLE/bin/dstrain" | awk '$1=="libstdc++.so.6"{print $3}')"
[[ -n "$stdcxx" ]] && xz -T0 -6 -c "$stdcxx" > "$BUNDLE/lib/fallback/libstdc++.so.6.xz"
# libopenblas.so.0 alone is ~35 MiB (DYNAMIC_ARCH: kernels for every CPU) and
# xz makes it ~4 MiB: carry every library over 1 MiB as NAME.xz; run.sh unpacks
# them (xz, else python3's lzma) into /tmp before anything runs.
for f in "$BUNDLE"/lib/*; do
  if [[ -f "$f" ]] && (( $(stat -c %s "$f") > 1048576 )); then
    xz -T0 -6 "$f"
  fi
done

# --- data for the dstrain smoke runs ----------------------------------------
DSPREP="$BUNDLE/bin/dsprep"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$DSPREP" --generate-corpus "$tmp/corpus.txt" --size-mb 0.5 --seed 1
"$DSPREP" --train-tokenizer --input "$tmp/corpus.txt" --vocab-size 512 --output-dir "$BUNDLE/data"
"$DSPREP" --input "$tmp/corpus.txt" --output-prefix "$BUNDLE/data/smoke" \
          --vocab-file "$BUNDLE/data/vocab.json" --merge-file "$BUNDLE/data/merges.txt"

cp "$ROOT/scripts/gpu_run.sh" "$BUNDLE/run.sh"
chmod +x "$BUNDLE/run.sh"
cp "$ROOT/scripts/gpu_bench.sh" "$BUNDLE/bench.sh"
mkdir -p "$BUNDLE/py"
cp "$ROOT/bench/train/torch_ref.py" "$ROOT/bench/train/bench_table.py" "$ROOT/bench/cuda/sdpa_ref.py" "$BUNDLE/py/"
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "build dir: $BUILD_DIR"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -n1)"
} > "$BUNDLE/BUILD_INFO.txt"

# --- report ----------------------------------------------------------------
log "carried libraries: ${!carried[*]}"
du -ah "$BUNDLE" | sort -k2
kb="$(du -sk "$BUNDLE" | cut -f1)"
log "gpu-bundle total: $((kb / 1024)) MiB (device limit: 64 MiB with the rest of the working tree)"
(( kb / 1024 <= MAX_MB )) || die "gpu-bundle is over ${MAX_MB} MiB"
xlib="$tmp/xlib"
mkdir -p "$xlib"
for f in "$BUNDLE"/lib/*.xz; do
  [[ -e "$f" ]] && xz -dc "$f" > "$xlib/$(basename "${f%.xz}")"
done
ldd_out="$(LD_LIBRARY_PATH="$BUNDLE/lib:$xlib:/usr/local/cuda/lib64:/usr/local/cuda/lib" ldd "$BUNDLE"/bin/* "$xlib/$MODULE" "$BUNDLE/lib/$MODULE" 2>&1 | grep -v "No such file" || true)"
if ! grep -q "not found" <<<"$ldd_out"; then
  log "ldd: every library resolves with gpu-bundle/lib + /usr/local/cuda"
else
  die "ldd still reports missing libraries"
fi
log "done. On the device: carry [\"gpu-bundle\"], command: bash gpu-bundle/run.sh (tests), bash gpu-bundle/bench.sh (benchmarks)"
