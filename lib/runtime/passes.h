// How one training step's forward and backward passes run over its
// micro-batches. One interface, two kinds: EagerPasses runs this process's
// whole model micro-batch after micro-batch; PipelineExecutor
// (pipeline_executor.h) runs this stage's part of a 1F1B or interleaved
// schedule. The trainer's step (lib/train/step_runner.h) and its evaluation
// drive either through this interface and never ask which one it has.
#pragma once
#include <functional>

#include "lib/model/gpt.h"
#include "lib/runtime/micro_batch.h"

namespace ds {

class Passes {
 public:
  virtual ~Passes() = default;
  // Forward + backward of the step's n micro-batches; feed(m) gives
  // micro-batch m (called once per m, in the order the passes reach them).
  // Gradients are ADDED to the model's; the losses go to the model's loss
  // sink (GptModel::set_loss_sink). `key` keys the dropout masks, each
  // micro-batch at its first_sample (or at its step_key).
  virtual void train(const MicroBatchFeed& feed, int n, float loss_weight, const DropoutKey& key) = 0;
  // Forward only over n micro-batches (evaluation); the sum of their mean
  // losses where the loss is computed (pipeline: the last stage), else 0.
  virtual double forward_only(const MicroBatchFeed& feed, int n) = 0;
};

class EagerPasses final : public Passes {
 public:
  // before_last: called right before the last micro-batch's passes, after
  // which every gradient is final (ZeroOptimizer::begin_last_micro_batch
  // arms its bucket reductions there with overlap_comm).
  explicit EagerPasses(GptModel& model, std::function<void()> before_last = {})
      : model_(model), before_last_(std::move(before_last)) {}
  void train(const MicroBatchFeed& feed, int n, float loss_weight, const DropoutKey& key) override;
  double forward_only(const MicroBatchFeed& feed, int n) override;

 private:
  GptModel& model_;
  std::function<void()> before_last_;
};

}  // namespace ds
