// Where dsgen's model comes from: a dstrain checkpoint (any TP / PP / DP /
// ZeRO layout it was saved with; its state.json holds the model config and
// the tokenizer flags of the run) or a Hugging Face directory (config.json +
// model.safetensors of GPT2LMHeadModel, LlamaForCausalLM or
// GPTNeoXForCausalLM, as dstrain exports them or transformers saves them).
// Either way the result is the full (tp 1) f32 weights on the host, with the
// vocabulary padded for the generation's tensor-parallel size.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/data/tokenizer.h"
#include "lib/model/layout.h"
#include "lib/model/model_config.h"

namespace ds::gen {

struct ModelSource {
  std::string load, tag;  // checkpoint directory (--load), step directory name (--tag)
  std::string init_from;  // Hugging Face directory (--init-from)
};

struct LoadedModel {
  ModelConfig model;   // padded vocabulary for tp
  ModelLayout full;    // build_layout(model)
  Tensor params;       // (full.total) host f32
  std::string where;   // the step directory or HF directory, for messages
  // Tokenizer files the source names (the copies saved in the step
  // directory, else the run's flags when they lie inside the checkpoint
  // directory, or files in the HF directory); kind GPT2BPE with no files when
  // it names none.
  data::TokenizerSpec tokenizer;
  bool has_tokenizer = false;
  // Set when the checkpoint names tokenizer files outside its directory: the
  // error to give unless the user names the tokenizer with flags.
  std::string tokenizer_refused;
  // The saved copies and the CRC-32C state.json records for each.
  std::vector<std::pair<std::string, uint32_t>> tokenizer_checksums;
  std::string device = "cpu";   // the run's --device (checkpoints), "cpu" otherwise
  int eos_id = -1;              // config.json's eos_token_id (HF), -1 otherwise
};

// UserError naming the path and field on a missing or malformed source.
LoadedModel load_model(const ModelSource& src, int tp);
// Before the source's own tokenizer is used (no tokenizer flags): the error
// when it has none dsgen may open, and the checksums of a checkpoint's copies
// (a mismatch is one line naming the corrupt file).
void check_model_tokenizer(const LoadedModel& m);

}  // namespace ds::gen
