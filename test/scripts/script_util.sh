# Shared by the Megatron-DeepSpeed example-script tests: binaries, a generated
# corpus with its byte-level BPE tokenizer, and the checks on a dstrain log.
# A script sources this and calls setup_run BUILD_DIR NAME (KEEP_WORK=1 keeps
# its temporary directory for a look afterwards).

fail() {  # fail MESSAGE [LOG]: print the message (and the log's tail), exit 1
  echo "FAIL: $1"
  [[ -n "${2:-}" && -f "$2" ]] && tail -40 "$2"
  exit 1
}

setup_run() {
  local build="$1" name="$2"
  DSRUN="${build}/apps/dsrun/dsrun"
  DSTRAIN="${build}/apps/dstrain/dstrain"
  DSPREP="${build}/apps/dsprep/dsprep"
  for b in "$DSRUN" "$DSTRAIN" "$DSPREP"; do [[ -x "$b" ]] || fail "missing binary $b"; done
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/ds_${name}.XXXXXX")"
  [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$WORK"' EXIT
  export OMP_NUM_THREADS=1
  DATA="${WORK}/data"
  TOK="${WORK}/tokenizer"
  local log="${WORK}/setup.log"
  { "$DSPREP" --generate-corpus "${WORK}/corpus.txt" --size-mb 1 --seed 1 &&
    "$DSPREP" --train-tokenizer --input "${WORK}/corpus.txt" --vocab-size 512 --output-dir "$TOK" &&
    "$DSPREP" --input "${WORK}/corpus.txt" --output-prefix "${DATA}/corpus" \
      --vocab-file "${TOK}/vocab.json" --merge-file "${TOK}/merges.txt"; } > "$log" 2>&1 ||
    fail "preparing the corpus and tokenizer failed" "$log"
}

# check_trained LOG FIRST LAST: the log's iteration lines run from at most
# FIRST to exactly LAST (of LAST).
check_trained() {
  local log="$1" first="$2" last="$3"
  local its
  its=$(grep -oE 'iteration +[0-9]+/ *[0-9]+' "$log" | awk '{split($2, a, "/"); print a[1]}')
  [[ -n "$its" ]] || fail "no iteration lines in $log" "$log"
  local lo hi
  lo=$(echo "$its" | head -1)
  hi=$(echo "$its" | tail -1)
  (( lo <= first )) || fail "first logged iteration $lo > $first" "$log"
  (( hi == last )) || fail "last logged iteration $hi != $last" "$log"
}

# check_loss_falls LOG: the last logged lm loss is below 0.8 x the first.
check_loss_falls() {
  local log="$1"
  local losses
  losses=$(grep -oE 'lm loss: [0-9.E+-]+' "$log" | awk '{print $3}')
  [[ $(echo "$losses" | wc -l) -ge 3 ]] || fail "fewer than 3 loss values in $log" "$log"
  awk -v a="$(echo "$losses" | head -1)" -v b="$(echo "$losses" | tail -1)" \
    'BEGIN { exit !(b < 0.8 * a) }' || fail "loss did not fall: $(echo $losses)" "$log"
}

# write_moe_config_template PATH [zero2]: Megatron-DeepSpeed's
# examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json, which the MoE scripts
# fill in with sed; with zero2 its ds_config_gpt_Zero2_TEMPLATE.json (the
# same with "stage": 2 and "prescale_gradients": false written in).
write_moe_config_template() {
  local stage=ZERO_STAGE prescale=PRESCALE_GRAD
  [[ "${2:-}" == zero2 ]] && { stage=2; prescale=false; }
  sed -e "s/\"stage\": ZERO_STAGE/\"stage\": ${stage}/" -e "s/PRESCALE_GRAD,/${prescale},/" > "$1" <<'JSON'
{
  "train_batch_size" : CONFIG_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": CONFIG_MBSIZE,
  "steps_per_print": LOG_INTERVAL,

  "zero_optimization": {
    "stage": ZERO_STAGE
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": PRESCALE_GRAD,

  "fp16": {
    "enabled": CONFIG_FP16_ENABLED,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "bf16": {
    "enabled": CONFIG_BF16_ENABLED
  },
  "curriculum_learning": {
    "enabled": CONFIG_CL_ENABLED,
    "curriculum_type": "seqlen",
    "min_difficulty": CONFIG_CL_MIN,
    "max_difficulty": CONFIG_CL_MAX,
    "schedule_type": "fixed_linear",
    "schedule_config": {
      "total_curriculum_step": CONFIG_CL_DURATION,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
JSON
}

# write_rebase_config_template PATH: Megatron-DeepSpeed's
# examples_deepspeed/rebase/ds_config_gpt_TEMPLATE.json (fp16, ZeRO stage,
# batch sizes and prescale left for the scripts' sed lines to fill in).
write_rebase_config_template() {
  cat > "$1" <<'JSON'
{
  "train_batch_size": GBSIZE,
  "train_micro_batch_size_per_gpu": MBSIZE,
  "steps_per_print": LOG_INTERVAL,
  "zero_optimization": {
    "stage": ZERO_STAGE
  },
  "gradient_clipping": 1.0,
  "prescale_gradients": PRESCALE_GRAD,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },
  "wall_clock_breakdown" : false
}
JSON
}

# write_data_efficiency_config_template PATH [2]: Megatron-DeepSpeed's
# examples_deepspeed/data_efficiency/gpt/pretrain/ds_config_gpt_1clmetric_TEMPLATE.json
# (random-LTD and one curriculum metric, left for the base script's sed lines);
# with 2 its ds_config_gpt_2clmetrics_TEMPLATE.json (a second metric, CL_2nd_*).
write_data_efficiency_config_template() {
  local second=""
  [[ "${2:-}" == 2 ]] && second=',
          "CL_2nd_METRIC_NAME": {
            "index_to_sample_path": "CL_2nd_SAMPLE_PATH",
            "index_to_metric_path": "CL_2nd_METRIC_PATH",
            "difficulty_type": "CL_2nd_DIFF_TYPE",
            "clustering_type": "CL_2nd_CLUSTER_TYPE",
            "min_difficulty": CL_2nd_MIN,
            "max_difficulty": CL_2nd_MAX,
            "schedule_type": "fixed_root",
            "schedule_config": {
              "total_curriculum_step": CL_2nd_TOTAL_STEP,
              "difficulty_step": CL_2nd_DIFF_STEP,
              "root_degree": CL_2nd_ROOT
            }
          }'
  cat > "$1" <<JSON
{
  "train_batch_size": GBSIZE,
  "train_micro_batch_size_per_gpu": MBSIZE,
  "steps_per_print": LOG_INTERVAL,

  "zero_optimization": {
    "stage": ZERO_STAGE
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": PRESCALE_GRAD,

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "wall_clock_breakdown" : false,
  "dataloader_drop_last": true,
  "data_efficiency": {
    "enabled": true,
    "seed": DATA_EFFICIENCY_SEED,
    "data_routing": {
      "enabled": LTD_ENABLED,
      "random_ltd":{
        "enabled": LTD_ENABLED,
        "total_layer_num": 24,
        "random_ltd_layer_num": 22,
        "random_ltd_layer_id": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22],
        "model_mask_name": "attention_mask",
        "model_type": "decoder",
        "hidden_state_order": "seq_batch_dim",
        "random_ltd_schedule": {
          "min_value": LTD_MIN,
          "max_value": LTD_MAX,
          "schedule_type":"fixed_linear",
          "schedule_config": {
            "require_steps": LTD_STEP,
            "seq_per_step": 16
          }
        }
      } 
    },
    "data_sampling": {
      "enabled": CL_ENABLED,
      "num_workers": DATA_SAMPLING_NUM_WORKERS,
      "curriculum_learning": {
        "enabled": CL_ENABLED,
        "data_cluster_path": "CL_CLUSTER_PATH",
        "curriculum_metrics": {
          "CL_1st_METRIC_NAME": {
            "index_to_sample_path": "CL_1st_SAMPLE_PATH",
            "index_to_metric_path": "CL_1st_METRIC_PATH",
            "difficulty_type": "CL_1st_DIFF_TYPE",
            "clustering_type": "CL_1st_CLUSTER_TYPE",
            "min_difficulty": CL_1st_MIN,
            "max_difficulty": CL_1st_MAX,
            "schedule_type": "fixed_root",
            "schedule_config": {
              "total_curriculum_step": CL_1st_TOTAL_STEP,
              "difficulty_step": CL_1st_DIFF_STEP,
              "root_degree": CL_1st_ROOT
            }
          }${second}
        }
      }
    }
  }
}
JSON
}

