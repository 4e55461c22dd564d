// state.json of a checkpoint step directory: the training state, the saved
// layout (weight names and shapes), the parallel split, the resolved config
// and the CRC-32C of every other file in the directory. parse_step_state
// validates every field (type, count, range) before anything uses it, so a
// hand-edited or corrupt file is one UserError naming the file and the field.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/optim/lr_schedule.h"
#include "lib/parallel/shard_coords.h"

namespace ds {

struct TrainState {
  int64_t iteration = 0;          // optimizer steps completed
  int64_t consumed_samples = 0;   // training samples consumed (data position)
  // Training tokens consumed (samples x the sequence length each trained on:
  // shorter during a sequence-length curriculum); -1 after loading a
  // checkpoint that predates the counter (the trainer derives it).
  int64_t consumed_tokens = 0;
  int64_t skipped_steps = 0;      // fp16 overflow skips
  double loss_scale = 1.0;
  int64_t good_steps = 0;         // steps since the last scale change (fp16)
  int64_t hysteresis_left = 0;
  LrClock lr_clock;  // the learning-rate schedule's counters
  // The Megatron schedule the run used (compared on resume); empty with a
  // DeepSpeed scheduler or in a checkpoint that predates it.
  std::optional<LrScheduleValues> lr_schedule;
};

// state.json's "lr_scheduler" object for `st` (counters, and the schedule
// values when there are any).
nlohmann::json lr_scheduler_json(const TrainState& st);

// The validated contents of one state.json.
struct StepState {
  TrainState train;
  ShardCoords sizes;  // tensor / pipeline / expert sizes and virtual stages per rank it was saved with (ranks 0)
  int shards = 1;              // optimizer shards per (pp, tp) rank
  std::vector<std::pair<std::string, Shape>> layout;  // the full (tp 1) model, in order
  nlohmann::json config;                              // the resolved config (null if absent)
  std::map<std::string, uint32_t> checksums;          // file name -> CRC-32C; empty: an older checkpoint
  // Files larger than one chunk: the CRC-32C of each kChecksumChunk bytes, so
  // that a rank reading part of a file verifies the chunks it read and never
  // reads the rest (absent in older checkpoints: the whole file is verified).
  struct ChunkSums {
    uint64_t chunk_bytes = 0;
    std::vector<uint32_t> crcs;
  };
  std::map<std::string, ChunkSums> chunk_checksums;
  // "tokenizer": the run's tokenizer files copied into the step directory
  // (lib/ckpt/step_tokenizer.h): config key (vocab_file, merge_file,
  // tokenizer_model) -> file name, each with a checksum; empty: none saved.
  std::string tokenizer_type;
  std::map<std::string, std::string> tokenizer_files;
  nlohmann::json raw;                                 // the whole document
};

// The chunk of "chunk_checksums" a save records (16 MiB).
inline constexpr uint64_t kChecksumChunk = uint64_t(16) << 20;

// Limits on what a state.json may say (far above any real model).
inline constexpr int kMaxParallelSize = 1 << 16;  // tp, pp, vp, optimizer shards
inline constexpr int kMaxShapeDims = 8;
inline constexpr int64_t kMaxDimension = int64_t(1) << 40;
inline constexpr size_t kMaxStateJsonBytes = size_t(64) << 20;

// Parses and validates state.json text; `file` names it in errors.
StepState parse_step_state(std::string_view text, const std::string& file);

// state.json's format_version, written since the state_checksum and the file
// checksums became mandatory: a state.json that declares it must carry both.
// An unversioned state.json (an older dstrain) loads without them.
inline constexpr int64_t kStateFormatVersion = 1;

// The state.json text for `state` (a JSON object without "state_checksum"):
// the object plus "format_version" and "state_checksum", the CRC-32C of its
// compact dump, which parse_step_state verifies.
std::string step_state_text(const nlohmann::json& state);

}  // namespace ds
