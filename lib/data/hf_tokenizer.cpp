// Hugging Face tokenizer.json: the BPE model (vocab, merges as "a b" strings or
// [a, b] pairs, ignore_merges, byte_fallback, unk), the pre-tokenizers ByteLevel
// and Split (hf_pretokenize.cpp) alone or in a Sequence, added tokens matched
// in the raw text before pre-tokenization (leftmost, longest; lstrip, rstrip,
// single_word), the TemplateProcessing post-processor's bos, and decoding back
// to bytes. Every unsupported part is a UserError naming the file and the part;
// errors never echo the file's text (it may not be a tokenizer at all): they
// name the field, the entry's position and the JSON type found.
#include "lib/data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/data/bpe.h"
#include "lib/data/bpe_merge.h"
#include "lib/data/tokenizer.h"
#include "lib/data/unicode_class.h"

namespace ds::data {

namespace {

using nlohmann::json;

// One pre-tokenization step, applied to every piece the previous step made.
struct PreStep {
  enum class Kind { Split, ByteLevel } kind;
  SplitPattern pattern = SplitPattern::Gpt2;
  bool use_regex = true, add_prefix_space = false;  // ByteLevel
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, single_word;
};

// o[key], or null when o is not an object or has no such key.
json get(const json& o, const char* key) { return o.is_object() && o.contains(key) ? o[key] : json(); }

// What an error says about a value found in the file: its JSON type, never its text.
std::string kind_of(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "true/false";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// A type name from the file ("BPE", "WordPiece") for an error: shown when it is a
// short identifier, else only described.
std::string type_label(const std::string& t) {
  const bool ident = !t.empty() && t.size() <= 32 && std::all_of(t.begin(), t.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  return ident ? t : "(not a type name)";
}

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

bool is_word_char(uint32_t cp) {
  return cp == '_' || char_class(cp) == CharClass::Letter || char_class(cp) == CharClass::Number;
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const json& j, const std::string& file, const std::string& dir) : file_(file) {
    DS_USER_CHECK(j.is_object(), "{}: expected a JSON object (a Hugging Face tokenizer.json)", file_);
    load_model(j.contains("model") ? j["model"] : json(), file_);
    load_added(get(j, "added_tokens"));
    load_normalizer(get(j, "normalizer"));
    load_pre(get(j, "pre_tokenizer"));
    load_post(get(j, "post_processor"));
    info_.kind = TokenizerKind::HF;
    info_.vocab_size = static_cast<int64_t>(tokens_.size());
    find_special_ids(dir);
  }

  const TokenizerInfo& info() const override { return info_; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;

 private:
  // Typed fields: the default when absent, an error naming the file and key when mistyped.
  std::string get_str(const json& o, const char* key, const std::string& dflt) const {
    const json v = get(o, key);
    if (v.is_null()) return dflt;
    DS_USER_CHECK(v.is_string(), "{}: \"{}\" must be a string, got {}", file_, key, kind_of(v));
    return v.get<std::string>();
  }
  bool get_bool(const json& o, const char* key, bool dflt) const {
    const json v = get(o, key);
    if (v.is_null()) return dflt;
    DS_USER_CHECK(v.is_boolean(), "{}: \"{}\" must be true or false, got {}", file_, key, kind_of(v));
    return v.get<bool>();
  }
  void load_model(const json& m, const std::string& file);
  void load_merges(const json& merges);
  void load_added(const json& added);
  void load_normalizer(const json& n);
  void load_pre(const json& p);
  void add_pre_step(const json& p);
  void load_post(const json& p);
  void find_special_ids(const std::string& dir);
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::vector<int32_t>& sym) const;
  int32_t id_of(const std::string& token) const {
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }
  // The next added token at or after `from`: [begin, end) including stripped spaces.
  const AddedToken* next_added(std::string_view text, size_t from, size_t* begin, size_t* end) const;

  std::string file_;
  TokenizerInfo info_;
  std::unordered_map<std::string, int32_t> vocab_;  // token (as in the file) -> id
  std::vector<std::string> tokens_;                 // id -> token as in the file ("" unused)
  BpeMergeTable merges_;
  bool byte_level_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::array<int32_t, 256> byte_id_{};      // byte-level: byte -> id (-1 absent)
  std::array<int32_t, 256> fallback_id_{};  // byte_fallback: byte -> id of "<0xXX>"
  std::vector<PreStep> pre_;
  std::vector<AddedToken> added_;
  std::map<int32_t, std::string> added_by_id_;
  std::array<bool, 256> first_byte_{};  // bytes that start an added token
  int32_t template_bos_ = -1;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

void HfTokenizer::load_model(const json& m, const std::string& file) {
  DS_USER_CHECK(m.is_object(), "{}: no \"model\" object", file);
  const std::string type = get_str(m, "type", std::string("BPE"));
  DS_USER_CHECK(type == "BPE", "{}: model type {} is not supported (only BPE)", file, type_label(type));
  DS_USER_CHECK(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab must be an object", file);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = get(m, k);
    DS_USER_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()),
                  "{}: model.{} ({}) is not supported", file, k, kind_of(v));
  }
  const json dropout = get(m, "dropout");
  DS_USER_CHECK(dropout.is_null() || (dropout.is_number() && dropout.get<double>() == 0.0),
                "{}: model.dropout ({}) is not supported (BPE dropout is for training-time sampling)", file,
                kind_of(dropout));
  int64_t max_id = -1;
  int64_t entry = 0;
  for (auto& [tok, idj] : m["vocab"].items()) {
    ++entry;
    DS_USER_CHECK(idj.is_number_integer() && idj.get<int64_t>() >= 0 && idj.get<int64_t>() < (int64_t{1} << 30),
                  "{}: model.vocab entry {} (in key order) has {} for its id, expected an integer in [0, 2^30)",
                  file, entry, idj.is_number_integer() ? "an integer out of range" : kind_of(idj));
    max_id = std::max(max_id, idj.get<int64_t>());
  }
  const int64_t n = static_cast<int64_t>(m["vocab"].size());
  DS_USER_CHECK(max_id < n + kMaxUnusedVocabIds, "{}: model.vocab ids go up to {} for {} tokens", file, max_id, n);
  tokens_.resize(static_cast<size_t>(max_id + 1));
  for (auto& [tok, idj] : m["vocab"].items()) {
    const auto id = static_cast<int32_t>(idj.get<int64_t>());
    DS_USER_CHECK(vocab_.emplace(tok, id).second && tokens_[id].empty(), "{}: model.vocab gives id {} twice", file,
                  id);
    tokens_[id] = tok;
  }
  byte_fallback_ = get_bool(m, "byte_fallback", false);
  ignore_merges_ = get_bool(m, "ignore_merges", false);
  const json unk = get(m, "unk_token");
  if (unk.is_string()) unk_id_ = id_of(unk.get<std::string>());
  for (int b = 0; b < 256; ++b) {
    fallback_id_[b] = id_of(fmt::format("<0x{:02X}>", b));
    byte_id_[b] = id_of(bytes_to_token_name(std::string(1, static_cast<char>(b))));
  }
  load_merges(get(m, "merges"));
}

void HfTokenizer::load_merges(const json& merges) {
  if (merges.is_null()) return;
  DS_USER_CHECK(merges.is_array(), "{}: model.merges must be an array", file_);
  int32_t rank = 0;
  for (const json& mj : merges) {
    std::string a, b;
    if (mj.is_string()) {
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      DS_USER_CHECK(
          sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
          "{}: model.merges entry {} is not two tokens separated by one space", file_, rank + 1);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      DS_USER_CHECK(mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string(),
                    "{}: model.merges entry {} is neither \"a b\" nor [\"a\", \"b\"] (found {})", file_,
                    rank + 1, kind_of(mj));
      a = mj[0].get<std::string>(), b = mj[1].get<std::string>();
    }
    const int32_t ia = id_of(a), ib = id_of(b), ic = id_of(a + b);
    DS_USER_CHECK(ia >= 0 && ib >= 0 && ic >= 0,
                  "{}: model.merges entry {}: {} is not in model.vocab", file_, rank + 1,
                  ia < 0 ? "its first token" : ib < 0 ? "its second token" : "the merged token");
    merges_.emplace(bpe_pair_key(ia, ib), BpeMerge{rank++, ic});
  }
}

void HfTokenizer::load_added(const json& added) {
  if (added.is_null()) return;
  DS_USER_CHECK(added.is_array(), "{}: added_tokens must be an array", file_);
  int64_t entry = 0;
  for (const json& t : added) {
    ++entry;
    DS_USER_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                      t["content"].is_string() && t["id"].get<int64_t>() >= 0 &&
                      t["id"].get<int64_t>() < static_cast<int64_t>(tokens_.size()) + kMaxUnusedVocabIds,
                  "{}: added_tokens entry {} needs a string \"content\" and an id in range", file_, entry);
    AddedToken a{t["content"].get<std::string>(), static_cast<int32_t>(t["id"].get<int64_t>()),
                 get_bool(t, "lstrip", false), get_bool(t, "rstrip", false), get_bool(t, "single_word", false)};
    DS_USER_CHECK(!a.content.empty(), "{}: added token {} has empty content", file_, a.id);
    if (a.id >= static_cast<int32_t>(tokens_.size())) tokens_.resize(static_cast<size_t>(a.id) + 1);
    if (tokens_[a.id].empty()) tokens_[a.id] = a.content;
    vocab_.emplace(a.content, a.id);
    added_by_id_[a.id] = a.content;
    first_byte_[static_cast<unsigned char>(a.content[0])] = true;
    added_.push_back(std::move(a));
  }
}

void HfTokenizer::load_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = get_str(n, "type", std::string("?"));
  // NFC leaves text that is already composed unchanged (docs/tokenizers.md).
  if (type == "NFC") return;
  if (type == "Sequence" && get(n, "normalizers").empty()) return;
  DS_USER_ERROR("{}: normalizer {} is not supported (byte-level BPE files have none or NFC)", file_,
                type_label(type));
}

void HfTokenizer::add_pre_step(const json& p) {
  DS_USER_CHECK(p.is_object(), "{}: a pre_tokenizer entry is {}, not an object", file_, kind_of(p));
  const std::string type = get_str(p, "type", std::string("?"));
  PreStep s{};
  if (type == "ByteLevel") {
    s.kind = PreStep::Kind::ByteLevel;
    s.use_regex = get_bool(p, "use_regex", true);
    s.add_prefix_space = get_bool(p, "add_prefix_space", false);
    byte_level_ = true;
  } else if (type == "Split") {
    s.kind = PreStep::Kind::Split;
    const json pat = get(p, "pattern");
    DS_USER_CHECK(pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string(),
                  "{}: Split pre-tokenizer pattern ({}) is not supported (only the known Regex patterns)", file_,
                  kind_of(pat));
    s.pattern = parse_split_pattern(pat["Regex"].get<std::string>(), file_);
    DS_USER_CHECK(get_str(p, "behavior", std::string()) == "Isolated" && !get_bool(p, "invert", false),
                  "{}: Split pre-tokenizer behavior/invert is not supported (only \"Isolated\", not inverted)",
                  file_);
  } else {
    DS_USER_ERROR("{}: pre_tokenizer {} is not supported (ByteLevel, Split or a Sequence of them)", file_,
                  type_label(type));
  }
  pre_.push_back(s);
}

void HfTokenizer::load_pre(const json& p) {
  if (p.is_null()) return;
  if (get_str(p, "type", std::string()) == "Sequence") {
    for (const json& q : get(p, "pretokenizers")) add_pre_step(q);
  } else {
    add_pre_step(p);
  }
}

void HfTokenizer::load_post(const json& p) {
  if (p.is_null()) return;
  const std::string type = get_str(p, "type", std::string("?"));
  if (type == "Sequence") {
    for (const json& q : get(p, "processors")) load_post(q);
    return;
  }
  if (type == "ByteLevel") return;  // only adjusts offsets
  DS_USER_CHECK(type == "TemplateProcessing", "{}: post_processor {} is not supported", file_, type_label(type));
  const json single = get(p, "single");
  std::vector<int32_t> before, after;
  bool seen_a = false;
  for (const json& piece : single) {
    if (piece.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    const std::string name = get_str(get(piece, "SpecialToken"), "id", "");
    const json ids = get(get(get(p, "special_tokens"), name.c_str()), "ids");
    DS_USER_CHECK(ids.is_array() && ids.size() == 1 && ids[0].is_number_integer() && ids[0].get<int64_t>() >= 0 &&
                      ids[0].get<int64_t>() < static_cast<int64_t>(tokens_.size()),
                  "{}: a post_processor special token has no single id in the vocabulary", file_);
    (seen_a ? after : before).push_back(ids[0].get<int32_t>());
  }
  DS_USER_CHECK(
      before.size() <= 1 && after.empty(),
      "{}: post_processor template adds {} token(s) before and {} after the text; only a bos before it is "
      "supported",
      file_, before.size(), after.size());
  if (!before.empty()) template_bos_ = before[0];
}

// bos / eos: tokenizer_config.json beside the file when it names them, else the
// template's bos and the usual names of the known families.
void HfTokenizer::find_special_ids(const std::string& dir) {
  auto named = [&](const json& v) -> int32_t {
    if (v.is_string()) return id_of(v.get<std::string>());
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return id_of(v["content"].get<std::string>());
    return -1;
  };
  const std::filesystem::path cfg = std::filesystem::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!dir.empty() && std::filesystem::is_regular_file(cfg, ec)) {
    const json c =
        parse_json_text(read_tokenizer_file(cfg.string(), "tokenizer config"), "tokenizer config '" + cfg.string() + "'");
    if (c.is_object()) {
      info_.bos_id = named(get(c, "bos_token"));
      info_.eos_id = named(get(c, "eos_token"));
      info_.pad_id = named(get(c, "pad_token"));
    }
  }
  auto first_of = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (int32_t id = id_of(n); id >= 0) return id;
    return -1;
  };
  if (info_.bos_id < 0)
    info_.bos_id = template_bos_ >= 0 ? template_bos_ : first_of({"<|begin_of_text|>", "<s>", "<|endoftext|>"});
  if (info_.eos_id < 0) info_.eos_id = first_of({"<|end_of_text|>", "</s>", "<|endoftext|>"});
  info_.eod_id = info_.eos_id;
  info_.add_bos = template_bos_ >= 0;
  if (info_.add_bos) info_.bos_id = template_bos_;
}

const AddedToken* HfTokenizer::next_added(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    const AddedToken* best = nullptr;
    for (const AddedToken& a : added_)
      if (a.content.size() > (best ? best->content.size() : 0) && text.compare(i, a.content.size(), a.content) == 0)
        best = &a;
    if (!best) continue;
    size_t b = i, e = i + best->content.size();
    if (best->single_word) {
      uint32_t cp = 0;
      const bool word_before = b > 0 && (utf8_decode(text, b - 1, &cp), is_word_char(cp));
      const bool word_after = e < text.size() && (utf8_decode(text, e, &cp), is_word_char(cp));
      if (word_before || word_after) continue;
    }
    if (best->lstrip)
      while (b > from && is_ascii_space(text[b - 1])) --b;
    if (best->rstrip)
      while (e < text.size() && is_ascii_space(text[e])) ++e;
    *begin = b, *end = e;
    return best;
  }
  return nullptr;
}

void HfTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  size_t pos = 0, b = 0, e = 0;
  while (const AddedToken* a = added_.empty() ? nullptr : next_added(text, pos, &b, &e)) {
    encode_segment(text.substr(pos, b - pos), out);
    out.push_back(a->id);
    pos = e;
  }
  encode_segment(text.substr(pos), out);
}

void HfTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<std::string> pieces{std::string(text)}, next;
  std::vector<std::string_view> views;
  for (const PreStep& s : pre_) {
    next.clear();
    for (std::string& p : pieces) {
      if (s.kind == PreStep::Kind::ByteLevel && s.add_prefix_space && (p.empty() || p[0] != ' '))
        p.insert(p.begin(), ' ');
      if (s.kind == PreStep::Kind::ByteLevel && !s.use_regex) {
        next.push_back(std::move(p));
        continue;
      }
      views.clear();
      split_by_pattern(s.kind == PreStep::Kind::ByteLevel ? SplitPattern::Gpt2 : s.pattern, p, views);
      for (std::string_view v : views) next.emplace_back(v);
    }
    pieces.swap(next);
  }
  for (const std::string& p : pieces) encode_piece(p, out);
}

void HfTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> sym;
  const std::string name = byte_level_ ? bytes_to_token_name(piece) : std::string(piece);
  const int32_t whole = ignore_merges_ ? id_of(name) : -1;
  if (whole >= 0) {
    sym.push_back(whole);
  } else if (byte_level_) {
    for (unsigned char c : piece)
      if (byte_id_[c] >= 0)
        sym.push_back(byte_id_[c]);
      else if (unk_id_ >= 0)
        sym.push_back(unk_id_);
    bpe(sym);
  } else {  // characters of the text; unknown ones as bytes or unk
    for (size_t i = 0; i < piece.size();) {
      uint32_t cp;
      const int len = utf8_decode(piece, i, &cp);
      const int32_t id = id_of(std::string(piece.substr(i, len)));
      if (id >= 0)
        sym.push_back(id);
      else if (byte_fallback_ && fallback_id_[static_cast<unsigned char>(piece[i])] >= 0)
        for (int k = 0; k < len; ++k) sym.push_back(fallback_id_[static_cast<unsigned char>(piece[i + k])]);
      else if (unk_id_ >= 0)
        sym.push_back(unk_id_);
      i += len;
    }
    bpe(sym);
  }
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() > (1u << 20)) cache_.clear();
  cache_.emplace(std::string(piece), sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

void HfTokenizer::bpe(std::vector<int32_t>& sym) const { bpe_merge(sym, merges_); }

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out, bytes;
  for (int32_t id : ids) {
    DS_CHECK(id >= 0 && id < static_cast<int32_t>(tokens_.size()), "token id {} outside vocabulary of {}", id,
             tokens_.size());
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      out += it->second;
      continue;
    }
    const std::string& t = tokens_[id];
    unsigned b = 0;
    if (byte_fallback_ && t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' &&
        std::sscanf(t.c_str() + 3, "%2x", &b) == 1) {
      out += static_cast<char>(b);
    } else if (byte_level_ && token_name_to_bytes(t, &bytes)) {
      out += bytes;
    } else {
      out += t;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  const std::string file = hf_tokenizer_json_path(path);
  const json j = parse_json_text(read_tokenizer_file(file, "tokenizer file"), "tokenizer file '" + file + "'");
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  return std::make_unique<HfTokenizer>(j, file, dir.empty() ? std::string(".") : dir.string());
}

}  // namespace ds::data
