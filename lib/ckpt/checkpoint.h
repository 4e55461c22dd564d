// Training checkpoints: DIR/global_stepN/ holds the model weights, this rank's
// optimizer shard, and state.json (iteration, consumed samples, config). The
// step directory is written under a temporary name, fsynced, and renamed; the
// `latest` file is replaced (temp + rename) only after that, so a crash never
// leaves `latest` pointing at a partial checkpoint. Committing records the
// CRC-32C of every file in state.json; loading verifies the files it reads
// against them, checks every field of state.json and of the optimizer shards,
// and refuses weights or moments holding NaN/Inf (docs/formats.md).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/ckpt/state_json.h"
#include "lib/ckpt/step_tokenizer.h"
#include "lib/ckpt/step_names.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"

namespace ds {

// TrainState (iteration, consumed samples, loss scale...) is in lib/ckpt/state_json.h.

// One optimizer state tensor of a rank's range, named as its optimizer
// declares it (OptimizerStateSpec: Adam's "exp_avg" and "exp_avg_sq").
// non_negative: a mean of squares, so a negative value means a corrupt file.
struct OptimizerStateTensor {
  std::string name;
  Tensor t;
  bool non_negative = false;
};
using OptimizerStates = std::vector<OptimizerStateTensor>;
// Adam's two moments, as AdamW declares them.
OptimizerStates adam_states(const Tensor& m, const Tensor& v);
// "exp_avg, exp_avg_sq": the names, for messages.
std::string state_names(const OptimizerStates& s);

// What one rank saves / restores. Tensors may live on any device.
struct CheckpointData {
  const ModelLayout* layout = nullptr;
  Tensor params;              // (layout.total) f32: the full model (rank 0 writes it)
  // This rank's optimizer state over [opt_begin, opt_end), in the
  // optimizer's order. Loading fills each tensor from the state of the same
  // name (a checkpoint holding other state names is refused).
  OptimizerStates opt_state;
  int64_t opt_begin = 0, opt_end = 0;
  int64_t opt_step = 0;       // the optimizer's step count
  int rank = 0, world = 1;    // optimizer shard index and count
  // Model parallelism: `layout` / `params` are the FULL model (tp = 1, pp = 1
  // layout, as a single process saves it), the moments cover [opt_begin,
  // opt_end) of this shard's local layout `opt_layout` (its tp rank and
  // pipeline stage), and shard files are named per (pp_rank, tp_rank). Another
  // tp / pp / vp is reshaped on load (needs `model`).
  const ModelLayout* opt_layout = nullptr;  // null: `layout`
  ShardCoords shard;
  // The model config of `layout` (its padded vocabulary included). When set,
  // a checkpoint saved with another tp / pp (or padded vocabulary) is reshaped on
  // load (lib/ckpt/reshape.h); when null such a checkpoint is refused.
  const ModelConfig* model = nullptr;
  // The run's tokenizer files, copied by the rank that writes the model into
  // the step directory (state.json "tokenizer" names them). Null: none.
  const StepTokenizer* tokenizer = nullptr;
  // The optimizer's type (Optimizer::type(): "AdamW", "Lamb", ...), recorded in
  // each shard; loading refuses a checkpoint of another type. Empty: not
  // recorded (saving) / not checked (loading).
  std::string opt_type;
  // The optimizer's per-tensor values beside its state tensors
  // (Optimizer::saved_scalars: 1-bit Lamb's compression stage), "" for none.
  // Saved as shard metadata; loading fills it from this rank's shard, and
  // refuses a reshaped load of a checkpoint that has them.
  std::string opt_scalars;
  // Loading only, instead of `params`: called once, after the training and
  // optimizer state passed their checks, with a reader of any range
  // [begin, end) of this rank's shard layout (`opt_layout`, else `layout`)
  // from the saved model, so that a rank reads what it keeps
  // (ParamStore::init_params) and never the whole model. The model file is
  // checksummed as it is read and verified after (one pass over the disk):
  // when the load then fails, the receiver may hold part of the values (the
  // trainer stops on a failed load); `params` is staged and never is.
  using ParamsReader = std::function<void(int64_t begin, int64_t end, float* out)>;
  std::function<void(const ParamsReader&)> receive_params;
  // Loading only: read the weights and the training state, not the optimizer
  // state (opt_state and opt_step are left as they are; the shards are not
  // opened, so a checkpoint of another optimizer loads too).
  bool weights_only = false;
  // Saving only, instead of `params` on the rank that writes the model:
  // the full f32 weight `name` (host), asked for once per weight in the
  // order of model_file_order(*layout), so that the file is written one
  // weight at a time (FullTensorStream, model_state.h) and the whole model
  // never sits on one rank.
  std::function<Tensor(const std::string& name)> stream_params;
  // Several sharding groups (ZeRO-1 with expert parallelism), instead of
  // opt_state / opt_begin / opt_end: per group its name, the flat pieces of
  // the local layout its state tensors hold one after the other, and those
  // tensors by name; ep_shared: the group's weights are the same on every
  // expert-parallel rank (its partition spans them). docs/formats.md.
  // A storage tier's state (see tier_read below): elements [lo, hi) of state i.
  using TierRead = std::function<void(size_t i, int64_t lo, int64_t hi, float* out)>;
  using TierWrite = std::function<void(size_t i, int64_t lo, int64_t hi, const float* in)>;
  struct StatePart {
    std::string group;
    bool ep_shared = false;
    std::vector<Range> pieces;
    OptimizerStates states;
    // The group's state in a storage tier (positions relative to the
    // pieces laid one after the other), as tier_read / tier_write below.
    TierRead tier_read;
    TierWrite tier_write;
  };
  std::vector<StatePart> opt_parts;
  // The optimizer state lives in a storage tier (offload_optimizer nvme)
  // instead of opt_state's tensors (left undefined): saving reads elements
  // [lo, hi) of state i (relative to opt_begin) through tier_read, loading
  // writes them through tier_write, a bounded piece at a time, so the
  // rank's state is never whole in memory (a reshaping load excepted: it
  // assembles the range first, reshape.h). With opt_parts: each part's own.
  TierRead tier_read;
  TierWrite tier_write;
};

// The weights of `full` in the order model.safetensors holds them.
std::vector<std::string> model_file_order(const ModelLayout& full);

// Saving is two phases so that several ranks can share one step directory:
// every rank calls write_checkpoint_files (rank 0 also writes the model and
// state.json) into the temporary step directory, then after a barrier rank 0
// calls commit_checkpoint, which renames it into place and updates `latest`.
// Before the first phase one process removes what killed saves left in dir
// (remove_stale_temporaries, lib/ckpt/file_io.h), so that no partial file of
// theirs is committed with this step.
void write_checkpoint_files(const std::string& dir, const TrainState& st, const CheckpointData& d,
                            const nlohmann::json& config);
void commit_checkpoint(const std::string& dir, int64_t iteration);
// Single process: the stale temporaries, then both phases.
void save_checkpoint(const std::string& dir, const TrainState& st, const CheckpointData& d,
                     const nlohmann::json& config);

// Reads `latest` under dir; returns false if dir has no checkpoint. On any
// mismatch (layout, shapes, missing shard, truncated or corrupt file, checksum,
// NaN/Inf) throws UserError naming the file before touching the destination
// weights (host f32 optimizer state is read into in place, so a failed load
// may leave it partly written; the run stops with the error). Each file is
// read once, checksummed as it is read. A write error (e.g. a full disk)
// while saving is a UserError naming the path, and the temporary step
// directory is removed.
bool load_checkpoint(const std::string& dir, TrainState& st, CheckpointData& d);

}  // namespace ds
