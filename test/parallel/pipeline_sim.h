// The pipeline simulator: plays every rank's action list of one global batch
// (lib/parallel/pipeline_schedule.h) against the others over in-order
// point-to-point channels and reports deadlocks, mismatched messages, peak
// live activations and the bubble. Test-only: it checks the schedules and the
// executor's lists on CPU without communicating.
#pragma once
#include <vector>

#include "lib/parallel/pipeline_schedule.h"

namespace ds {

// Batched: consecutive send/receive actions are posted together and complete
// when every one has met its peer (rendezvous, as NCCL group p2p).
// Buffered: a send completes at once; a receive blocks until its message is
// there; actions run one at a time in list order.
// In both, the WeightGrad passes right after a batch run while it is in
// flight (they read nothing a message carries), as the executor runs them.
enum class CommModel { Batched, Buffered };

struct PipelineSimOptions {
  CommModel comm = CommModel::Batched;
  double forward_cost = 1.0;   // time units per Forward of one chunk
  double backward_cost = 2.0;  // per Backward of one chunk
  // Zero-bubble schedules: BackwardInput and WeightGrad (their sum is a Backward).
  double backward_input_cost = 1.0;
  double weight_cost = 1.0;
};

struct TimedAction {
  double start = 0;
  PipeAction action;
};

struct PipelineSimResult {
  std::vector<int> peak_live;                       // per rank: most live activations
  std::vector<int> forwards_before_first_backward;  // per rank
  std::vector<std::vector<TimedAction>> trace;      // per rank: compute actions with start time
  double makespan = 0;                              // end of the last action
  double ideal = 0;                                 // n_micro * v * (forward + backward cost)
  double bubble() const { return ideal > 0 ? makespan / ideal - 1.0 : 0.0; }
};

// Runs the per-rank action lists (index = pipeline rank) of one global batch
// against each other over FIFO channels between neighbouring virtual stages.
// Throws ds::Error naming the first violation: deadlock (with each blocked
// rank's action), a receive matched to a different (micro, chunk) than sent,
// a message never received, a compute action repeated or missing, a Forward
// without its input, a Backward before its Forward or without its gradient,
// a send of data not yet computed, or a send/receive a virtual stage must not
// do (the first stage receives no activations, the last sends none).
PipelineSimResult simulate_pipeline(const std::vector<std::vector<PipeAction>>& per_rank,
                                    int n_micro, int virtual_stages,
                                    const PipelineSimOptions& options = {});

}  // namespace ds
