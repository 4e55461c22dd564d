// Pipeline-parallel executor: runs one global batch of a pipeline stage by
// walking its 1F1B (interleaved 1F1B, ZB-H1) action list
// (lib/parallel/pipeline_schedule.h). Forward and Backward run one model
// chunk of this stage on one micro-batch, with one activation set per
// in-flight (micro-batch, chunk) (at most max_live_activations). The
// send/receive actions are posted as asynchronous batches
// (Communicator::ibatch_send_recv) following make_p2p_plan
// (lib/parallel/pipeline_p2p_plan.h), and a compute waits only for the
// batches it needs. With overlap, receives are posted ahead of the compute
// that needs them (1F1B: each one compute earlier; interleaved: the
// steady state's forward and backward halves of each exchange one compute
// earlier), activations and gradients on two communicators (two queues) so
// that neither waits behind the other. Activations (B, T, C) go to the next
// virtual stage, their gradients back.
#pragma once
#include <functional>
#include <map>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/model/gpt.h"
#include "lib/parallel/pipeline_schedule.h"
#include "lib/parallel/pipeline_p2p_plan.h"
#include "lib/runtime/micro_batch.h"
#include "lib/runtime/passes.h"
#include "lib/runtime/timeline.h"

namespace ds {

class PipelineExecutor final : public Passes {
 public:
  // pp: this pipeline's communicator (group rank = stage). n_micro: the
  // micro-batches of one global batch (gradient accumulation steps). The
  // model's layout gives the virtual stages (vp > 1: interleaved 1F1B).
  // overlap (zero_optimization.overlap_comm): post receives ahead of their
  // computes (make_p2p_plan), gradients on `pp_grad` (a second communicator
  // over the same ranks, required then); 1F1B and interleaved. Results are
  // bit-identical either way. zbh1 / zbh1_exact: the ZB-H1 schedule instead
  // of 1F1B (no virtual stages): its input passes leave the layers' weight
  // gradients to its weight passes (GptModel::stage_weight_grads).
  PipelineExecutor(GptModel& model, Communicator& pp, int n_micro, Communicator* pp_grad = nullptr,
                   bool overlap = false, bool zbh1 = false, bool zbh1_exact = false);
  ScheduleKind kind() const { return kind_; }
  bool overlapping() const { return overlap_; }
  // Records each compute's span and each batch's begin/end (profiling, tests).
  void set_timeline(Timeline* t) { timeline_ = t; }
  // 1F1B: called right before the stage's last backward, the one after which
  // every gradient of the stage is final (ZeroOptimizer::begin_last_micro_batch
  // arms the bucket reductions). Not called for the interleaved schedule,
  // where a chunk's last backward comes before the others'.
  void set_last_backward_hook(std::function<void()> hook) { last_backward_hook_ = std::move(hook); }

  // Forward + backward of one global batch; batch(m) returns micro-batch m
  // (every stage reads it: the first needs the tokens, the last the targets).
  // Gradients are ADDED to the model's. Returns the sum of the micro-batch
  // losses on the last stage, 0 elsewhere. `key` (seed, iteration) keys the
  // dropout masks, each micro-batch at its first_sample.
  double train(const MicroBatchFeed& batch, float loss_weight, const DropoutKey& key = {});
  // Passes: the same, for n = the constructor's n_micro.
  void train(const MicroBatchFeed& feed, int n, float loss_weight, const DropoutKey& key) override;
  // Forward only over n micro-batches (evaluation), one after another.
  // Returns the sum of the losses on the last stage, 0 elsewhere.
  double forward_only(const MicroBatchFeed& batch, int n) override;

  int max_live() const { return max_live_; }
  const std::vector<PipeAction>& actions() const { return actions_; }
  // Actions as performed by the last train(): computes in schedule order,
  // sends and receives when their batch was posted (the plan's order).
  const std::vector<PipeAction>& performed() const { return performed_; }

 private:
  // Issues one batch of the plan. Received activations land in a buffer of
  // their own (fwd_in_), copied into the slot by the forward: with early
  // receives a slot may still be in use when its next input arrives.
  CommHandle post(const P2PPlanStep& step);
  // One blocking exchange of one element with every pipeline neighbour on
  // `comm` (see the constructor).
  void connect_links(Communicator& comm);
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
  Communicator* pp_grad_ = nullptr;
  bool overlap_ = false;
  std::vector<P2PPlanStep> plan_;
  std::vector<CommHandle> posted_;   // this train()'s batches, in plan order
  Timeline* timeline_ = nullptr;
  std::function<void()> last_backward_hook_;
  std::map<int, int> slots_;         // (micro, chunk) key -> activation slot
  std::vector<int> free_slots_;
  std::map<int, MicroBatch> batches_;  // in-flight micro-batches
  const std::function<MicroBatch(int)>* batch_fn_ = nullptr;
  std::map<int, Tensor> fwd_in_;     // key -> received input activations (B,T,C)
  std::map<int, Tensor> grad_in_;    // key -> received output gradient (B,T,C)
  std::map<int, Tensor> grad_out_;   // key -> input gradient waiting for its SendBackward
  float loss_weight_ = 0;
  DropoutKey key_;
  double loss_sum_ = 0;
};

}  // namespace ds
