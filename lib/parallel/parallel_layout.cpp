// make_parallel_layout: the world split into TP x Ulysses x DP x PP (DP = EP x EDP), with the
// size checks every tool shares (messages name the config key and the flag).
#include "lib/parallel/parallel_layout.h"

#include <fmt/format.h>

#include "lib/core/error.h"

namespace ds {

namespace {

constexpr int kMaxSize = 1 << 16;  // any one parallel size

}  // namespace

ParallelLayout make_parallel_layout(const ParallelRequest& r, int world, int num_layers, int64_t seq_length) {
  DS_USER_CHECK(world > 0, "world size must be positive, got {}", world);
  DS_USER_CHECK(r.tp > 0 && r.pp > 0 && r.ulysses > 0,
                "parallel: tensor_model_parallel_size {}, pipeline_model_parallel_size {} and "
                "ds_sequence_parallel_size {} must be positive", r.tp, r.pp, r.ulysses);
  DS_USER_CHECK(r.tp <= kMaxSize && r.pp <= kMaxSize && r.ulysses <= kMaxSize,
                "parallel: tensor_model_parallel_size {}, pipeline_model_parallel_size {} and "
                "ds_sequence_parallel_size {} must be at most {}", r.tp, r.pp, r.ulysses, kMaxSize);
  const int64_t replica = int64_t{r.tp} * r.pp * r.ulysses;
  DS_USER_CHECK(world % replica == 0,
                "world size {} is not divisible by tensor_model_parallel_size {} * pipeline_model_parallel_size {} "
                "* ds_sequence_parallel_size {} (--tensor-model-parallel-size / --pipeline-model-parallel-size / "
                "--ds-sequence-parallel-size)",
                world, r.tp, r.pp, r.ulysses);
  ParallelLayout l;
  l.world = world;
  l.tp = r.tp;
  l.pp = r.pp;
  l.ulysses = r.ulysses;
  l.dp = static_cast<int>(world / replica);
  DS_USER_CHECK(r.ep >= 1, "--moe-expert-parallel-size (model.moe.expert_parallel_size) must be positive, got {}",
                r.ep);
  DS_USER_CHECK(l.dp % r.ep == 0,
                "--moe-expert-parallel-size {} does not divide the data-parallel size {} (world {} / (TP {} x PP {} "
                "x Ulysses {})) (model.moe.expert_parallel_size)", r.ep, l.dp, world, r.tp, r.pp, r.ulysses);
  l.ep = r.ep;
  l.sequence_parallel = r.sequence_parallel && r.tp > 1;  // as Megatron: nothing to split with one tp rank
  l.layers_per_virtual_stage = r.layers_per_virtual_stage;
  l.seq_length = seq_length;
  if (num_layers > 0) {
    DS_USER_CHECK(num_layers % r.pp == 0,
                  "model.num_layers {} is not divisible by pipeline_model_parallel_size {} (--num-layers / "
                  "--pipeline-model-parallel-size)", num_layers, r.pp);
    const int per_stage = num_layers / r.pp;
    if (r.layers_per_virtual_stage != 0) {
      DS_USER_CHECK(r.layers_per_virtual_stage > 0 && r.pp > 1,
                    "parallel.num_layers_per_virtual_pipeline_stage {} needs pipeline_model_parallel_size > 1 (got "
                    "{})", r.layers_per_virtual_stage, r.pp);
      DS_USER_CHECK(per_stage % r.layers_per_virtual_stage == 0,
                    "layers per pipeline stage {} (num_layers {} / pp {}) is not divisible by "
                    "num_layers_per_virtual_pipeline_stage {}",
                    per_stage, num_layers, r.pp, r.layers_per_virtual_stage);
      l.vp = per_stage / r.layers_per_virtual_stage;
    }
  }
  return l;
}

std::string ParallelLayout::describe() const {
  std::string s = fmt::format("TP={} PP={} DP={}", tp, pp, dp);
  if (ulysses > 1) s += fmt::format(" Ulysses={} (sequence-data-parallel {})", ulysses, sdp());
  if (sequence_parallel) s += " SP";
  if (vp > 1) s += fmt::format(" VP={}", vp);
  if (ep > 1) s += fmt::format(" EP={}", ep);
  return s;
}

}  // namespace ds
