#!/usr/bin/env bash
# Megatron-DeepSpeed's examples_deepspeed/generate_text.sh run through dsrun +
# dsgen. Its variables and program options are kept as the script has them;
# only the launcher line (deepspeed tools/generate_samples_gpt.py -> dsrun
# dsgen), the model size (L, H, A, positions and sequence 64), the output
# length and the paths differ. The checkpoint it loads is trained here by
# dstrain with the same model flags.
#   generate_text.sh BUILD_DIR
# Checks: the script's interactive mode (--num-samples 0) answers a prompt from
# stdin with Megatron's Context / Megatron-LM lines and ends at "stop"; the
# same options with --num-samples 5 write five JSON lines to --genfile, each
# sample running to the end-of-document token or for out-seq-length + 1
# tokens, as generate_samples_gpt.py's loop does; the same seed gives the same
# samples at another micro-batch size; a model flag that disagrees with the
# checkpoint is one error line.
set -euo pipefail
source "$(dirname "$0")/script_util.sh"
setup_run "$1" generate_text
DSGEN="$1/apps/dsgen/dsgen"
[[ -x "$DSGEN" ]] || fail "missing binary $DSGEN"
cd "$WORK"

export TORCH_CUDA_ARCH_LIST=8.6+PTX
CHECKPOINT_PATH=${WORK}/checkpoints/gpt2_345m
VOCAB_FILE=${TOK}/vocab.json
MERGE_FILE=${TOK}/merges.txt
b=8
mp=1
experts=1
nodes=1
gpus=1

use_tutel=""
ds_inference=""

export CUDA_DEVICE_MAX_CONNECTIONS=1

L=2
H=64
A=4
train_log="${WORK}/train.log"
"$DSTRAIN" --num-layers $L --hidden-size $H --num-attention-heads $A --max-position-embeddings 64 --seq-length 64 \
  --micro-batch-size 8 --global-batch-size 8 --train-iters 40 --lr 3e-3 --log-interval 10 --eval-interval 1000 \
  --eval-iters 1 --data-path "${DATA}/corpus" --vocab-file "$VOCAB_FILE" --merge-file "$MERGE_FILE" \
  --save "$CHECKPOINT_PATH" --save-interval 40 > "$train_log" 2>&1 || fail "training the checkpoint failed" "$train_log"

launch_cmd="${DSRUN} --num_nodes $nodes --num_gpus $gpus"
program_cmd="${DSGEN} \
       --tensor-model-parallel-size $mp \
       --num-layers $L \
       --hidden-size $H \
       --num-attention-heads $A \
       --max-position-embeddings 64 \
       --tokenizer-type GPT2BPETokenizer \
       --fp16 \
       --num-experts ${experts} \
       --mlp-type standard \
       --micro-batch-size $b \
       --seq-length 64 \
       --out-seq-length 24 \
       --temperature 1.0 \
       --vocab-file $VOCAB_FILE \
       --merge-file $MERGE_FILE \
       --genfile unconditional_samples.json \
       --top_p 0.9 \
       --log-interval 1 \
       --num-samples 0 \
       --load $CHECKPOINT_PATH \
       $use_tutel $ds_inference"

echo $launch_cmd $program_cmd
log="${WORK}/interactive.log"
printf 'Once upon a time\n\nstop\n' | $launch_cmd $program_cmd > "$log" 2>&1 || fail "the interactive run exited $?" "$log"
grep -q "Context prompt (stop to exit) >>>" "$log" || fail "no context prompt" "$log"
grep -q "Context: Once upon a time" "$log" || fail "no Context line" "$log"
grep -qE "Megatron-LM: .+" "$log" || fail "no generated text" "$log"
[[ $(grep -c "Context prompt (stop to exit) >>>" "$log") == 2 ]] || fail "expected two prompts (the text, then stop)" "$log"

# The unconditional mode: the same options with N samples.
ulog="${WORK}/unconditional.log"
$launch_cmd ${program_cmd/--num-samples 0/--num-samples 5} > "$ulog" 2>&1 || fail "the unconditional run exited $?" "$ulog"
[[ $(wc -l < unconditional_samples.json) == 5 ]] || fail "expected 5 samples in --genfile" "$ulog"
python3 - unconditional_samples.json <<'PY' || fail "the samples do not follow generate_samples_gpt.py's length rule" "$ulog"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    assert set(r) == {"text", "length", "finished"}, r
    # out-seq-length 24 from the one-token context: positions 1 .. 25, unless the end-of-document came first.
    assert (r["length"] < 25 and r["finished"]) or (r["length"] == 25 and not r["finished"]), r
assert len({r["text"] for r in rows}) > 1, "every sample is the same"
PY
cp unconditional_samples.json by8.json
program_b2="${program_cmd/--micro-batch-size $b/--micro-batch-size 2}"
$launch_cmd ${program_b2/--num-samples 0/--num-samples 5} > "$ulog" 2>&1 || fail "micro-batch 2 exited" "$ulog"
cmp -s by8.json unconditional_samples.json || fail "micro-batch 2 gives other samples than micro-batch 8" "$ulog"

# A model flag that disagrees with the checkpoint.
elog="${WORK}/mismatch.log"
if $launch_cmd ${program_cmd/--num-layers $L/--num-layers 24} < /dev/null > "$elog" 2>&1; then
  fail "a --num-layers that disagrees with the checkpoint was accepted" "$elog"
fi
grep -q "num-layers 24 disagrees with the model read (its num_layers is 2)" "$elog" || fail "no clear error line" "$elog"
echo "PASS: generate_text.sh: interactive Context / Megatron-LM answer, 5 unconditional samples by Megatron's length rule, batch-independent, shape checked"
