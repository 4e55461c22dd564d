// Checkpoint file and directory names (step_names.h).
#include "lib/ckpt/step_names.h"

#include <fmt/format.h>

namespace ds {

std::string step_dir_name(int64_t iteration) { return "global_step" + std::to_string(iteration); }

std::string optimizer_shard_name(int rank, int world, const ShardCoords& s) {
  if (s.ep > 1)
    return fmt::format("optim_pp{:02d}_tp{:02d}_ep{:02d}_rank{:05d}_of_{:05d}.safetensors", s.pp_rank, s.tp_rank,
                       s.ep_rank, rank, world);
  if (s.pp > 1)
    return fmt::format("optim_pp{:02d}_tp{:02d}_rank{:05d}_of_{:05d}.safetensors", s.pp_rank, s.tp_rank, rank, world);
  if (s.tp > 1) return fmt::format("optim_tp{:02d}_rank{:05d}_of_{:05d}.safetensors", s.tp_rank, rank, world);
  return fmt::format("optim_rank{:05d}_of_{:05d}.safetensors", rank, world);
}

}  // namespace ds
