#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/CMakeLists.txt: clang, libFuzzer, ASan+UBSan)
# and runs each for a bounded time from its seed corpus in fuzz/corpus/<target>.
# Exit 0: no crash; 1: a target crashed (its input is saved and printed);
# 77: clang or libFuzzer is missing here (ctest counts it as skipped).
#   fuzz/run_fuzz.sh [BUILD_DIR]            CI: FUZZ_SECONDS (default 3) per target
#   FUZZ_SECONDS=600 FUZZ_TARGETS="bpe idx" fuzz/run_fuzz.sh build-fuzz   a longer campaign
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build-fuzz}"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-3}"
TARGETS="${FUZZ_TARGETS:-hostfile resources config idx npy safetensors state_json torch_file hf_config bpe hf_tokenizer sp_model csv tfevents prompts chat}"
CXX="${FUZZ_CXX:-$(command -v clang++ || true)}"

if [[ -z "$CXX" ]]; then
  echo "SKIP: clang++ not found (install clang and libclang-rt-dev; scripts/setup.sh does)"
  exit 77
fi
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe/p.cpp"
if ! "$CXX" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
  echo "SKIP: $CXX cannot link libFuzzer with ASan/UBSan here: $(head -1 "$probe/err")"
  exit 77
fi

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT/fuzz" -B "$BUILD" "${gen[@]}" -DCMAKE_CXX_COMPILER="$CXX" >"$probe/cmake.log" 2>&1 ||
    { cat "$probe/cmake.log"; echo "fuzz: configuring failed"; exit 1; }
fi
cmake --build "$BUILD" -j"${FUZZ_JOBS:-2}" >"$probe/build.log" 2>&1 ||
  { tail -40 "$probe/build.log"; echo "fuzz: build failed"; exit 1; }

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
for t in $TARGETS; do
  work="$BUILD/work/$t"   # new inputs go here, never into the repository's seed corpus
  mkdir -p "$work"
  log="$BUILD/work/$t.log"
  "$BUILD/fuzz_$t" "$work" "$ROOT/fuzz/corpus/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
    -rss_limit_mb=2048 -max_len=8192 -artifact_prefix="$BUILD/work/$t-" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "fuzz_$t: CRASH (exit $rc); log $log"
    grep -E "ERROR|runtime error|uncaught|SUMMARY|Test unit written" "$log" | head -20
  else
    echo "fuzz_$t: ok, ${runs:-?} inputs in ${SECONDS_PER_TARGET}s"
  fi
done
exit $status
