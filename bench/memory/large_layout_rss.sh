#!/usr/bin/env bash
# Peak resident memory per rank of a model no rank could build whole on this
# machine (issue: no rank holds more than its shard): a 0.76B-parameter GPT
# (24 layers, hidden 1536, GPT-2 vocabulary, fp32) trained 2 iterations at
# TP4 x PP2 on 8 local ranks with a save, resumed into TP2 x PP4 (both splits
# change: the load reads each rank's ranges out of other ranks' files) for 2
# more iterations with a Hugging Face export. (TP2 x PP2 x DP2 holds twice the
# weights per rank and needs about 23 GiB for 8 ranks, --estimate-memory's
# figure: more than this 24 GB machine has.) A rank that built the
# full model (f32 weights and gradients, 6.1 GB) would need 48 GB for 8 ranks.
# 8 ranks share this machine's 2 cores: a step takes about 40 s, so the heartbeat
# timeout is raised. Prints each rank's model-state line and peak RSS next to --estimate-memory.
#
# usage: bench/memory/large_layout_rss.sh BUILD_DIR WORK_DIR [DATA_DIR]
# DATA_DIR holds tinyshakespeare.txt, gpt2-vocab.json, gpt2-merges.txt
# (default: ../shared/data beside the repository).
set -euo pipefail
. "$(dirname "$0")/../shake_gpt2.sh" "$@"
rm -rf "$W/ck" "$W/hf"
M=(--num-layers 24 --hidden-size 1536 --num-attention-heads 16 --seq-length 256 --max-position-embeddings 256
   --micro-batch-size 1 --global-batch-size 2 --lr 1e-4 --log-interval 1 --eval-interval 0
   --data-path "$W/shake" --vocab-file "$D/gpt2-vocab.json" --merge-file "$D/gpt2-merges.txt"
   --hidden-dropout 0 --attention-dropout 0)
estimate() {  # the configured row of --estimate-memory at world 8
  WORLD_SIZE=8 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$B/apps/dstrain/dstrain" "${M[@]}" "$@" --estimate-memory |
    grep -E "^\* |parameters"
}
# Each rank under /usr/bin/time: its peak RSS whatever it logs (dstrain's own
# log lines, model state included, come from rank 0 only).
cat > "$W/rank.sh" <<EOS
#!/usr/bin/env bash
exec /usr/bin/time -f "rank \$RANK peak RSS %M KB" "$B/apps/dstrain/dstrain" "\$@"
EOS
chmod +x "$W/rank.sh"
report() {  # LOG: rank 0's model state line, every rank's peak RSS
  grep -hoE "model state: [0-9]+ bytes per rank" "$1" | head -1
  grep -hoE "rank [0-9]+ peak RSS [0-9]+ KB" "$1" | sort -V | awk '{printf "%s %s: %.2f GB\n", $1, $2, $5 * 1024 / 1e9}'
}
echo "== TP4 x PP2, ZeRO 0: 2 iterations, save"
estimate --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
/usr/bin/time -f "wall %e s" "$B/apps/dsrun/dsrun" --num_gpus 8 --no_local_rank --heartbeat_timeout 600 "$W/rank.sh" "${M[@]}" \
  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --train-iters 2 --save "$W/ck" > "$W/run1.log" 2>&1
report "$W/run1.log"; grep -E "iteration +2/|wall" "$W/run1.log" | tail -2
du -sh "$W/ck"
echo "== TP2 x PP4: load with reshape, 2 iterations, export"
estimate --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
/usr/bin/time -f "wall %e s" "$B/apps/dsrun/dsrun" --num_gpus 8 --no_local_rank --heartbeat_timeout 600 "$W/rank.sh" "${M[@]}" \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --train-iters 4 --override-opt_param-scheduler --load "$W/ck" \
  --export-hf "$W/hf" > "$W/run2.log" 2>&1
report "$W/run2.log"; grep -E "iteration +4/|wall|exported" "$W/run2.log" | tail -3
