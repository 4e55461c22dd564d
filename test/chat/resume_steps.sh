#!/usr/bin/env bash
# dschat's resumable checkpoint (--checkpoint_dir): a run stopped by SIGTERM
# (a scheduler's preemption notice) ends after the epoch (step 3: the PPO
# round) it was in with a checkpoint, and the same command run again
# continues from it: every later optimizer step's loss, every later
# evaluation or round and the exported models are those of the same run
# left uninterrupted, bit for bit. Step 1 runs as one process, steps 2 and 3
# as two under ZeRO-2 through dsrun (its SIGTERM reaches both ranks; they
# agree on where to stop); step 3 with gradient accumulation groups open
# across rounds, the unsupervised term and EMA. Only the newest checkpoint
# is kept. A tiny GPT-2 exported by dstrain, synthetic pairs; no
# Python and no shared data.
#   resume_steps.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
setup_run "$1" dschat_resume
DSCHAT="$1/apps/dschat/dschat"
[[ -x $DSCHAT ]] || fail "missing binary $DSCHAT"

MODEL="$WORK/base"
cat > "$WORK/base.json" <<EOT
{"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
 "model": {"family": "gpt2", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64,
           "max_position_embeddings": 128, "make_vocab_size_divisible_by": 1},
 "data": {"data_path": "${DATA}/corpus", "vocab_file": "${TOK}/vocab.json", "merge_file": "${TOK}/merges.txt"},
 "training": {"train_iters": 0, "export_hf": "$MODEL"}}
EOT
"$DSTRAIN" --config "$WORK/base.json" > "$WORK/base.log" 2>&1 || fail "exporting the base model failed" "$WORK/base.log"

APP="$WORK/DeepSpeed-Chat"
mkdir -p "$APP/data" "$APP/training/step"
awk -v seed=3 -v app="$APP" 'BEGIN {
  srand(seed)
  split("good kind helpful clear friendly", pos, " ")
  split("bad rude useless vague cold", neg, " ")
  for (s = 0; s < 2; s++) {
    n = s == 0 ? 2000 : 100
    for (i = 0; i < n; i++)
      printf "{\"prompt\": \"Human: how was day %d? Assistant:\", \"chosen\": \"It was %s.\", \"rejected\": \"It was %s.\"}\n", \
        i, pos[int(rand() * 5) + 1], neg[int(rand() * 5) + 1] > (app "/data/" (s == 0 ? "train.json" : "eval.json"))
  }
}'
cd "$APP/training/step"

# run LOG CMD...: the command in the background; SIGTERM to it once LOG shows epoch 1 beginning.
run_stopped() {
  local log="$1"
  shift
  "$@" > "$log" 2>&1 &
  local pid=$!
  for ((i = 0; i < 2000; i++)); do
    grep -q 'Beginning of Epoch 1/4' "$log" && break
    sleep 0.02
  done
  kill -TERM "$pid"
  wait "$pid" || true
}

# check STEP LOG_FULL LOG_STOPPED LOG_RESUMED OUT_FULL OUT_RESUMED CKPT FILE
check() {
  local step="$1" full="$2" stopped="$3" resumed="$4" out_full="$5" out_resumed="$6" ckpt="$7" file="$8"
  local at
  at=$(grep -oE 'SIGTERM: stopping after epoch [0-9]+' "$stopped" | awk '{print $NF}') ||
    fail "$step: the run did not stop on SIGTERM" "$stopped"
  [[ $at -ge 1 && $at -lt 4 ]] || fail "$step: stopped after epoch $at" "$stopped"
  grep -q "resuming from --checkpoint_dir .*: $at epoch(s) done" "$resumed" || fail "$step: no resume line" "$resumed"
  # Everything the full run printed after epoch $at began, the resumed run prints the same.
  local want got
  want=$(sed -n "/Beginning of Epoch $((at + 1))\/4/,\$p" "$full" | grep -E "$9")
  got=$(sed -n "/Beginning of Epoch $((at + 1))\/4/,\$p" "$resumed" | grep -E "$9")
  [[ -n $want && $want == "$got" ]] || { diff <(echo "$want") <(echo "$got") || true; fail "$step: the resumed run differs" "$resumed"; }
  cmp "$out_full/$file" "$out_resumed/$file" || fail "$step: the exported models differ" "$resumed"
  local kept
  kept=$(ls "$ckpt/model" | grep -c '^global_step' || true)
  [[ $kept == 1 ]] || fail "$step: $kept checkpoints kept in $ckpt/model" "$resumed"
  echo "$step: stopped after epoch $at of 4, resumed: $(echo "$got" | wc -l) lines and $file identical"
}

SFT=("$DSCHAT" sft --data_path local/jsonfile --data_split 2,4,4 --model_name_or_path "$MODEL"
     --per_device_train_batch_size 4 --per_device_eval_batch_size 8 --max_seq_len 32 --learning_rate 1e-3
     --gradient_accumulation_steps 2 --num_train_epochs 4 --num_warmup_steps 2 --dtype fp32 --print_loss)
"${SFT[@]}" --checkpoint_dir "$WORK/ck1" --output_dir "$WORK/sft_full" > "$WORK/sft_full.log" 2>&1 ||
  fail "step 1 failed" "$WORK/sft_full.log"
run_stopped "$WORK/sft_a.log" "${SFT[@]}" --checkpoint_dir "$WORK/ck2" --output_dir "$WORK/sft_res"
"${SFT[@]}" --checkpoint_dir "$WORK/ck2" --output_dir "$WORK/sft_res" > "$WORK/sft_b.log" 2>&1 ||
  fail "step 1's resumed run failed" "$WORK/sft_b.log"
check "step 1" "$WORK/sft_full.log" "$WORK/sft_a.log" "$WORK/sft_b.log" "$WORK/sft_full" "$WORK/sft_res" "$WORK/ck2" \
  model.safetensors '^(Epoch: |ppl: )'

RM=("$DSRUN" --num_gpus 2 --master_port 29615 --teardown_grace 120 "$DSCHAT" reward --data_path local/jsonfile
    --data_split 2,4,4 --model_name_or_path "$MODEL" --num_padding_at_beginning 0 --per_device_train_batch_size 4
    --per_device_eval_batch_size 8 --max_seq_len 32 --learning_rate 1e-3 --num_train_epochs 4 --eval_interval 3
    --dtype fp32 --zero_stage 2)
"${RM[@]}" --checkpoint_dir "$WORK/ck3" --output_dir "$WORK/rm_full" > "$WORK/rm_full.log" 2>&1 ||
  fail "step 2 failed" "$WORK/rm_full.log"
run_stopped "$WORK/rm_a.log" "${RM[@]}" --checkpoint_dir "$WORK/ck4" --output_dir "$WORK/rm_res"
"${RM[@]}" --checkpoint_dir "$WORK/ck4" --output_dir "$WORK/rm_res" > "$WORK/rm_b.log" 2>&1 ||
  fail "step 2's resumed run failed" "$WORK/rm_b.log"
check "step 2" "$WORK/rm_full.log" "$WORK/rm_a.log" "$WORK/rm_b.log" "$WORK/rm_full" "$WORK/rm_res" "$WORK/ck4" \
  pytorch_model.bin '(Epoch [0-9]+/4 with loss|_scores|c_scores)'

# Step 3 on two ranks: gradient accumulation 3 (groups open across rounds), the unsupervised term, EMA.
mkdir -p "$WORK/unsup"
awk 'BEGIN { srand(5); for (i = 0; i < 300; i++) print "the river was " (rand() < 0.5 ? "good" : "quiet") " today" }' \
  > "$WORK/unsup/train.txt"
PPO=("$DSRUN" --num_gpus 2 --master_port 29615 --teardown_grace 120 "$DSCHAT" ppo --data_path local/jsonfile
     --data_split 9,9,2 --actor_model_name_or_path "$MODEL" --critic_model_name_or_path "$MODEL"
     --per_device_generation_batch_size 4 --per_device_training_batch_size 2 --generation_batches 1 --ppo_epochs 2
     --max_prompt_seq_len 32 --max_answer_seq_len 8 --actor_learning_rate 1e-4 --critic_learning_rate 1e-4
     --num_train_epochs 1 --gradient_accumulation_steps 3 --dtype fp32 --enable_ema --seed 7
     --actor_zero_stage 2 --critic_zero_stage 2 --unsupervised_dataset_name "$WORK/unsup"
     --unsupervised_dataset_config_name default --unsup_coef 0.5)
"${PPO[@]}" --checkpoint_dir "$WORK/ck5" --output_dir "$WORK/ppo_full" > "$WORK/ppo_full.log" 2>&1 ||
  fail "step 3 failed" "$WORK/ppo_full.log"
# SIGTERM once the first round has printed: the run stops at the end of that round or a later one.
"${PPO[@]}" --checkpoint_dir "$WORK/ck6" --output_dir "$WORK/ppo_res" > "$WORK/ppo_a.log" 2>&1 &
pid=$!
for ((i = 0; i < 3000; i++)); do
  grep -q 'Average reward score' "$WORK/ppo_a.log" && break
  sleep 0.02
done
kill -TERM "$pid"
wait "$pid" || true
stopped=$(grep -oE 'SIGTERM: stopping after the PPO round of epoch 0 step [0-9]+' "$WORK/ppo_a.log" | awk '{print $NF}') ||
  fail "step 3: the run did not stop on SIGTERM" "$WORK/ppo_a.log"
"${PPO[@]}" --checkpoint_dir "$WORK/ck6" --output_dir "$WORK/ppo_res" > "$WORK/ppo_b.log" 2>&1 ||
  fail "step 3's resumed run failed" "$WORK/ppo_b.log"
grep -q "resuming from --checkpoint_dir .*: after epoch 0 step $stopped" "$WORK/ppo_b.log" ||
  fail "step 3: no resume line" "$WORK/ppo_b.log"
rounds() { grep -E '(Epoch: [0-9]+ \| Step: |Average reward score)' "$1"; }
want=$(rounds "$WORK/ppo_full.log" | sed -n "/Epoch: 0 | Step: $stopped |/,\$p" | tail -n +3)
got=$(rounds "$WORK/ppo_b.log")
[[ -n $want && $want == "$got" ]] || { diff <(echo "$want") <(echo "$got") || true; fail "step 3: the resumed run differs" "$WORK/ppo_b.log"; }
for m in actor/model.safetensors critic/pytorch_model.bin actor_ema/model.safetensors; do
  cmp "$WORK/ppo_full/$m" "$WORK/ppo_res/$m" || fail "step 3: the exported $m differs" "$WORK/ppo_b.log"
done
ls "$WORK/ck6"/dschat_state_rank0.json "$WORK/ck6"/dschat_state_rank1.json > /dev/null || fail "step 3: no per-rank records" "$WORK/ppo_b.log"
echo "step 3: stopped after the round of step $stopped, resumed: $(echo "$got" | wc -l) lines and the exports identical"

# A checkpoint of the other step is refused with one line.
if "${SFT[@]}" --checkpoint_dir "$WORK/ck3" > "$WORK/wrong.log" 2>&1; then fail "step 1 took step 2's checkpoint" "$WORK/wrong.log"; fi
grep -q "records a checkpoint of dschat reward, not of dschat sft" "$WORK/wrong.log" || fail "no clear refusal" "$WORK/wrong.log"
echo "dschat resumes steps 1, 2 and 3 from --checkpoint_dir as the uninterrupted runs"
