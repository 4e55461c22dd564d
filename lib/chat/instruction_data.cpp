// Megatron-DeepSpeed's finetune_llama.py data in dstrain (instruction_data.h).
#include "lib/chat/instruction_data.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/chat/chat_tokenizer.h"
#include "lib/core/error.h"
#include "lib/core/log.h"

namespace ds::chat {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Stanford Alpaca's templates, as megatron/data/prompt_dataset.py's PROMPT_DICT.
constexpr const char* kPromptInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:";
constexpr const char* kPromptNoInput =
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:";

// str.format_map with the record's fields: the template's placeholders
// only (a value holding "{input}" stays as it is).
std::string fill(const std::string& t, const std::string& instruction, const std::string& input) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, 13, "{instruction}") == 0) {
      out += instruction;
      i += 13;
    } else if (t.compare(i, 7, "{input}") == 0) {
      out += input;
      i += 7;
    } else {
      out += t[i++];
    }
  }
  return out;
}

struct Example {
  std::vector<int32_t> tokens, targets;  // seq_length each
  int64_t counted = 0;                    // targets >= 0
};

class InstructionSource final : public BatchSource {
 public:
  InstructionSource(Device dev, std::vector<Example> examples, int64_t B, int64_t T, int64_t group)
      : BatchSource(dev), ex_(std::move(examples)), B_(B), T_(T),
        usable_(static_cast<int64_t>(ex_.size()) / group * group) {}

  MicroBatch train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen) override {
    DS_USER_CHECK(seqlen == 0 || seqlen == T_, "the instruction dataset (a .json --data-path) does not take a "
                  "sequence-length curriculum (curriculum_learning)");
    // Megatron's sampler: groups of B x dp samples in order, rank r taking rows [r B, (r + 1) B).
    const int64_t group = consumed / (B_ * dp) + micro;
    const int64_t first = group * B_ * dp + static_cast<int64_t>(dp_rank) * B_;
    Tensor tok = Tensor::empty({B_, T_}, DType::I32), tgt = Tensor::empty({B_, T_}, DType::I32);
    int64_t counted = 0;
    for (int64_t b = 0; b < B_; ++b) {
      const Example& e = ex_[static_cast<size_t>((first + b) % usable_)];
      std::copy(e.tokens.begin(), e.tokens.end(), tok.data<int32_t>() + b * T_);
      std::copy(e.targets.begin(), e.targets.end(), tgt.data<int32_t>() + b * T_);
      counted += e.counted;
    }
    // finetune_llama.py's loss: the mean over the micro-batch's counted targets.
    const float scale = counted > 0 ? static_cast<float>(static_cast<double>(B_ * T_) / static_cast<double>(counted))
                                    : 1.f;
    return {.tokens = tok, .targets = tgt, .first_sample = first, .step_key = {}, .loss_weight_scale = scale};
  }
  MicroBatch valid_batch(int64_t, int, int) override {
    DS_CHECK(false, "the instruction dataset has no validation split");
    return {};
  }
  bool has_valid() const override { return false; }
  int64_t train_samples_per_epoch() const override { return usable_; }

 private:
  std::vector<Example> ex_;
  int64_t B_, T_, usable_;
};

std::string field(const json& r, const char* key, size_t index, const std::string& path, bool required) {
  if (!r.contains(key)) {
    DS_USER_CHECK(!required, "--data-path {}: record {} has no \"{}\" (an Alpaca record holds instruction, input "
                  "and output)", path, index, key);
    return "";
  }
  DS_USER_CHECK(r[key].is_string(), "--data-path {}: record {}'s \"{}\" is not a string", path, index, key);
  return r[key].get<std::string>();
}

}  // namespace

bool is_instruction_data(const TrainConfig& cfg) {
  const auto& p = cfg.data.data_path;
  return p.size() == 1 && p[0].size() > 5 && p[0].compare(p[0].size() - 5, 5, ".json") == 0;
}

std::unique_ptr<BatchSource> make_instruction_source(const TrainConfig& cfg, Device dev) {
  const std::string& path = cfg.data.data_path.at(0);
  DS_USER_CHECK(cfg.data.tokenizer_kind() == data::TokenizerKind::HF,
                "--data-path {}: an instruction dataset (finetune_llama.py's) is tokenized by a Hugging Face "
                "tokenizer: give --tokenizer-type HFTokenizer --tokenizer-model MODEL_DIR", path);
  const std::string& dir = cfg.data.tokenizer_model;
  std::error_code ec;
  DS_USER_CHECK(fs::is_directory(dir, ec), "--tokenizer-model '{}': the instruction dataset needs the model's "
                "Hugging Face directory (tokenizer files and their special tokens)", dir);
  const ChatTokenizer tok = ChatTokenizer::load(dir, dir);
  std::ifstream f(path);
  DS_USER_CHECK(f.good(), "--data-path {}: cannot read it", path);
  json records;
  try {
    records = json::parse(f);
  } catch (const json::parse_error& e) {
    DS_USER_ERROR("--data-path {}: not JSON ({})", path, e.what());
  }
  DS_USER_CHECK(records.is_array(), "--data-path {}: expected a JSON list of Alpaca records", path);
  const int64_t T = cfg.model.seq_length, B = cfg.batch.micro_batch_size;
  const int64_t group = B * cfg.layout.dp;
  std::vector<Example> ex;
  ex.reserve(records.size());
  int64_t truncated = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    DS_USER_CHECK(r.is_object(), "--data-path {}: record {} is not a JSON object", path, i);
    const std::string instruction = field(r, "instruction", i, path, true);
    const std::string input = field(r, "input", i, path, false);
    const std::string output = field(r, "output", i, path, true);
    const std::string source = fill(input.empty() ? kPromptNoInput : kPromptInput, instruction, input);
    const PaddedIds full = padded_ids(tok, source + output + tok.eos_text(), T + 1);
    const int64_t source_len = padded_ids(tok, source, T + 1).length;
    truncated += full.length == T + 1 ? 1 : 0;
    Example e;
    e.tokens.assign(full.ids.begin(), full.ids.begin() + T);
    e.targets.assign(static_cast<size_t>(T), -1);
    for (int64_t t = 0; t < T; ++t) {
      if (t >= full.length) e.tokens[static_cast<size_t>(t)] = tok.eos_id();  // padding (see the header)
      if (t + 1 >= source_len && t + 1 < full.length) {
        e.targets[static_cast<size_t>(t)] = full.ids[static_cast<size_t>(t + 1)];
        e.counted += 1;
      }
    }
    ex.push_back(std::move(e));
  }
  DS_USER_CHECK(static_cast<int64_t>(ex.size()) >= group, "--data-path {}: {} records, fewer than one group of "
                "micro-batch {} x data-parallel {} samples", path, ex.size(), B, cfg.layout.dp);
  DS_LOG("instruction dataset {}: {} Alpaca records ({} used per epoch), {} truncated to {} tokens; prompts masked "
         "in the loss", path, ex.size(), static_cast<int64_t>(ex.size()) / group * group, truncated, T + 1);
  return std::make_unique<InstructionSource>(dev, std::move(ex), B, T, group);
}

}  // namespace ds::chat
