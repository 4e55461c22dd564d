// The training loop: batches -> forward/backward over grad-accumulation
// micro-steps -> grad-norm clipping -> AdamW -> logging, evaluation and
// checkpoints. One Trainer per process.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/model_state.h"
#include "lib/config/config.h"
#include "lib/config/curriculum.h"
#include "lib/core/heartbeat.h"
#include "lib/model/gpt.h"
#include "lib/optim/adamw.h"
#include "lib/optim/loss_scaler.h"
#include "lib/parallel/comms.h"
#include "lib/runtime/pipeline_executor.h"
#include "lib/runtime/timeline.h"
#include "lib/runtime/zero_optimizer.h"
#include "lib/train/autotune_hooks.h"
#include "lib/train/compression.h"
#include "lib/train/data_pipeline.h"
#include "lib/train/metrics.h"
#include "lib/train/step_runner.h"
#include "lib/train/tensorboard.h"

namespace ds {

// Our full weight `name` with its LoRA delta fused in (DeepSpeed-Chat's
// convert_lora_to_linear_layer): next(n) returns our full f32 weight n
// (any device), asked for in the order export_hf's requests list them.
Tensor lora_fused_weight(const ModelConfig& cfg, const std::string& name,
                         const std::function<Tensor(const std::string&)>& next);

class Trainer {
 public:
  // comms: this rank's communicators (a world of 1 for a single process).
  // local_rank: this process's index on its node (the launcher's LOCAL_RANK),
  // which picks the GPU with --device cuda. data: where the batches come
  // from; null = the datasets cfg.data names (DataPipeline).
  Trainer(const TrainConfig& cfg, Comms& comms, int local_rank = 0, std::unique_ptr<BatchSource> data = nullptr);
  ~Trainer();
  // Runs until train_iters; returns the per-iteration training losses of this run.
  std::vector<float> run();
  // One training iteration (the step, its log line at the log interval, its
  // TensorBoard and CSV points); returns its loss. For a front end with its
  // own loop (dschat); run() is built on it.
  float iterate();
  // Writes a checkpoint of the training state into the configured save
  // directory now (collective), as run() does at its save points; nothing
  // without one.
  void save_checkpoint() { save(); }
  // Validation loss over eval_iters global batches of the valid split.
  double evaluate();
  // The mean loss of one host micro-batch of B x T (forward only, no
  // dropout; a target < 0 is ignored), on every pipeline stage; this rank's
  // value (dp_mean averages it). Collective over the model's groups.
  double forward_loss(const MicroBatch& host);
  // The average of a scalar over the (sequence-)data-parallel group. Collective.
  double dp_mean(double local);
  // Writes the model as a Hugging Face directory (gathered to rank 0 one
  // weight at a time, as --export-hf). Collective.
  void export_hf(const std::string& dir);
  GptModel& model() { return *model_; }
  // This rank's persistent model-state bytes (what the start-up log reports).
  ModelStateBytes model_state_bytes() const { return opt_->model_state_bytes(); }
  const TrainState& state() const { return state_; }
  // Adam's step count: the updates applied so far (skipped steps excluded).
  int64_t optimizer_steps() const { return opt_->optimizer().step_count(); }
  // --profile: the host synchronisations of the profiled step (the run's
  // second), as its start-up log line reports them; -1 before it ran.
  int64_t profiled_host_syncs() const { return profiled_syncs_; }
  // --cuda-graph (graph_step.cpp): the iteration (1-based, as the log
  // counts) whose step was last captured, 0 before a capture; the number of
  // captures (one more after every evaluation or checkpoint) and replays.
  int64_t graph_captured_at() const { return runner_->graph_counters().captured_at; }
  int64_t graph_captures() const { return runner_->graph_counters().captures; }
  int64_t graph_replays() const { return runner_->graph_counters().replays; }

 private:
  int64_t applied_steps_ = 0;  // optimizer steps applied in this run (DeepSpeed's compression scheduler)
  std::unique_ptr<WeightQuantizer> wq_;  // compression_training.weight_quantization (MoQ)
  float train_step();
  void save();
  void load_or_init();
  void reset_iteration_after_load();
  void start_after_weights_only_load();
  void set_step_batch();
  int64_t micro_batches_at(int64_t consumed) const;  // per rank, for the step after `consumed` samples
  void log_iteration(float loss, double grad_norm, double ms);
  void log_model_state();
  void setup_device_and_precision();  // device, compute dtype, loss scaler, MFU peak
  // fp16: records the step's overflow (the flag read with the step's
  // statistics) in the scaler (and TrainState); true if the step must be skipped.
  bool skip_for_overflow(bool overflow);
  // Setup (trainer.cpp): the checks of inputs and outputs that would fail
  // only after training; the grid's views, sharding groups, model, optimizer
  // and passes; the step runner; the start-up log.
  void check_inputs_and_outputs();
  void build_model_and_optimizer();
  void setup_step_runner();
  void log_setup();
  // The step up to its one host read (docs/distributed.md, host
  // synchronisations per step; step_runner.h): what every runner runs.
  void step_body(const StepPlan& plan, const MicroBatchFeed& feed);
  // The one micro-batch feed path: micro-batch m of the current step (its
  // global batch starts at consumed_samples; a curriculum keeps the first
  // seqlen_ positions of each sample), this rank's samples (data parallel)
  // and positions (Ulysses), in host memory.
  MicroBatch host_train_batch(int m);
  void begin_step_stats();
  void end_step_stats();  // the device work that completes the step's statistics (no host read)
  // The step's block on the device, (kStepStats + AdamWSlot::Count) f32: the
  // statistics (gradient sum of squares, overflow flag, loss, MoE loss, KD loss) and
  // the step scalars of the gated update (lib/ops/step_scalars.h). One read
  // returns both; the gate reads the first three statistics.
  static constexpr int64_t kStepStats = 5;
  Tensor step_block_;
  Tensor step_stats() const { return step_block_.view(0, {kStepStats}); }
  Tensor step_scalars() const { return step_block_.view(kStepStats, {AdamWSlot::Count}); }
  struct StepRead {
    float sumsq = 0, overflow = 0, loss = 0;  // the world's sums (the loss scale still in sumsq)
    float moe_loss = 0;                       // loss_coeff x sum of l_aux, averaged like the loss
    float kd_loss = 0;                        // distillation's loss, averaged like the loss
    float grad_scale = 1;                     // device_update_: what the device's gate decided
    bool skipped = false;
  };
  StepRead read_step_block();  // the step's one host synchronisation
  // One process with the optimizer on the compute device: the update runs
  // inside the step, gated on the device (step_gate, then AdamW reading the
  // step scalars), before the read; otherwise after the read with the host's
  // gate. See train_step.
  bool device_update_ = false;
  StepHyper step_hyper() const;  // the schedule's values for this step
  // device_update_: the host's step scalars of this step (Adam's next step
  // count, the loss scale); on the CPU written into the step block, on the GPU into
  // pinned_terms_, which copy_update_terms then copies into the block inside
  // the step (a graph's copy node reads that fixed address).
  void stage_update_terms(const StepHyper& h);
  void copy_update_terms();
  // step_gate + the gated AdamW; scale_in_block: the gate reads the loss scale
  // from the step block (a captured fp16 step), not loss_scale.
  void update_on_device(const StepHyper& h, double loss_scale, bool scale_in_block = false);
  // (kStepHostSlots) f32 of page-locked memory (GPU, device_update_).
  // Declared before runner_: it outlives the graph that copies from it.
  struct PinnedDelete {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, PinnedDelete> pinned_terms_;
  SkipRule skip_rule() const { return scaler_ ? SkipRule::Overflow : SkipRule::NonFinite; }
  // Counts an iteration whose loss (or, without a loss scaler, gradient norm)
  // is NaN/Inf; returns true if so (the update must be skipped). Throws
  // UserError after cfg.max_nan_iterations such iterations in a row.
  bool note_nan_iteration(float loss, double grad_norm);
  // Do the parameters (this rank's shard of them; undefined on ranks that
  // hold none) or this rank's optimizer state hold NaN/Inf on any rank?
  // Collective (world).
  bool state_nonfinite(const std::vector<Tensor>& params);
  // --exit-duration-in-mins: has training run longer, on any rank? Collective.
  bool out_of_time();
  // --train-tokens: are tokens left to train (always, without the flag)?
  bool tokens_left() const;
  // --exit-signal-handler: has SIGTERM reached any rank? Collective.
  bool signalled();
  // This rank's model for the gathers and checkpoints of lib/ckpt/model_state.h.
  RankModel rank_model();
  Tensor lora_fused(FullTensorStream& stream, const std::string& name);  // export_hf's weight, LoRA fused
  // This rank's checkpoint: shard `shard_index` of `shards` optimizer files
  // (rank_checkpoint, with every sharding group's state when there are several).
  CheckpointData checkpoint_data(int shard_index, int shards);
  // (pipeline parallel) the last stage's value on every stage (broadcast over pp).
  double from_last_stage(double v);
  // Tied embeddings with pp > 1: sums the wte gradient of the first and last
  // stage over the embedding group (Megatron's embedding all-reduce).
  void tied_embedding_all_reduce();
  std::vector<Range> norm_counted_ranges(const ModelLayout& local) const;
  // TensorBoard (trainer_tensorboard.cpp): opens the writer on the last rank
  // (as Megatron); reports an iteration (collective with optimizer states).
  void open_tensorboard();
  TrainPoint train_point(float loss) const;
  void tensorboard_iteration(float loss, bool log_line, double ms);
  OptimizerStats optimizer_stats();  // collective

  TrainConfig cfg_;
  Device dev_;
  std::unique_ptr<ZeroParamStore> store_;  // ZeRO-2/3 (else the model's flat buffers)
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<GptModel> teacher_;  // --kd / --mos: the frozen teacher (lib/train/distill.h)
  Comms& comms_;
  int local_rank_ = 0;
  std::chrono::steady_clock::time_point start_;  // when this process started training
  // dsrun's liveness watch (docs/dsrun.md, "Hung ranks"): beats once the first
  // step is done and at every micro-batch after it; paused while saving,
  // exporting and after training (a rank may wait for its peers there).
  Heartbeat heartbeat_;
  int dp_ = 1, dp_rank_ = 0;    // data parallel: which samples this rank reads
  // The current step's global batch and micro-batches per rank (set_step_batch).
  int64_t step_batch_ = 0, step_ga_ = 0;
  int64_t step_rows_ = 0;  // rows per micro-batch this step: micro_batch_size, or seqlen_reshape's
  int sdp_ = 1, sdp_rank_ = 0;  // sequence x data parallel (Ulysses): gradient reduction, ZeRO
  // The ZeRO partition's ranks: sdp, or with expert parallelism the expert-data-parallel group.
  int zero_ranks_ = 1, zero_rank_ = 0;
  ShardCoords shard_;  // this rank's model shard (tp, pp, virtual stages)
  std::unique_ptr<PipelineExecutor> pipe_;  // pp > 1
  std::unique_ptr<EagerPasses> eager_;      // pp = 1
  Passes* passes_ = nullptr;                // the one of the two this rank has
  ModelLayout full_layout_;  // the tp = 1 layout (checkpoints, HF import/export)
  StepTokenizer tokenizer_copy_;  // rank 0: the run's tokenizer files, saved with checkpoints and exports
  std::unique_ptr<ZeroOptimizer> opt_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  std::unique_ptr<BatchSource> data_;
  TrainState state_;
  int64_t first_iteration_ = 0;  // the iteration this run started at (after a load)
  double window_ms_ = 0;         // iterations since the last log line: their time and count
  int64_t window_n_ = 0;
  bool autotune_done_ = false;   // an autotuning experiment recorded its last profiled step
  // Sequence-length curriculum (DeepSpeed's curriculum_learning), when enabled.
  std::unique_ptr<CurriculumScheduler> curriculum_;
  int64_t seqlen_ = 0;  // positions per sample of the latest training step
  // Random-LTD: the reserved length of the latest step (0: off), and
  // Megatron-DeepSpeed's actual_seq_length of it: the positions per sample
  // averaged over the layers, which the consumed tokens (token-based
  // schedules, --train-tokens) and the seqlen logs count.
  int64_t ltd_reserved_ = 0;
  int64_t actual_seqlen() const;
  int64_t step_tokens() const;  // the step's consumed tokens (rows x actual_seqlen per micro-batch)
  int64_t next_seqlen();  // the curriculum's length for the next step, else seq_length
  MicroBatch local_batch(MicroBatch mb) const;  // Ulysses: this rank's positions of every sample
  CsvMonitor csv_;
  TensorBoardMonitor tb_;
  ProfileWindow profile_ = ProfileWindow::from_env();  // dsrun --autotuning experiments
  double flops_per_token_ = 0;
  double peak_tflops_ = 0;
  double last_grad_norm_ = 0, last_lr_ = 0;
  float own_sumsq_ = -1;  // this rank's own gradient sum of squares when they stay local (else < 0)
  bool moe_ = false;  // the model has Mixture-of-Experts layers
  double last_moe_loss_ = 0;  // the last step's "moe loss"
  double last_kd_loss_ = 0;   // the last step's "kd loss" / "mos loss"
  int64_t nan_iters_ = 0, nan_streak_ = 0;  // non-finite iterations: in this run, in a row
  StepTimes step_times_;  // wall_clock_breakdown: phases since the last log line
  double phase_ms();      // milliseconds since the previous call (device synchronized)
  std::chrono::steady_clock::time_point phase_start_;
  // --profile: the timeline of one steady-state step and its host synchronisations.
  Timeline timeline_;
  float profiled_step();
  int64_t profiled_syncs_ = -1;
  // The tagged bytes already live when this trainer built its model (another
  // trainer's, in a process that holds several): log_model_state reports its own.
  ModelStateBytes tagged_before_;
  // How each step runs (step_runner.h; --cuda-graph: graph_step.cpp).
  // Declared last: destroyed first, so a graph's memory pool goes back to the
  // cache while everything it addresses is still alive.
  std::unique_ptr<StepRunner> runner_;
};

}  // namespace ds
