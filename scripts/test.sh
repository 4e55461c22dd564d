#!/usr/bin/env bash
# The README's test command: install dependencies, build from scratch in build/,
# run the whole test suite (cpu + multiproc labels; gpu tests skip without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$(nproc)"
cd "$BUILD"
ctest --output-on-failure -j"${CTEST_JOBS:-2}" "$@"
