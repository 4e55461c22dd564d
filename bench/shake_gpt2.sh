# Sourced by the benchmarks that train on tinyshakespeare with the GPT-2
# vocabulary: `. "$(dirname "$0")/../shake_gpt2.sh" "$@"` with the script's
# arguments BUILD_DIR WORK_DIR [DATA_DIR ...]. Sets B (the build, absolute),
# W (the work directory, made, absolute) and D (the data directory: DATA_DIR
# or ../shared/data beside the repository), and writes W/shake.bin/.idx once.
B=$(realpath "$1")
W=$2
D=${3:-$(dirname "${BASH_SOURCE[0]}")/../../shared/data}
D=$(realpath "$D")
mkdir -p "$W"
W=$(realpath "$W")
[ -f "$W/shake.bin" ] || "$B/apps/dsprep/dsprep" --input "$D/tinyshakespeare.txt" --output-prefix "$W/shake" \
  --vocab-file "$D/gpt2-vocab.json" --merge-file "$D/gpt2-merges.txt" > /dev/null
