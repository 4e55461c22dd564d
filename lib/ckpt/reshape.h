// Checkpoint reshaping across tensor-, pipeline- and data-parallel layouts. A
// step directory saved with (TP a, PP b, virtual stages, DP/ZeRO any) is read
// into any other: the optimizer shards of every source (pp, tp) rank are
// assembled into the FULL optimizer state (single-process layout, the one
// model.safetensors uses), then the target stage's tp-rank slice and optimizer
// range are cut from it. A tied embedding's state lives on the first and the
// last stage; it is taken from the first (the copies are identical: both take
// the same step after the embedding-group all-reduce of their gradients). The source
// layouts are rebuilt with build_layout from the target model config and the
// saved padded vocabulary (Megatron pads the vocabulary per TP size; padded
// rows never touch the loss, so they are cut or zero-filled).
//
// Memory: a load holds a few full-model f32 host buffers (full m and v, the
// vocabulary-adapted copies, one source tp rank's local m and v at a time);
// fine at the model sizes the CPU path trains, and the price of a TP change
// only (a same-layout load reads just the overlapping shards).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/safetensors.h"
#include "lib/ckpt/state_json.h"
#include "lib/core/progress.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/model/model_config.h"

namespace ds {

// A saved step directory, read and checked against a model config.
struct SavedStep {
  std::filesystem::path dir;  // DIR/global_stepN
  StepState state;            // state.json, validated
  ShardCoords sizes;          // tp, pp and vp it was saved with (ranks 0)
  int shards = 1;             // optimizer shards per (pp, tp) rank
  ModelConfig model;          // the given model config with the saved padded vocabulary
  ModelLayout full;           // its full (tp 1) layout, as saved
  // When set, the bytes of the files read (checksummed) are counted here, and
  // each optimizer shard's size is added to its total when the shard is read.
  Progress* progress = nullptr;
  // The files whose checksums were verified (shared by copies): each is
  // verified once however many ranges are read from it (dsconvert).
  std::shared_ptr<std::set<std::string>> verified = std::make_shared<std::set<std::string>>();
};

// DIR/global_stepN: `tag` if given, else the one DIR/latest names. "" when
// there is no tag and no `latest` (no checkpoint). The tag (or `latest`'s one
// line) must be global_step<digits>: a step directory inside DIR, nothing
// else. UserError naming the path when it is malformed or missing.
std::string find_step_dir(const std::string& dir, const std::string& tag = "");
// Reads and validates state.json of a step directory (lib/ckpt/state_json.h).
// UserError naming it and the field if missing, corrupt or out of range. A
// checkpoint without checksums (an older dstrain) is loaded with a warning.
StepState read_step_state(const std::filesystem::path& step);
// Checks file `name` of the step directory against its CRC-32C in state.json
// (nothing to check for an older checkpoint without checksums). UserError
// naming the file on a mismatch.
void verify_step_file(const std::filesystem::path& step, const StepState& st, const std::string& name,
                      Progress* progress = nullptr);
// The single-pass form for files read as safetensors (checkpoint loads):
// track_step_file makes f checksum its reads as they arrive (nothing for an
// older checkpoint without checksums); verify_step_reads, once the reads are
// done, checksums what they did not cover and compares the whole file's
// CRC-32C with state.json's, with verify_step_file's error.
void track_step_file(const std::filesystem::path& step, const StepState& st, const std::string& name,
                     SafetensorsFile& f, Progress* progress = nullptr);
void verify_step_reads(const std::filesystem::path& step, const StepState& st, const std::string& name,
                       const SafetensorsFile& f);
// UserError naming the file and tensor if t (host f32) holds NaN or Inf, or,
// with non_negative, a negative value.
void check_finite(const Tensor& t, const std::string& file, const std::string& tensor, bool non_negative = false);
// Reads state.json and rebuilds the saved layout from `model` (its padded
// vocabulary replaced by the saved one). A checkpoint of a different model
// (other weights or shapes) is a UserError naming the first difference.
SavedStep open_saved_step(const std::string& step_dir, const ModelConfig& model);
// The same for a state.json already read with read_step_state.
SavedStep open_saved_step(const std::string& step_dir, StepState state, const ModelConfig& model);
// A UserError naming the checkpoint `where` when the real vocabulary size in its
// saved config differs from model.vocab_size (a different tokenizer), or its
// attention or key-value head count differs from the model's (same shapes,
// different model).
void check_saved_vocab(const StepState& state, const ModelConfig& model, const std::string& where);
// Whether the run that saved `state` split its experts over tp
// (--enable-expert-tensor-parallelism, recorded in its model config; false
// when not recorded): its shards' layouts depend on it.
bool saved_expert_tp(const StepState& state);

// The saved full model, adapted to `target_full` (vocabulary rows cut or
// zero-padded): out is a host f32 tensor of target_full.total. The file is
// read once, checksummed as it is read and verified at the end.
Tensor read_full_params(const SavedStep& s, const ModelLayout& target_full);
// The same into `out` (target_full.total host f32 elements).
void read_full_params_into(const SavedStep& s, const ModelLayout& target_full, float* out);
// One weight of target_full (target_full.find(name).numel elements) into
// out: the saved weight, its vocabulary rows cut or zero-filled.
void read_full_weight(const SavedStep& s, const SafetensorsFile& model, const ModelLayout& target_full,
                      const std::string& name, float* out);
// model.safetensors of the step, its checksum verified and every weight of
// s.full checked present as F32 of its saved shape (nothing read yet).
SafetensorsFile open_saved_model(const SavedStep& s);
// The same without the checksum pass: the reads are checksummed as they
// arrive, and verify_saved_model checks the whole file once they are done.
SafetensorsFile open_saved_model_tracked(const SavedStep& s);
void verify_saved_model(const SavedStep& s, const SafetensorsFile& model);
// Elements [begin, end) of the shard layout `local` (a tp rank and stage of
// the target model) read from the saved model into host `out`: each element
// from its place in the saved full weight, vocabulary rows the saved model
// lacks as zero. Reads only those elements (a rank loads its shard, or its
// ZeRO-3 partition, without the whole model in memory). UserError naming the
// file and weight on NaN/Inf, or a weight of another shape.
void read_local_params(const SavedStep& s, const SafetensorsFile& model, const ModelLayout& local, int64_t begin,
                       int64_t end, float* out);

// The optimizer state names the step's shards hold, in the saving
// optimizer's order (shard metadata "states"; a shard written before it
// holds Adam's exp_avg and exp_avg_sq). Tensors are undefined.
OptimizerStates saved_state_names(const SavedStep& s);
// The optimizer type the step's shards record (metadata "optimizer"; a shard
// written before it was recorded: "AdamW", the only optimizer then).
std::string saved_optimizer_type(const SavedStep& s);
// The optimizer's per-tensor values (Optimizer::saved_scalars) that the first
// optimizer file of shard `at` records (metadata "optimizer_scalars"), ""
// when it records none.
std::string saved_optimizer_scalars(const SavedStep& s, const ShardCoords& at);
// UserError naming the step when the optimizer type `type` (unless empty)
// differs from saved_optimizer_type(s), or the state names `want` (an
// optimizer's) differ from saved_state_names(s): saved with another optimizer.
void check_saved_states(const SavedStep& s, const OptimizerStates& want, const std::string& type = "");

// One saved (pp, tp, ep) shard's optimizer files, opened and checked (every
// file's metadata and state headers; the files' pieces tile the shard's
// local layout of local_total elements). read() reads a range of one state,
// checksumming the bytes as they arrive (SafetensorsFile::track_reads);
// verify() then checks the checksum of every file read from (reading what
// the reads did not cover), so each file is read once. Call it when the reads
// are done: a value read is trusted only after it.
// A file holds one range [begin, end) of the local layout (one sharding
// group), or, saved with several sharding groups (ZeRO-1 with expert
// parallelism, docs/formats.md), per group a list of pieces whose state is
// the tensor "<group>/<state>"; a group the file lists as shared (the dense
// weights: the same for every expert-parallel rank) is partitioned over the
// files of every expert-parallel rank, so those are opened too.
class SavedStateFiles {
 public:
  SavedStateFiles(const SavedStep& s, const ShardCoords& at, int64_t local_total, const OptimizerStates& names);
  // Elements [lo, hi) of the shard's local state names[state] into dst.
  void read(size_t state, int64_t lo, int64_t hi, float* dst);
  // The checksums of the files read from; UserError naming a corrupt one.
  void verify();
  int64_t step() const { return step_; }  // the optimizer step count

 private:
  struct File {
    SafetensorsFile sf;
    std::string name;
    bool verified = false;  // its checksum was checked (or need not be: s_.verified)
    bool tracked = false;   // its reads are being checksummed
  };
  void verify(File& f);
  struct Piece {
    size_t file = 0;
    std::string prefix;    // "" or "<group>/": the state tensors' name prefix
    int64_t b = 0, e = 0;  // the local range it holds
    int64_t at = 0;        // its first element's offset in the state tensor
  };
  void open_file(const ShardCoords& at, int r, int64_t local_total, bool own_ep);
  const SavedStep& s_;
  OptimizerStates names_;
  std::vector<File> files_;
  std::vector<Piece> pieces_;  // sorted by range
  int64_t step_ = 0;
};

// Reads [begin, end) of shard `at`'s (s.sizes at a pp, tp and ep rank) local optimizer state
// (local_total elements) from the s.shards optimizer files of that rank:
// each entry of `state` by its name, into its tensor (a host f32 of
// end - begin, prepare_host_states). Returns the optimizer step count. UserError naming the
// shard on a missing file, a checksum mismatch, malformed metadata, a tensor
// of another dtype or shape, NaN/Inf (or a negative value in a non_negative
// state), ranges that overlap or leave a gap.
int64_t read_state_range(const SavedStep& s, const ShardCoords& at, int64_t local_total, int64_t begin, int64_t end,
                         OptimizerStates& state);

// The host buffers the two readers fill, n f32 elements per state, zeroed:
// a tensor of `state` that already is one (contiguous host f32 of n
// elements, such as the optimizer's own state on the CPU backend; tensors
// are contiguous) is read
// into in place, so loading holds no second copy of the rank's state; any
// other is replaced by a new one. zero false: the caller writes every
// element (the buffers are left as they are).
void prepare_host_states(OptimizerStates& state, int64_t n, bool zero = true);
// The names of `state` with no tensors (nothing to read into in place).
OptimizerStates state_names_only(const OptimizerStates& state);

// [begin, end) of a target shard's local optimizer state (layout `local`,
// whose full layout `full` may pad the vocabulary otherwise than the saved
// one) from a checkpoint of any layout: only the byte ranges of the saved
// shards' files that hold those elements are read, one saved shard's files
// open at a time, so a rank holds its range and never the whole model's
// state. Every entry of `state` by its name (host f32 of end - begin,
// prepare_host_states).
// Returns the optimizer step count.
int64_t read_reshaped_state(const SavedStep& s, const ModelLayout& full, const ModelLayout& local, int64_t begin,
                            int64_t end, OptimizerStates& state);

}  // namespace ds
