// Training checkpoints: DIR/global_stepN/ holds the model weights, this rank's
// optimizer shard, and state.json (iteration, consumed samples, config). The
// step directory is written under a temporary name, fsynced, and renamed; the
// `latest` file is replaced (temp + rename) only after that, so a crash never
// leaves `latest` pointing at a partial checkpoint.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/core/tensor.h"
#include "lib/model/layout.h"

namespace ds {

struct TrainState {
  int64_t iteration = 0;          // optimizer steps completed
  int64_t consumed_samples = 0;   // training samples consumed (data position)
  int64_t skipped_steps = 0;      // fp16 overflow skips
  double loss_scale = 1.0;
  int64_t good_steps = 0;         // steps since the last scale change (fp16)
  int64_t hysteresis_left = 0;
};

// What one rank saves / restores. Tensors may live on any device.
struct CheckpointData {
  const ModelLayout* layout = nullptr;
  Tensor params;              // (layout.total) f32: the full model (rank 0 writes it)
  Tensor m, v;                // this rank's optimizer moments over [opt_begin, opt_end)
  int64_t opt_begin = 0, opt_end = 0;
  int64_t opt_step = 0;       // Adam step count
  int rank = 0, world = 1;    // optimizer shard index and count
  // Tensor parallelism: `layout` / `params` are the FULL model (tp = 1 layout,
  // as a single process saves it), the moments cover [opt_begin, opt_end) of
  // this tp rank's local layout `opt_layout`; shards are named per tp rank.
  const ModelLayout* opt_layout = nullptr;  // null: `layout`
  int tp = 1, tp_rank = 0;
  // Pipeline parallelism: as tp; the moments cover this stage's local layout
  // and shards are named per pipeline rank too. Another pp / vp is reshaped
  // like another tp (needs `model`).
  int pp = 1, pp_rank = 0, vp = 1;  // vp: virtual pipeline stages per rank
  // The model config of `layout` (its padded vocabulary included). When set,
  // a checkpoint saved with another tp / pp (or padded vocabulary) is reshaped on
  // load (lib/ckpt/reshape.h); when null such a checkpoint is refused.
  const ModelConfig* model = nullptr;
};

// Saving is two phases so that several ranks can share one step directory:
// every rank calls write_checkpoint_files (rank 0 also writes the model and
// state.json) into the temporary step directory, then after a barrier rank 0
// calls commit_checkpoint, which renames it into place and updates `latest`.
void write_checkpoint_files(const std::string& dir, const TrainState& st, const CheckpointData& d,
                            const nlohmann::json& config);
void commit_checkpoint(const std::string& dir, int64_t iteration);
// Single process: both phases.
void save_checkpoint(const std::string& dir, const TrainState& st, const CheckpointData& d,
                     const nlohmann::json& config);

// Reads `latest` under dir; returns false if dir has no checkpoint. On any
// mismatch (layout, shapes, missing shard, truncated file) throws UserError
// before touching the destination tensors.
bool load_checkpoint(const std::string& dir, TrainState& st, CheckpointData& d);

// The step directory name for an iteration: "global_step<N>".
std::string step_dir_name(int64_t iteration);
// Optimizer shard file name: optim_rankRRRRR_of_WWWWW.safetensors (tp 1) or
// optim_tpTT_rankRRRRR_of_WWWWW.safetensors; with pp > 1
// optim_ppPP_tpTT_rankRRRRR_of_WWWWW.safetensors.
std::string optimizer_shard_name(int rank, int world, int tp = 1, int tp_rank = 0, int pp = 1, int pp_rank = 0);

}  // namespace ds
