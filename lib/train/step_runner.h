// How the trainer runs a training step up to its one host read
// (docs/distributed.md, "host synchronisations per step"; docs/cuda.md, "CUDA
// graphs"). The step's work is one body, Trainer::step_body: the update's
// step scalars, zeroing the gradients and the statistics, the passes over the
// micro-batches (lib/runtime/passes.h: eager or pipeline), the gradient
// reduction and statistics and, with the update on the device, the gated
// update. A runner decides how that body runs and where its micro-batches
// come from:
// - DirectStep: eagerly every step, fed from the data (every layout).
// - GraphStep (--cuda-graph; graph_step.cpp): eagerly for the warm-up steps,
//   then captured once and replayed, fed from fixed device buffers that the
//   host refills from the data before each replay.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "lib/core/dtype.h"
#include "lib/model/gpt.h"
#include "lib/optim/optimizer.h"
#include "lib/runtime/micro_batch.h"

namespace ds {

struct StepPlan {
  float loss_weight = 0;  // each token's loss weight: loss scale / (B x T x micro-batches x dp)
  DropoutKey key;         // training, seed, iteration; each micro-batch adds its first sample
  StepHyper hyper;        // the schedule's values for the update
  double loss_scale = 1;  // fp16: the scale in loss_weight (1 otherwise)
  // The gate reads the loss scale from the step block, not loss_scale (a
  // captured step with a dynamic fp16 scale: loss_weight is then unscaled).
  bool scale_in_block = false;
  int micro_batches = 1;
  // wall_clock_breakdown: the body marks its phases (never while capturing).
  bool phases = false;
};

// The step's work up to its read, fed by `feed`.
using StepBody = std::function<void(const StepPlan&, const MicroBatchFeed&)>;

struct GraphCounters {
  int64_t captured_at = 0;  // the iteration (1-based) whose step was last captured; 0 before one
  int64_t captures = 0, replays = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // The step up to its read.
  virtual void run(const StepPlan& plan) = 0;
  // Before an evaluation or a checkpoint at `iteration` (which may reshape
  // the model's buffers): a runner holding device memory across steps (a
  // captured graph) lets it go; the next step captures again.
  virtual void release(const char* /*why*/, int64_t /*iteration*/) {}
  // Does run() leave the wall_clock_breakdown phases to the body?
  virtual bool body_marks_phases() const { return true; }
  virtual GraphCounters graph_counters() const { return {}; }
};

class DirectStep final : public StepRunner {
 public:
  DirectStep(StepBody body, MicroBatchFeed feed) : body_(std::move(body)), feed_(std::move(feed)) {}
  void run(const StepPlan& plan) override { body_(plan, feed_); }

 private:
  StepBody body_;
  MicroBatchFeed feed_;
};

// --cuda-graph (graph_step.cpp, which says what a replay may and may not
// repeat).
struct GraphStepOptions {
  Device dev;
  int64_t micro_batch = 0, seq_length = 0, micro_batches = 0;  // fixed for the graph's life
  int64_t warmup = 0;          // eager steps before the capture
  bool dynamic_scale = false;  // fp16 with a dynamic loss scale: read from the step block
  StepBody body;
  MicroBatchFeed host_feed;  // micro-batch m of the step about to run, in host memory
  // Forgets the host's half of a step whose capture failed (units acquired,
  // the overlap armed): GptModel::abandon_pass, ZeroOptimizer::abandon_step.
  std::function<void()> abandon;
};
std::unique_ptr<StepRunner> make_graph_step(GraphStepOptions o);

}  // namespace ds
