// The run's tokenizer inside a checkpoint. dstrain copies the tokenizer files
// its run reads (GPT-2 vocab.json + merges.txt, a SentencePiece
// tokenizer.model, a Hugging Face tokenizer.json) into every step directory
// under transformers' names, and state.json's "tokenizer" object names the
// copies; the file checksums cover them like every other file. dsgen and
// dsconvert then use the copies, verified, and never the paths the run's
// config names (which point outside the checkpoint). docs/formats.md.
#pragma once
#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/ckpt/state_json.h"

namespace ds {

// The largest tokenizer file copied (real ones are a few MB; LLaMA-3's
// tokenizer.json is 9 MB). A larger file is not copied, with a warning.
inline constexpr size_t kMaxTokenizerFileBytes = size_t(64) << 20;

struct StepTokenizer {
  struct File {
    std::string field;  // the config key it stands for: vocab_file, merge_file or tokenizer_model
    std::string name;   // its name in the step directory and in an HF export (vocab.json, ...)
    std::string bytes;  // its contents
  };
  std::string type;         // Megatron's tokenizer type ("GPT2BPETokenizer", "HFTokenizer", ...)
  std::vector<File> files;  // empty: no tokenizer to save
};

// Whether `name` is one of the names a saved tokenizer file may have.
bool is_step_tokenizer_name(const std::string& name);

// Reads the tokenizer files a run's config names (`type` as the config says
// it, "" meaning GPT2BPETokenizer; a tokenizer_model directory means its
// tokenizer.json). When a file is missing, unreadable, not a regular file or
// larger than kMaxTokenizerFileBytes, the result has no files and a warning
// names the file: the checkpoints are saved without a tokenizer.
StepTokenizer read_run_tokenizer(const std::string& type, const std::string& vocab_file,
                                 const std::string& merge_file, const std::string& tokenizer_model);

// Writes t's files into `dir` (a temporary step or export directory) under
// their names. Returns state.json's "tokenizer" object: {"tokenizer_type":
// type, field: name, ...}; null when t has no files.
nlohmann::json write_step_tokenizer(const StepTokenizer& t, const std::filesystem::path& dir);

// The copies a step directory holds, read and checked against state.json's
// checksums (a mismatch is one line naming the corrupt file); no files when
// the state names none (a checkpoint from before the copies).
StepTokenizer read_step_tokenizer(const std::filesystem::path& step, const StepState& st);

}  // namespace ds
