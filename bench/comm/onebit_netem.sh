#!/usr/bin/env bash
# Training speed over a slow network: four data-parallel ranks, each in its
# own network namespace behind a veth pair on one bridge (as the launcher
# tests build them), every host's link shaped on its egress with tc netem
# (RATE, default 1gbit, and DELAY, default 1ms), or, on a kernel without
# netem, with a token bucket (tbf: the rate alone; the script says which). AdamW's gradient
# all-reduce against the 1-bit optimizers' compressed exchange (each in its
# compressed phase from the second step: freeze_step / var_freeze_step 1).
# The model and data are onebit_traffic.sh's: 4 layers of hidden 256 on the
# GPT-2 vocabulary (16.5M parameters), fp32, ZeRO stage 0, micro-batch 1,
# sequence 128, tinyshakespeare. Each run trains 14 iterations, one thread
# per rank; the script reports the mean tokens/s of iterations 5-14 (after
# the freeze and the first exchanges) and the ratio to AdamW's.
#
# usage (root): bench/comm/onebit_netem.sh BUILD_DIR WORK_DIR [DATA_DIR]
#   RATE=100mbit DELAY=2ms bench/comm/onebit_netem.sh ...
set -euo pipefail
. "$(dirname "$0")/../shake_gpt2.sh" "$@"
RATE=${RATE:-1gbit}
DELAY=${DELAY:-1ms}
N=4
P=dsb$((RANDOM % 90000 + 10000))
cleanup() {
  for i in $(seq 0 $((N - 1))); do ip netns del "${P}h$i" 2> /dev/null || true; done
  ip netns del "${P}sw" 2> /dev/null || true
}
trap cleanup EXIT
ip netns add "${P}sw"
ip -n "${P}sw" link add br0 type bridge
ip -n "${P}sw" link set br0 up
for i in $(seq 0 $((N - 1))); do
  ip netns add "${P}h$i"
  ip link add "vh$i$P" netns "${P}h$i" type veth peer name "vb$i" netns "${P}sw"
  ip -n "${P}h$i" link set "vh$i$P" name eth0
  ip -n "${P}h$i" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "${P}h$i" link set eth0 up
  ip -n "${P}h$i" link set lo up
  ip -n "${P}sw" link set "vb$i" master br0
  ip -n "${P}sw" link set "vb$i" up
  if ! ip netns exec "${P}h$i" tc qdisc add dev eth0 root netem rate "$RATE" delay "$DELAY" 2> /dev/null; then
    ip netns exec "${P}h$i" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 100ms
    SHAPER="tbf rate $RATE (no netem in this kernel: no added delay)"
  fi
done
M=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
   --micro-batch-size 1 --global-batch-size 4 --lr 1e-3 --log-interval 1 --eval-interval 0 --train-iters 14
   --data-path "$W/shake" --vocab-file "$D/gpt2-vocab.json" --merge-file "$D/gpt2-merges.txt"
   --hidden-dropout 0 --attention-dropout 0)
config() {  # OPTIMIZER -> the DeepSpeed config
  case $1 in
    AdamW) echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' ;;
    OneBitAdam) echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 1}}}' ;;
    ZeroOneAdam) echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "ZeroOneAdam", "params": {"lr": 1e-3, "var_freeze_step": 1}}}' ;;
    OneBitLamb) echo '{"zero_optimization": {"stage": 0}, "optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 1}}}' ;;
  esac
}
echo "network: $N namespaces on one bridge, ${SHAPER:-netem rate $RATE delay $DELAY} on each host's egress"
printf "%-12s %12s %8s\n" optimizer tokens/s ratio
for opt in AdamW OneBitAdam ZeroOneAdam OneBitLamb; do
  config "$opt" > "$W/netem_$opt.json"
  port=$((20000 + RANDOM % 20000))
  pids=()
  for i in $(seq 0 $((N - 1))); do
    ip netns exec "${P}h$i" env RANK="$i" WORLD_SIZE=$N LOCAL_RANK=0 LOCAL_SIZE=1 MASTER_ADDR=10.77.0.1 \
      MASTER_PORT="$port" OMP_NUM_THREADS=1 "$B/apps/dstrain/dstrain" --config "$W/netem_$opt.json" "${M[@]}" \
      > "$W/netem_${opt}_$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  tps=$(grep -oE "iteration +[0-9]+/ +14 .*tokens/s: [0-9]+" "$W/netem_${opt}_0.log" |
    awk '{ it = $3; sub("/", "", it); if (it + 0 >= 5) { n++; s += $NF } } END { printf "%.0f", s / n }')
  [ "$opt" = AdamW ] && base=$tps
  printf "%-12s %12s %8s\n" "$opt" "$tps" "$(awk -v a="$tps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
done
