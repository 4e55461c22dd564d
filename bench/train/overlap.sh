#!/usr/bin/env bash
# Data-parallel step time with the gradient reduction overlapped with the
# backward (overlap_comm) or not, on the CPU backend (Gloo over loopback):
# 2 ranks, DP 2, ZeRO stage ${STAGE:-2}, against one process doing the same
# work (the same global batch as 2 micro-batches, ZeRO 0, all threads).
# Prints the median ms per iteration of iterations 3..N of each run.
#   BUILD_DIR=build [STAGE=2] [ITERS=12] [ROUNDS=1] [SKIP_SINGLE=1] bash bench/train/overlap.sh [extra dstrain flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
OUT=${OUT:-$(mktemp -d /tmp/ds_overlap_bench.XXXXXX)}
STAGE=${STAGE:-2}
ITERS=${ITERS:-12}
CORES=$(nproc)
DSPREP="$BUILD/apps/dsprep/dsprep"
DSTRAIN="$BUILD/apps/dstrain/dstrain"
DSRUN="$BUILD/apps/dsrun/dsrun"

if [[ ! -f "$OUT/data/c.idx" ]]; then
  "$DSPREP" --generate-corpus "$OUT/corpus.txt" --size-mb 2 --seed 1 >/dev/null 2>&1
  "$DSPREP" --train-tokenizer --input "$OUT/corpus.txt" --vocab-size 1024 --output-dir "$OUT/tok" >/dev/null 2>&1
  "$DSPREP" --input "$OUT/corpus.txt" --output-prefix "$OUT/data/c" --vocab-file "$OUT/tok/vocab.json" \
    --merge-file "$OUT/tok/merges.txt" >/dev/null 2>&1
fi

# 8 layers, hidden 512: 25.7M parameters, 103 MB of f32 gradients per step
# to reduce; micro-batch 1 x 128 tokens keeps the compute per step short
# enough that communication is visible.
MODEL=(--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 128 --max-position-embeddings 128
       --train-iters "$ITERS" --lr 1e-4 --log-interval 1 --eval-interval 100000 --eval-iters 1
       --data-path "$OUT/data/c" --vocab-file "$OUT/tok/vocab.json" --merge-file "$OUT/tok/merges.txt")

config() {  # name stage overlap micro global
  cat >"$OUT/$1.json" <<JSON
{"train_batch_size": $5, "train_micro_batch_size_per_gpu": $4,
 "zero_optimization": {"stage": $2, "overlap_comm": $3, "reduce_bucket_size": 5000000,
                       "allgather_bucket_size": 50000000}}
JSON
}

median_ms() {  # log file -> median ms/iteration of iterations 3..
  grep -o 'elapsed time per iteration (ms): [0-9.]*' "$1" | awk '{print $NF}' | tail -n +3 | sort -n |
    awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

run_dp2() {  # name overlap [extra dstrain flags]
  local name=$1 overlap=$2
  shift 2
  config "$name" "$STAGE" "$overlap" 1 2
  OMP_NUM_THREADS=$((CORES / 2 > 0 ? CORES / 2 : 1)) "$DSRUN" --include localhost:0,1 --no_local_rank \
    "$DSTRAIN" --config "$OUT/$name.json" "${MODEL[@]}" "$@" >"$OUT/$name.log" 2>&1 || { cat "$OUT/$name.log"; exit 1; }
}

# ROUNDS > 1 alternates the off/on runs (a drifting machine load then biases
# neither) and prints every round.
ROUNDS=${ROUNDS:-1}
shift_args=("$@")
echo "cores: $CORES, load average at start: $(cut -d' ' -f1-3 /proc/loadavg), ZeRO stage $STAGE, logs in $OUT"
printf '%-50s %10s\n' "run" "ms/iter"
for ((r = 1; r <= ROUNDS; ++r)); do
  run_dp2 "dp2_overlap_off_$r" false "${shift_args[@]}"
  run_dp2 "dp2_overlap_on_$r" true "${shift_args[@]}"
  printf '%-50s %10s\n' "round $r: DP2 (2 x $((CORES / 2)) threads), overlap_comm off" "$(median_ms "$OUT/dp2_overlap_off_$r.log")"
  printf '%-50s %10s\n' "round $r: DP2 (2 x $((CORES / 2)) threads), overlap_comm on" "$(median_ms "$OUT/dp2_overlap_on_$r.log")"
done
if [[ -z "${SKIP_SINGLE:-}" ]]; then
  config single 0 false 1 2
  OMP_NUM_THREADS=$CORES "$DSTRAIN" --config "$OUT/single.json" "${MODEL[@]}" "${shift_args[@]}" >"$OUT/single.log" 2>&1 ||
    { cat "$OUT/single.log"; exit 1; }
  printf '%-50s %10s\n' "1 process ($CORES threads), 2 micro-batches" "$(median_ms "$OUT/single.log")"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
