// Data-parallel gradient reduction and the optimizer step for ZeRO stages 0-2.
//   stage 0: bucketed all-reduce of gradients, every rank updates everything.
//   stage 1: same reduction; each rank keeps Adam state for its shard only,
//            updates that shard and all-gathers the parameters.
//   stage 2: bucketed reduce-scatter: each rank receives only its shard of
//            the summed gradients; then as stage 1.
// The flat buffers are padded to a multiple of dp * align (ZeroPartition), so
// every collective works on equal chunks. The 1/dp averaging is folded into
// the loss weight by the trainer.
#pragma once
#include <memory>

#include "lib/comm/communicator.h"
#include "lib/model/gpt.h"
#include "lib/optim/adamw.h"
#include "lib/parallel/zero_partition.h"
#include "lib/train/config.h"

namespace ds {

class ZeroOptimizer {
 public:
  // dp may be null for a single data-parallel rank.
  ZeroOptimizer(GptModel& model, Communicator* dp, const ZeroConfig& z, const ZeroPartition& part);

  // Sums gradients over the data-parallel group (as the stage requires) and
  // returns the global gradient L2 norm.
  double reduce_gradients();
  // AdamW on this rank's range, then (stage >= 1) parameters all-gathered.
  void step(const AdamWHyper& h, float grad_scale);

  AdamW& adam() { return *adam_; }
  Range optimizer_range() const { return range_; }  // unpadded, may be empty
  // Bytes of model state this rank holds (params, grads, Adam m and v).
  int64_t model_state_bytes() const;

 private:
  void all_gather_params();

  GptModel& model_;
  Communicator* dp_;
  ZeroConfig z_;
  ZeroPartition part_;
  int rank_ = 0;
  Range range_;
  std::unique_ptr<AdamW> adam_;
};

}  // namespace ds
