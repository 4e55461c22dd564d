// GPT-2 byte-level BPE: the tokenizer that reads vocab.json + merges.txt (the
// files of GPT-2 / Megatron's GPT2BPETokenizer), its pre-tokenizer, and a trainer
// that learns a new byte-level vocabulary and writes it in the same two files.
//
// Byte level: text is handled as bytes; every byte has a token, so any input
// encodes and decode(encode(x)) == x byte for byte. In the files each byte is
// spelled as one printable Unicode character (GPT-2's byte-to-unicode map: space
// is "Ġ", newline "Ċ"). The pre-tokenizer is GPT-2's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// implemented by hand, with exact Unicode letter/number/space classes. Merges never
// cross pre-token boundaries. "<|endoftext|>" in input text is not special: it
// encodes as ordinary text; the end-of-document id is appended by the caller.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lib/data/bpe_merge.h"

namespace ds::data {

inline constexpr const char* kEndOfText = "<|endoftext|>";

// GPT-2's byte -> code point map (printable bytes map to themselves).
const std::array<uint32_t, 256>& byte_to_unicode();
// The order GPT-2 gives the 256 byte tokens (ids 0..255 of its vocabulary).
const std::array<uint8_t, 256>& gpt2_byte_order();
// Token bytes <-> the spelling used in vocab.json / merges.txt.
std::string bytes_to_token_name(std::string_view bytes);
// False when `name` contains a character outside the byte map (a special token).
bool token_name_to_bytes(std::string_view name, std::string* bytes);

// Splits text into GPT-2 pre-tokens (views into `text`), appended to `out`.
void pretokenize(std::string_view text, std::vector<std::string_view>& out);
std::vector<std::string_view> pretokenize(std::string_view text);

// A vocab.json may leave at most this many ids unused (ids are dense in every
// real byte-level BPE vocabulary; a huge id would make us allocate for it).
inline constexpr int64_t kMaxUnusedVocabIds = 65536;

// The vocabulary size (largest id + 1) of a vocab.json file. Ids must be
// integers in [0, 2^31 - 2]; anything else (a malformed or too deeply nested
// file, an id outside int32) is a UserError naming the file and the token.
int64_t vocab_file_size(const std::string& vocab_json_path);

class BpeTokenizer {
 public:
  // Loads the two files; malformed or inconsistent files throw ds::UserError
  // naming the file (and line for merges.txt).
  static BpeTokenizer load(const std::string& vocab_json_path, const std::string& merges_path);

  BpeTokenizer(BpeTokenizer&& o) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) = delete;

  // Appends the ids of `text` to `out`. Thread-safe (the word cache is locked).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // Concatenated bytes of the tokens (may be partial UTF-8 for a cut sequence).
  std::string decode(std::span<const int32_t> ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }  // max id + 1
  int32_t eod_id() const { return eod_id_; }  // id of "<|endoftext|>", -1 if absent
  // Id of a token by its vocab.json spelling, -1 if absent.
  int32_t token_id(std::string_view name) const;
  const std::string& token_bytes(int32_t id) const;
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }

 private:
  BpeTokenizer() = default;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;                  // id -> bytes ("" for unused ids)
  std::unordered_map<std::string, int32_t> by_name_;  // vocab.json spelling -> id
  std::array<int32_t, 256> byte_id_{};
  BpeMergeTable merges_;
  int32_t eod_id_ = -1;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// A byte-level BPE vocabulary learnt from a corpus. Ids 0..255 are the bytes in
// GPT-2's order, then one id per merge in the order learnt, then "<|endoftext|>".
struct TrainedBpe {
  std::vector<std::string> tokens;                  // id -> bytes (last: kEndOfText)
  std::vector<std::pair<int32_t, int32_t>> merges;  // rank -> (left id, right id)
};

struct BpeTrainOptions {
  int64_t min_frequency = 2;  // stop when the best pair occurs fewer times
};

// Learns merges until the vocabulary (256 bytes + merges + end-of-text) has
// vocab_size entries or no pair occurs min_frequency times. Deterministic: ties
// between equally frequent pairs go to the smaller (left id, right id).
TrainedBpe train_bpe(std::string_view corpus, int64_t vocab_size,
                     const BpeTrainOptions& options = {});

// Writes vocab.json (token spelling -> id, in id order) and merges.txt
// ("#version: 0.2" then one "left right" line per merge) as a pair: both are
// written in full to temporaries before either is renamed into place; on a
// failure (a full disk) the old pair stays and no temporary is left
// (StagedFiles, lib/core/atomic_file.h).
void write_bpe_files(const TrainedBpe& bpe, const std::string& vocab_json_path,
                     const std::string& merges_path);

}  // namespace ds::data
