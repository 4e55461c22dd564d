// --cuda-graph: the whole training step up to its one host read (the
// trainer's step body, step_runner.h) captured once in a CUDA graph and
// replayed every step (docs/cuda.md, "CUDA
// graphs"): the copy of the step scalars and of every micro-batch's tokens
// from fixed pinned buffers, zeroing the gradients and the step statistics,
// forward and backward, the gradient norm, the update's gate (step_gate: clip
// coefficient and the skip decision, on the device from the statistics) and
// the AdamW update reading its per-step values from the step block. A
// replayed step is one graph launch and one read (statistics and the
// device's gate); the host then keeps its counters (iteration, skipped
// steps, Adam's step count, the schedule, the fp16 loss scaler) in line with
// what the device did.
//
// What a replay repeats must not change between steps, so:
// - Scalars captured as kernel arguments: the loss weight 1 / (B x T x ga)
//   (static batch and sequence length; a static fp16 loss scale is a
//   constant factor of it), the dropout key's constant part (seed, layer,
//   site, probability, in-batch offsets), the gate's clip threshold, Adam's
//   betas and eps. The schedule's learning rate and weight decay, the bias
//   corrections of Adam's step count and a dynamic fp16 loss scale live in
//   the step block (lib/ops/step_scalars.h): the host writes them into a
//   fixed pinned buffer before each replay and the graph copies them in; the
//   loss kernel multiplies its weight by the block's loss scale
//   (GptModel::set_dloss_scale) and step_gate divides it out. The scale is a
//   power of two (validate_cuda_graph), so 2^k x fl(1 / N) is the eager
//   step's fl(2^k / N) exactly. The grad scale and the skip flag are written
//   into the block inside the graph by step_gate.
// - Tokens and the dropout key's per-step part ({iteration, first sample}, read
//   by the dropout and attention kernels from memory: DropoutKey::step,
//   DropoutSpec::step_key): fixed device buffers per micro-batch, filled
//   inside the graph by a copy from fixed pinned buffers that the host
//   refills before each replay. The previous step's read waited for the
//   device, so no copy from them (or from the step scalars' buffer) is in
//   flight when they are rewritten.
// - Memory: allocations during the capture come from a pool owned by the graph
//   (cuda/core/allocator.cpp); nothing else gets those blocks while the graph
//   lives. Blocks allocated before the capture and used by the graph are the
//   persistent ones (parameters, gradients, Adam's moments, the model's
//   activation buffers, step_block_); the only code that could free one (an
//   evaluation or a checkpoint, which may reshape the model's buffers) first
//   drops the graph (StepRunner::release), and the next step captures again.
// - Host synchronisations: none inside the region. The CUDA code refuses them
//   while capturing (require_not_capturing), and the host synchronisation
//   counter must not move across the capture.
#include <cstring>

#include "lib/core/device_runtime.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/sync_counter.h"
#include "lib/train/step_runner.h"

namespace ds {
namespace {

class GraphStep final : public StepRunner {
 public:
  explicit GraphStep(GraphStepOptions o);
  ~GraphStep() override;
  void run(const StepPlan& plan) override;
  void release(const char* why, int64_t iteration) override;
  bool body_marks_phases() const override { return false; }
  GraphCounters graph_counters() const override { return counters_; }

 private:
  // The body fed from the fixed buffers (the same work in the warm-up and in
  // the capture, so the capture finds the warm-up's blocks cached).
  void body(const StepPlan& plan);

  GraphStepOptions o_;
  DeviceRuntime& rt_;
  std::unique_ptr<DeviceGraph> graph_;
  std::vector<void*> pinned_tok_, pinned_tgt_;  // per micro-batch: (B, T) i32, page-locked host memory
  std::vector<Tensor> tok_, tgt_;               // per micro-batch: (B, T) i32 on the device, fixed addresses
  std::vector<void*> pinned_key_;               // per micro-batch: (2) i64 {iteration, first sample}, page-locked
  std::vector<Tensor> key_;                     // per micro-batch: (2) i64 on the device (DropoutKey::step)
  int64_t eager_steps_ = 0;  // graph-mode steps run eagerly so far (the warm-up)
  int failures_ = 0;         // captures in a row that failed
  GraphCounters counters_;
};

GraphStep::GraphStep(GraphStepOptions o) : o_(std::move(o)), rt_(device_runtime(o_.dev)), graph_(rt_.make_graph()) {
  const size_t bytes = static_cast<size_t>(o_.micro_batch * o_.seq_length) * sizeof(int32_t);
  for (int64_t m = 0; m < o_.micro_batches; ++m) {
    pinned_tok_.push_back(rt_.alloc_pinned(bytes));
    pinned_tgt_.push_back(rt_.alloc_pinned(bytes));
    tok_.push_back(Tensor::empty({o_.micro_batch, o_.seq_length}, DType::I32, o_.dev));
    tgt_.push_back(Tensor::empty({o_.micro_batch, o_.seq_length}, DType::I32, o_.dev));
    pinned_key_.push_back(rt_.alloc_pinned(2 * sizeof(int64_t)));
    key_.push_back(Tensor::empty({2}, DType::I64, o_.dev));
  }
}

GraphStep::~GraphStep() {
  graph_.reset();  // before the buffers it addresses
  for (void* p : pinned_tok_) rt_.free_pinned(p);
  for (void* p : pinned_tgt_) rt_.free_pinned(p);
  for (void* p : pinned_key_) rt_.free_pinned(p);
}

void GraphStep::release(const char* why, int64_t iteration) {
  if (!graph_->ready()) return;
  graph_ = rt_.make_graph();  // the old one returns its pool to the cache
  DS_LOG("cuda graph: released for the {} at iteration {}; the next step captures again", why, iteration);
}

void GraphStep::body(const StepPlan& plan) {
  StepPlan p = plan;
  p.phases = false;
  // fp16: a static loss scale is in loss_weight (a constant); a dynamic one
  // is read from the step block by the loss kernel and the gate.
  if (o_.dynamic_scale) {
    p.scale_in_block = true;
    p.loss_weight = static_cast<float>(1.0 / static_cast<double>(o_.micro_batch * o_.seq_length * o_.micro_batches));
  }
  o_.body(p, [this](int m) {
    rt_.copy_pinned_async(tok_[m].raw(), pinned_tok_[m], tok_[m].nbytes());
    rt_.copy_pinned_async(tgt_[m].raw(), pinned_tgt_[m], tgt_[m].nbytes());
    rt_.copy_pinned_async(key_[m].raw(), pinned_key_[m], key_[m].nbytes());
    // the ops read {iteration, first sample} from key_[m]
    return MicroBatch{.tokens = tok_[m], .targets = tgt_[m], .first_sample = 0, .step_key = key_[m]};
  });
}

void GraphStep::run(const StepPlan& plan) {
  DS_CHECK(plan.micro_batches == o_.micro_batches, "--cuda-graph: {} micro-batches in a step captured with {}",
           plan.micro_batches, o_.micro_batches);
  for (int m = 0; m < plan.micro_batches; ++m) {
    MicroBatch mb = o_.host_feed(m);
    DS_CHECK(mb.tokens.nbytes() == tok_[m].nbytes(), "--cuda-graph: micro-batch shape changed");
    std::memcpy(pinned_tok_[m], mb.tokens.raw(), mb.tokens.nbytes());
    std::memcpy(pinned_tgt_[m], mb.targets.raw(), mb.targets.nbytes());
    const int64_t step_key[2] = {plan.key.iteration, mb.first_sample};
    std::memcpy(pinned_key_[m], step_key, sizeof(step_key));
  }
  const int64_t iteration = plan.key.iteration + 1;  // as the log counts
  if (graph_->stale()) release("reallocated stream workspace", plan.key.iteration);
  if (graph_->ready()) {
    graph_->replay();
    ++counters_.replays;
    return;
  }
  if (eager_steps_ < o_.warmup) {
    body(plan);
    ++eager_steps_;
    return;
  }
  const int64_t syncs = host_sync_count();
  size_t nodes = 0;
  try {
    graph_->begin_capture();
    body(plan);
    nodes = graph_->end_capture();
  } catch (const std::exception& e) {
    // Nothing captured has run: the step runs eagerly and the next one tries
    // again (a block the warm-up never allocated is cached by then). The
    // host's half of the interrupted step is forgotten first.
    graph_->abort_capture();
    graph_ = rt_.make_graph();
    o_.abandon();
    DS_USER_CHECK(++failures_ < 3, "--cuda-graph: capturing the step failed 3 times in a row (iteration {}): {}",
                  iteration, e.what());
    DS_LOG("warning: --cuda-graph: capturing the step at iteration {} failed, it runs eagerly and the next step "
           "captures again: {}", iteration, e.what());
    body(plan);
    return;
  }
  DS_CHECK(host_sync_count() == syncs, "--cuda-graph: {} host synchronisations inside the captured region (must be 0)",
           host_sync_count() - syncs);
  failures_ = 0;
  counters_.captured_at = iteration;
  ++counters_.captures;
  DS_LOG("cuda graph: captured the step at iteration {}: {} nodes, {:.1f} MiB in the graph's memory pool; "
         "replayed from now on", iteration, nodes, static_cast<double>(graph_->pool_bytes()) / (1 << 20));
  graph_->replay();  // the captured step has not run yet
  ++counters_.replays;
}

}  // namespace

std::unique_ptr<StepRunner> make_graph_step(GraphStepOptions o) { return std::make_unique<GraphStep>(std::move(o)); }

}  // namespace ds
