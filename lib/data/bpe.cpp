// GPT-2 byte-level BPE tokenizer: byte map, hand-written pre-tokenizer, file
// loading, and encode/decode with a per-word cache. Training lives in bpe_train.cpp.
#include "lib/data/bpe.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/data/tokenizer.h"
#include "lib/data/unicode_class.h"

namespace ds::data {

namespace {

bool is_printable_byte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

struct ByteMaps {
  std::array<uint32_t, 256> to_unicode{};
  std::array<uint8_t, 256> order{};
  std::array<int16_t, 324> from_unicode{};  // code point -> byte, -1 if none
  ByteMaps() {
    from_unicode.fill(-1);
    int pos = 0, extra = 0;
    for (int b = 0; b < 256; ++b)
      if (is_printable_byte(b)) to_unicode[b] = b, order[pos++] = static_cast<uint8_t>(b);
    for (int b = 0; b < 256; ++b)
      if (!is_printable_byte(b)) to_unicode[b] = 256 + extra++, order[pos++] = static_cast<uint8_t>(b);
    for (int b = 0; b < 256; ++b) from_unicode[to_unicode[b]] = static_cast<int16_t>(b);
  }
};

const ByteMaps& byte_maps() {
  static const ByteMaps m;
  return m;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd) at s[i] == '\'', else 0.
size_t contraction_len(std::string_view s, size_t i) {
  if (i + 1 >= s.size()) return 0;
  const char c1 = s[i + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 < s.size()) {
    const char c2 = s[i + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
      return 3;
  }
  return 0;
}

CharClass class_at(std::string_view s, size_t i, int* len) {
  uint32_t cp;
  *len = utf8_decode(s, i, &cp);
  return char_class(cp);
}

// End of the run of class c that starts at i.
size_t run_end(std::string_view s, size_t i, CharClass c) {
  int len;
  while (i < s.size() && class_at(s, i, &len) == c) i += len;
  return i;
}


}  // namespace

const std::array<uint32_t, 256>& byte_to_unicode() { return byte_maps().to_unicode; }
const std::array<uint8_t, 256>& gpt2_byte_order() { return byte_maps().order; }

std::string bytes_to_token_name(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) utf8_append(out, byte_maps().to_unicode[b]);
  return out;
}

bool token_name_to_bytes(std::string_view name, std::string* bytes) {
  bytes->clear();
  for (size_t i = 0; i < name.size();) {
    uint32_t cp;
    int len = utf8_decode(name, i, &cp);
    if (cp >= 324 || byte_maps().from_unicode[cp] < 0) return false;
    *bytes += static_cast<char>(byte_maps().from_unicode[cp]);
    i += len;
  }
  return true;
}

void pretokenize(std::string_view s, std::vector<std::string_view>& out) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    if (s[i] == '\'') {
      if (size_t m = contraction_len(s, i)) {
        out.push_back(s.substr(i, m));
        i += m;
        continue;
      }
    }
    int len;
    const CharClass c = class_at(s, i, &len);
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional single space
    // followed by a run of one class.
    if (s[i] == ' ' && i + 1 < n) {
      int len2;
      const CharClass c2 = class_at(s, i + 1, &len2);
      if (c2 != CharClass::Space) {
        size_t e = run_end(s, i + 1, c2);
        out.push_back(s.substr(i, e - i));
        i = e;
        continue;
      }
    }
    if (c != CharClass::Space) {
      size_t e = run_end(s, i, c);
      out.push_back(s.substr(i, e - i));
      i = e;
      continue;
    }
    // "\s+(?!\S)" then "\s+": a run of spaces that is followed by a non-space
    // gives up its last character (which then prefixes the next word).
    size_t e = i, last = i;
    int count = 0;
    while (e < n && class_at(s, e, &len) == CharClass::Space) last = e, e += len, ++count;
    const size_t stop = (e == n || count == 1) ? e : last;
    out.push_back(s.substr(i, stop - i));
    i = stop;
  }
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> v;
  pretokenize(text, v);
  return v;
}

// ---------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(BpeTokenizer&& o) noexcept
    : tokens_(std::move(o.tokens_)),
      by_name_(std::move(o.by_name_)),
      byte_id_(o.byte_id_),
      merges_(std::move(o.merges_)),
      eod_id_(o.eod_id_),
      cache_(std::move(o.cache_)) {}

namespace {

int64_t vocab_json_size(const nlohmann::json& vocab, const std::string& path) {
  if (!vocab.is_object() || vocab.empty())
    DS_USER_ERROR("vocab file {} must be a JSON object mapping tokens to ids", path);
  int64_t max_id = -1, entry = 0;
  for (auto& [name, id] : vocab.items()) {
    ++entry;
    if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t(INT32_MAX)) ||
        id.get<int64_t>() < 0 || id.get<int64_t>() >= std::numeric_limits<int32_t>::max())
      DS_USER_ERROR("vocab file {}: entry {} (in key order) has {} for its id, expected an integer in "
                    "[0, 2147483646]", path, entry, id.is_number_integer() ? "an integer out of range"
                                                        : std::string("a ") + id.type_name());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  const int64_t n = static_cast<int64_t>(vocab.size());
  if (max_id >= n + kMaxUnusedVocabIds)
    DS_USER_ERROR("vocab file {}: ids go up to {} but there are only {} tokens (more than {} unused ids; not a "
                  "GPT-2 vocab.json?)", path, max_id, n, kMaxUnusedVocabIds);
  return max_id + 1;
}

}  // namespace

int64_t vocab_file_size(const std::string& path) {
  return vocab_json_size(parse_json_text(read_tokenizer_file(path, "vocab file"), "vocab file '" + path + "'"), path);
}

BpeTokenizer BpeTokenizer::load(const std::string& vocab_path, const std::string& merges_path) {
  BpeTokenizer t;
  const nlohmann::json vocab =
      parse_json_text(read_tokenizer_file(vocab_path, "vocab file"), "vocab file '" + vocab_path + "'");
  t.tokens_.resize(static_cast<size_t>(vocab_json_size(vocab, vocab_path)));
  std::string bytes;
  for (auto& [name, idj] : vocab.items()) {
    const auto id = static_cast<int32_t>(idj.get<int64_t>());
    if (!t.by_name_.emplace(name, id).second || !t.tokens_[id].empty())
      DS_USER_ERROR("vocab file {}: id {} is given to two tokens", vocab_path, id);
    t.tokens_[id] = token_name_to_bytes(name, &bytes) ? bytes : name;
  }
  for (int b = 0; b < 256; ++b) {
    std::string name;
    utf8_append(name, byte_to_unicode()[b]);
    auto it = t.by_name_.find(name);
    if (it == t.by_name_.end())
      DS_USER_ERROR("vocab file {} has no token for byte 0x{:02x} (\"{}\"); not a byte-level "
                    "BPE vocabulary", vocab_path, b, name);
    t.byte_id_[b] = it->second;
  }
  t.eod_id_ = t.token_id(kEndOfText);

  std::istringstream merges(read_tokenizer_file(merges_path, "merges file"));
  std::string line;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (std::getline(merges, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      DS_USER_ERROR("merges file {} line {}: expected two tokens separated by one space ({})", merges_path,
                    line_no, sp == std::string::npos ? "no space" : sp == 0 || sp + 1 == line.size()
                                                                         ? "an empty token" : "more than one space");
    const std::string left = line.substr(0, sp), right = line.substr(sp + 1);
    const int32_t a = t.token_id(left), b = t.token_id(right), c = t.token_id(left + right);
    if (a < 0 || b < 0 || c < 0)
      DS_USER_ERROR("merges file {} line {}: {} is not in vocab file {} (do the two files belong together?)",
                    merges_path, line_no, a < 0 ? "its first token" : b < 0 ? "its second token" : "the merged token",
                    vocab_path);
    t.merges_.emplace(bpe_pair_key(a, b), BpeMerge{rank++, c});  // a repeated pair keeps its first rank
  }
  return t;
}

int32_t BpeTokenizer::token_id(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  DS_CHECK(id >= 0 && id < vocab_size(), "token id {} outside vocabulary of {}", id, vocab_size());
  return tokens_[id];
}

// Byte-pair merging of one pre-token: repeatedly merge every occurrence (left to
// right) of the adjacent pair with the lowest merge rank.
void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym(word.size());
  for (size_t k = 0; k < word.size(); ++k) sym[k] = byte_id_[static_cast<unsigned char>(word[k])];
  bpe_merge(sym, merges_);
  out.insert(out.end(), sym.begin(), sym.end());
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string_view> words;
  pretokenize(text, words);
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() > (1u << 20)) cache_.clear();  // bound memory on huge corpora
  std::string key;
  for (std::string_view w : words) {
    key.assign(w);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      std::vector<int32_t> ids;
      encode_word(w, ids);
      it = cache_.emplace(key, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

}  // namespace ds::data
