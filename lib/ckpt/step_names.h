// File and directory names inside a checkpoint directory, shared by the
// writer (checkpoint.cpp) and the readers (step_files.cpp, reshape.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "lib/parallel/shard_coords.h"

namespace ds {

// The step directory name for an iteration: "global_step<N>".
std::string step_dir_name(int64_t iteration);
// Optimizer shard file name of ZeRO shard `rank` of `world` of model shard s:
// optim_rankRRRRR_of_WWWWW.safetensors (tp 1) or
// optim_tpTT_rankRRRRR_of_WWWWW.safetensors; with pp > 1
// optim_ppPP_tpTT_rankRRRRR_of_WWWWW.safetensors; with expert parallelism
// (ep > 1: each expert-parallel rank's state holds its own experts)
// optim_ppPP_tpTT_epEE_rankRRRRR_of_WWWWW.safetensors.
std::string optimizer_shard_name(int rank, int world, const ShardCoords& s = {});

}  // namespace ds
