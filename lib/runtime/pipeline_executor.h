// Pipeline-parallel executor: runs one global batch of a pipeline stage by
// walking its 1F1B (or interleaved 1F1B) action list
// (lib/parallel/pipeline_schedule.h). Forward and Backward run one model
// chunk of this stage on one micro-batch, with one activation set per
// in-flight (micro-batch, chunk) (at most max_live_activations);
// consecutive send/receive actions are posted as one batch
// (Communicator::batch_send_recv), which the schedule guarantees cannot
// deadlock. Activations (B, T, C) go to the next virtual stage, their
// gradients back, on separate message channels.
#pragma once
#include <functional>
#include <map>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/model/gpt.h"
#include "lib/parallel/pipeline_schedule.h"
#include "lib/runtime/micro_batch.h"

namespace ds {

class PipelineExecutor {
 public:
  // pp: this pipeline's communicator (group rank = stage). n_micro: the
  // micro-batches of one global batch (gradient accumulation steps). The
  // model's layout gives the virtual stages (vp > 1: interleaved 1F1B).
  PipelineExecutor(GptModel& model, Communicator& pp, int n_micro);
  ScheduleKind kind() const { return kind_; }

  // Forward + backward of one global batch; batch(m) returns micro-batch m
  // (every stage reads it: the first needs the tokens, the last the targets).
  // Gradients are ADDED to the model's. Returns the sum of the micro-batch
  // losses on the last stage, 0 elsewhere. `key` (seed, iteration) keys the
  // dropout masks, each micro-batch at its first_sample.
  double train(const std::function<MicroBatch(int)>& batch, float loss_weight, const DropoutKey& key = {});
  // Forward only over n micro-batches (evaluation), one after another.
  // Returns the sum of the losses on the last stage, 0 elsewhere.
  double forward_only(const std::function<MicroBatch(int)>& batch, int n);

  int max_live() const { return max_live_; }
  const std::vector<PipeAction>& actions() const { return actions_; }
  // Actions as performed by the last train() (for checks against the schedule).
  const std::vector<PipeAction>& performed() const { return performed_; }

 private:
  void communicate(size_t begin, size_t end);
  // A batch of sends only is issued asynchronously and waited for before the
  // next batch (or the end of the schedule), so it overlaps the compute in
  // between; its buffers are not written before that: a sent activation's slot
  // is only reused after its backward, which follows a receive batch. A batch
  // with a receive is waited for at once (its compute needs the data).
  CommHandle pending_sends_;
  void wait_sends();
  void compute(const PipeAction& a);
  int key(const PipeAction& a) const { return a.micro * vp_ + a.chunk; }
  int slot_of(int key, bool allocate);
  void free_slot(int key);
  const MicroBatch& micro_batch(int micro);
  Tensor activation_buffer(const MicroBatch& mb);  // (B,T,C) f32

  GptModel& model_;
  Communicator& pp_;
  ScheduleKind kind_ = ScheduleKind::OneFOneB;
  int stage_ = 0, n_stages_ = 1, n_micro_ = 1, vp_ = 1, max_live_ = 1;
  std::vector<PipeAction> actions_, performed_;
  std::map<int, int> slots_;         // (micro, chunk) key -> activation slot
  std::vector<int> free_slots_;
  std::map<int, MicroBatch> batches_;  // in-flight micro-batches
  const std::function<MicroBatch(int)>* batch_fn_ = nullptr;
  std::map<int, Tensor> grad_in_;    // key -> received output gradient (B,T,C)
  std::map<int, Tensor> grad_out_;   // key -> input gradient waiting for its SendBackward
  float loss_weight_ = 0;
  DropoutKey key_;
  double loss_sum_ = 0;
};

}  // namespace ds
