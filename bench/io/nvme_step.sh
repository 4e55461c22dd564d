#!/usr/bin/env bash
# Step time and peak RSS of ZeRO-3 with the optimizer state (and the
# parameters) on NVMe against the same run in memory (CPU backend, one rank):
# a 16-layer GPT of hidden 768 on the GPT-2 vocabulary (0.15B parameters,
# fp32; ZeRO-3 prefetch of 1e7 and at most 3e7 live gathered parameters, so
# that the working set is a few layers), 5 iterations per run, the runs interleaved twice (this VM's disk and
# memory speeds drift; only runs next to each other compare). NVMe runs use
# sub-groups of 5e6 elements (20 MB per state): the optimizer state and the
# gradient shard with pipeline_read/pipeline_write and buffer_count 6 (two
# sets of three), the same read and written in turn, and the parameters too
# (offload_param nvme, buffer_count 8: two sets of four). Prints, per run, the mean ms per iteration of
# iterations 2-5, the peak RSS and the final loss (the same bits in every run).
#
# usage: bench/io/nvme_step.sh BUILD_DIR WORK_DIR [DATA_DIR] [NVME_DIR]
# DATA_DIR holds tinyshakespeare.txt, gpt2-vocab.json, gpt2-merges.txt
# (default: ../shared/data beside the repository); NVME_DIR (default
# WORK_DIR/swap) must be on a file system with O_DIRECT.
set -euo pipefail
. "$(dirname "$0")/../shake_gpt2.sh" "$@"
S=${4:-$W/swap}
mkdir -p "$S"
M=(--num-layers 16 --hidden-size 768 --num-attention-heads 12 --seq-length 256 --max-position-embeddings 256
   --micro-batch-size 1 --global-batch-size 1 --lr 1e-4 --log-interval 1 --eval-interval 0 --train-iters 5
   --data-path "$W/shake" --vocab-file "$D/gpt2-vocab.json" --merge-file "$D/gpt2-merges.txt"
   --hidden-dropout 0 --attention-dropout 0)
config() {  # NAME OFFLOAD_JSON
  echo "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 5000000, \"stage3_prefetch_bucket_size\": 10000000," \
       "\"stage3_max_live_parameters\": 30000000$2}," \
       "\"csv_monitor\": {\"enabled\": true, \"output_path\": \"$W/csv\", \"job_name\": \"$1\"}}" > "$W/$1.json"
}
config mem ""
config nvme_pipelined ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$S\", \"buffer_count\": 6, \"pipeline_read\": true, \"pipeline_write\": true}"
config nvme_in_turn ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$S\", \"buffer_count\": 6}"
config nvme_params ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$S\", \"buffer_count\": 8, \"pipeline_read\": true, \"pipeline_write\": true}, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$S\"}"
for round in 1 2; do
  for run in mem nvme_pipelined nvme_in_turn nvme_params; do
    rm -rf "$W/csv/$run"
    /usr/bin/time -f "peak RSS %M KB" "$B/apps/dstrain/dstrain" --config "$W/$run.json" "${M[@]}" > "$W/$run.log" 2>&1
    ms=$(awk -F, 'NR > 2 { s += $7; n++ } END { printf "%.0f", s / n }' "$W/csv/$run/train.csv")
    rss=$(grep -oE "peak RSS [0-9]+" "$W/$run.log" | awk '{printf "%.2f", $3 * 1024 / 1e9}')
    loss=$(awk -F, 'END { print $4 }' "$W/csv/$run/train.csv")
    printf "round %d %-15s %6s ms/iter  peak RSS %5s GB  final loss %s\n" "$round" "$run" "$ms" "$rss" "$loss"
  done
done
grep -hE "model state:" "$W/mem.log" "$W/nvme_pipelined.log" "$W/nvme_params.log" | cut -c1-200
for run in mem nvme_pipelined nvme_params; do  # --estimate-memory's configured row (host per rank, GiB)
  "$B/apps/dstrain/dstrain" --config "$W/$run.json" "${M[@]}" --estimate-memory | grep -E "^\* ZeRO"
done
