// One rank's model state as checkpoints and exports see it: the full model
// (the tp = 1, pp = 1 layout a single process saves) gathered from this
// rank's shard one weight at a time, and the CheckpointData that names the
// rank's optimizer range and place in the grid. The gathers are collective
// over the tensor-, pipeline-, expert- and (ZeRO-3) data-parallel groups.
#pragma once
#include <map>
#include <string>

#include "lib/ckpt/checkpoint.h"
#include "lib/model/gpt.h"
#include "lib/optim/optimizer.h"
#include "lib/parallel/comms.h"
#include "lib/parallel/shard_coords.h"

namespace ds {

struct RankModel {
  const ModelConfig* config = nullptr;
  GptModel* model = nullptr;        // this rank's shard (flat buffers or a ZeRO store)
  Comms* comms = nullptr;
  ShardCoords shard;
  int dp_rank = 0;
  const ModelLayout* full = nullptr;  // build_layout(*config)
};

// The full model one weight at a time, for a save that never holds the
// whole model on one rank: every rank makes one and calls next() with the
// same names in the same order (model_file_order). next(name) gathers that
// weight on the stage that holds it (a tied wte: the first stage's): its
// f32 values from the data-parallel shards where the store keeps only a
// shard (ZeRO-3, sharded masters; ParamStore::gather_f32), then over the
// tensor-parallel ranks of the first data-parallel replica (an expert weight:
// over the expert-parallel ranks of the first expert-parallel group), and sends it to
// global rank 0, which gets the full f32 weight in host memory (undefined
// elsewhere). Each rank holds at most two copies of one weight at once.
class FullTensorStream {
 public:
  explicit FullTensorStream(const RankModel& r);
  Tensor next(const std::string& name);

 private:
  RankModel r_;
  std::map<std::string, int> owner_;  // weight -> the first pipeline stage holding it
};

// The optimizer's state tensors by name, as a checkpoint saves them; a state
// that lives elsewhere (a storage tier) is an empty placeholder, read and
// written through CheckpointData's tier_read / tier_write.
OptimizerStates checkpoint_states(Optimizer& opt);

// What this rank saves or restores: the full parameters `params` (undefined
// on ranks that write no weights), the optimizer state of `opt_range` of the
// local layout (every state the optimizer declares, by name), shard `shard_index` of `shards` optimizer files of this
// model shard.
CheckpointData rank_checkpoint(const RankModel& r, const Tensor& params, Optimizer& opt, Range opt_range,
                               int shard_index, int shards);

}  // namespace ds
