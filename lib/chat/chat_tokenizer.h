// The tokenizer DeepSpeed-Chat's steps use for a model directory, and the
// step-1 (supervised fine-tuning) sample built with it.
//
// DeepSpeed-Chat's load_hf_tokenizer takes the model's Hugging Face
// tokenizer, sets the pad token to the eos token (a model whose name contains
// "llama" instead gets a new "[PAD]" token), pads on the right, and with
// --add_eot_token adds --eot_token as a special token. Special tokens written
// in the text ("</s>", "<|endoftext|>") are single ids, the text between them
// is encoded piece by piece, and a tokenizer that adds a bos (OPT, LLaMA)
// puts it first. Step 1 trains on prompt + chosen + the eos token, truncated
// to --max_seq_len and padded to it; the labels are the ids where the
// attention mask is 1 and ignored elsewhere.
//
// Supported tokenizer files: tokenizer.json (byte-level BPE, lib/data/
// hf_tokenizer.h; its added tokens and bos template), or vocab.json +
// merges.txt with the special tokens of special_tokens_map.json and
// tokenizer_config.json (GPT2Tokenizer's defaults: "<|endoftext|>";
// add_bos_token as OPT sets it), or for a model named "llama" without
// tokenizer.json, tokenizer.model as transformers' LlamaTokenizer reads it
// (legacy or not, as tokenizer_config.json says; add_bos_token /
// add_eos_token; "<s>", "</s>", "<unk>").
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/data/tokenizer.h"

namespace ds::chat {

class ChatTokenizer {
 public:
  // The tokenizer of `model_dir` with DeepSpeed-Chat's changes; `name` is the
  // model's name (config.json's _name_or_path, else the path) that decides
  // the LLaMA rule; `eot_token` (--add_eot_token) is added when given. A
  // missing or unsupported tokenizer is one UserError naming the directory.
  static ChatTokenizer load(const std::string& model_dir, const std::string& name,
                            const std::optional<std::string>& eot_token = std::nullopt);

  // The ids of `text`: the bos first when the tokenizer adds one, special
  // tokens as single ids, the rest through the model's tokenizer.
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  const std::string& eos_text() const { return eos_text_; }  // DeepSpeed-Chat's end-of-conversation token
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t bos_id() const { return bos_id_; }
  bool adds_bos() const { return add_bos_; }
  // len(tokenizer): the ids it can produce (the model's embedding is resized
  // to this rounded up to a multiple of 8).
  int64_t size() const { return size_; }

 private:
  std::unique_ptr<data::Tokenizer> base_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // split out of text before encoding
  std::string eos_text_;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  bool sp_prefix_ = false;    // LlamaTokenizer without legacy: tokenize()'s U+2581 prefix
  int32_t underline_id_ = -1;  // its U+2581 piece
  int64_t size_ = 0;
};

// A step-1 example as DeepSpeed-Chat's PromptDataset gives it, shifted for
// next-token prediction: tokens = the padded ids, targets[t] = the id at
// t + 1 where the attention mask is 1 there, else -1 (ignored; the last
// position's target is always -1). Both have max_seq_len entries. With
// prompt_tokens > 0 (dschat's --mask_prompt) the targets of the first
// prompt_tokens ids are ignored too: the loss covers the answer alone.
struct SftSample {
  std::vector<int32_t> tokens, targets;
  int64_t length = 0;   // ids before the padding
  int64_t counted = 0;  // targets >= 0
};
SftSample sft_sample(const ChatTokenizer& tok, std::string_view prompt_and_chosen, int64_t max_seq_len,
                     int64_t prompt_tokens = 0);

// tokenizer(text, max_length=max_seq_len, padding="max_length",
// truncation=True): the ids, truncated, padded on the right with the pad
// id; length = the attention mask's ones.
struct PaddedIds {
  std::vector<int32_t> ids;  // max_seq_len entries
  int64_t length = 0;
};
PaddedIds padded_ids(const ChatTokenizer& tok, const std::string& text, int64_t max_seq_len);

}  // namespace ds::chat
