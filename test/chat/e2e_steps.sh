#!/usr/bin/env bash
# DeepSpeed-Chat's steps end to end on synthetic preference data with a
# planted preference, on the CPU in about a minute: a tiny GPT-2 exported by
# dstrain (its initial weights, the generated corpus's BPE vocabulary), step 1
# (dschat sft) on the prompt + chosen texts, then step 2 (dschat reward) from
# step 1's output on two processes, then step 3. Every chosen answer praises
# ("good", "kind", ...), every rejected one complains ("bad", "rude", ...),
# each in random words around them. Checks: the reward model's accuracy on the
# held-out pairs is at chance before training (0.3..0.7) and at least 0.9
# after, and its chosen - rejected score difference grows; step 2's output is
# RewardModel's pytorch_model.bin beside config.json. Then step 3 (dschat ppo)
# with the step-1 actor and the step-2 critic on two processes: its mean
# reward per 10 rounds rises by more than 1 (a tiny model gets there by reward
# hacking: the reward model's favourite fragments repeated), and dsplot
# draws the reward and the losses from step 3's TensorBoard file.
#   e2e_steps.sh BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/../scripts/script_util.sh"
setup_run "$1" dschat_e2e
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

# The data: data/train.json and data/eval.json two levels above the steps' folders.
APP="$WORK/DeepSpeed-Chat"
mkdir -p "$APP/data" "$APP/training/step1_supervised_finetuning" "$APP/training/step2_reward_model_finetuning"
awk -v seed=7 -v app="$APP" 'BEGIN {
  srand(seed)
  split("good kind helpful clear friendly warm honest", pos, " ")
  split("bad rude useless vague cold harsh wrong", neg, " ")
  split("the day the town the river the road the story the meal the song the garden", topic, " ")
  split("very quite so truly rather", adv, " ")
  for (s = 0; s < 2; s++) {
    file = s == 0 ? "train.json" : "eval.json"
    n = s == 0 ? 1000 : 150
    for (i = 0; i < n; i++) {
      t = topic[int(rand() * 8) * 2 + 1] " " topic[int(rand() * 8) * 2 + 2]
      a = adv[int(rand() * 5) + 1]
      printf "{\"prompt\": \"Human: how was %s? Assistant:\", \"chosen\": \"It was %s %s, %s %s.\", \"rejected\": \"It was %s %s, %s %s.\"}\n", \
        t, a, pos[int(rand() * 7) + 1], a, pos[int(rand() * 7) + 1], a, neg[int(rand() * 7) + 1], a, neg[int(rand() * 7) + 1] > (app "/data/" file)
    }
  }
}'

cd "$APP/training/step1_supervised_finetuning"
mkdir -p output
"$DSRUN" --master_port 29613 "$DSCHAT" sft --data_path local/jsonfile --data_split 2,4,4 --model_name_or_path "$MODEL" \
  --per_device_train_batch_size 8 --per_device_eval_batch_size 8 --max_seq_len 64 --learning_rate 1e-3 \
  --num_train_epochs 2 --dtype fp32 --output_dir output > output/training.log 2>&1 ||
  fail "step 1 failed" output/training.log
STEP1="$PWD/output"

cd "$APP/training/step2_reward_model_finetuning"
mkdir -p output
"$DSRUN" --num_gpus 2 --master_port 29613 "$DSCHAT" reward --data_path local/jsonfile --data_split 2,4,4 --model_name_or_path "$STEP1" \
  --num_padding_at_beginning 0 --per_device_train_batch_size 8 --per_device_eval_batch_size 8 --max_seq_len 64 \
  --learning_rate 1e-3 --num_train_epochs 3 --dtype fp32 --zero_stage 2 --output_dir output > output/training.log 2>&1 ||
  fail "step 2 failed" output/training.log
LOG=output/training.log
mapfile -t ACC < <(grep -oE 'acc \(higher is better\) : [0-9.e+-]+' "$LOG" | awk '{print $NF}')
mapfile -t DIFF < <(grep -oE 'chosen_last_scores \(higher is better\) : [0-9.e+-]+, rejected_last_scores \(lower is better\) : [0-9.e+-]+' "$LOG" |
  awk '{print $5 - $NF}')
[[ ${#ACC[@]} -eq 4 ]] || fail "expected 4 reward evaluations, got ${#ACC[@]}" "$LOG"
echo "accuracy before and after each epoch: ${ACC[*]}; chosen - rejected: ${DIFF[*]}"
awk -v a="${ACC[0]}" 'BEGIN { exit !(a < 0.8) }' || fail "accuracy before training ${ACC[0]} is already high" "$LOG"
awk -v a="${ACC[3]}" 'BEGIN { exit !(a >= 0.9) }' || fail "accuracy after training ${ACC[3]} < 0.9" "$LOG"
awk -v a="${DIFF[0]}" -v b="${DIFF[3]}" 'BEGIN { exit !(b > a + 1) }' ||
  fail "the score difference did not grow: ${DIFF[*]}" "$LOG"
for f in pytorch_model.bin config.json vocab.json merges.txt; do
  [[ -f output/$f ]] || fail "step 2's output lacks $f" "$LOG"
done
echo "steps 1 and 2: the reward model ranks $(awk -v a="${ACC[3]}" 'BEGIN{print a * 100}')% of held-out pairs right"
STEP2="$PWD/output"

# Step 3: the step-1 actor and the step-2 critic, PPO on the phase-3 prompts, on two processes.
mkdir -p "$APP/training/step3_rlhf_finetuning"
cd "$APP/training/step3_rlhf_finetuning"
mkdir -p output
"$DSRUN" --num_gpus 2 --master_port 29613 "$DSCHAT" ppo --data_path local/jsonfile --data_split 2,4,4 \
  --actor_model_name_or_path "$STEP1" --critic_model_name_or_path "$STEP2" --num_padding_at_beginning 0 \
  --per_device_generation_batch_size 4 --per_device_training_batch_size 4 --max_prompt_seq_len 32 \
  --max_answer_seq_len 12 --actor_learning_rate 1e-3 --critic_learning_rate 1e-3 --num_warmup_steps 2 --dtype fp32 \
  --seed 1234 --enable_tensorboard --tensorboard_path output --output_dir output > output/training.log 2>&1 ||
  fail "step 3 failed" output/training.log
LOG=output/training.log
mapfile -t REW < <(grep -oE 'Average reward score: [0-9.e+-]+' "$LOG" | awk '{print $NF}')
[[ ${#REW[@]} -eq 50 ]] || fail "expected 50 PPO rounds (400 prompts, 2 ranks x 4), got ${#REW[@]}" "$LOG"
# The mean reward of each 10 rounds: some later window beats the first by more than 1.
mapfile -t WIN < <(printf '%s\n' "${REW[@]}" | awk '{s += $1} NR % 10 == 0 {print s / 10; s = 0}')
echo "step 3: mean reward per 10 rounds ${WIN[*]}"
printf '%s\n' "${WIN[@]}" | awk 'NR == 1 {first = $1} NR > 1 && $1 > first + 1 {up = 1} END {exit !up}' ||
  fail "the reward did not rise: ${WIN[*]}" "$LOG"
for m in actor critic; do [[ -f output/$m/config.json ]] || fail "step 3's output lacks $m/" "$LOG"; done
"$(dirname "$DSCHAT")/../dsplot/dsplot" output/step3_tensorboard_logs --metrics reward,ppo_loss -o output/step3.png \
  > output/plot.log 2>&1 || fail "dsplot failed on step 3's TensorBoard file" output/plot.log
[[ -s output/step3.png ]] || fail "dsplot wrote no picture" output/plot.log
echo "PASS: steps 1-3 end to end; the reward model ranks $(awk -v a="${ACC[3]}" 'BEGIN{print a * 100}')% of held-out pairs right, \
step 3's mean reward went from ${WIN[0]} to ${WIN[4]}"
