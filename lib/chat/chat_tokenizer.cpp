// DeepSpeed-Chat's tokenizer of a model directory and the step-1 sample
// (chat_tokenizer.h).
#include "lib/chat/chat_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <functional>

#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/data/bpe.h"
#include "lib/data/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ds::chat {

namespace {

// vocab.json + merges.txt through the byte-level BPE (special tokens are split
// out by ChatTokenizer before the text reaches it).
class BpeAdapter final : public data::Tokenizer {
 public:
  explicit BpeAdapter(data::BpeTokenizer bpe) : bpe_(std::move(bpe)) {
    info_.kind = data::TokenizerKind::GPT2BPE;
    info_.vocab_size = bpe_.vocab_size();
  }
  const data::TokenizerInfo& info() const override { return info_; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override { bpe_.encode(text, out); }
  std::string decode(std::span<const int32_t> ids) const override { return bpe_.decode(ids); }
  int32_t token_id(const std::string& name) const { return bpe_.token_id(name); }

 private:
  data::BpeTokenizer bpe_;
  data::TokenizerInfo info_;
};

json read_json_if_present(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return json::object();
  json j = parse_json_text(data::read_tokenizer_file(p.string(), "tokenizer config"), "'" + p.string() + "'");
  DS_USER_CHECK(j.is_object(), "'{}' is not a JSON object", p.string());
  return j;
}

// A special token as the tokenizer files spell it: a string, or an AddedToken
// object's "content"; "" when absent or null.
std::string token_text(const json& v, const std::string& where) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  DS_USER_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(),
                "{}: a special token must be a string or an object with a string \"content\"", where);
  return v["content"].get<std::string>();
}

}  // namespace

ChatTokenizer ChatTokenizer::load(const std::string& model_dir, const std::string& name,
                                  const std::optional<std::string>& eot_token) {
  std::error_code ec;
  DS_USER_CHECK(fs::is_directory(model_dir, ec), "--model_name_or_path '{}' is not a directory", model_dir);
  const fs::path dir(model_dir);
  const json cfg = read_json_if_present(dir / "tokenizer_config.json");
  const json map = read_json_if_present(dir / "special_tokens_map.json");
  ChatTokenizer t;
  // The special tokens' texts: GPT2Tokenizer's defaults, then
  // tokenizer_config.json, then special_tokens_map.json (which wins, as in
  // transformers' from_pretrained).
  // DeepSpeed-Chat loads a model named "llama" with LlamaTokenizer (tokenizer.model): its defaults.
  const bool llama_sp = name.find("llama") != std::string::npos && !fs::exists(dir / "tokenizer.json", ec) &&
                        fs::exists(dir / "tokenizer.model", ec);
  std::string bos = llama_sp ? "<s>" : "<|endoftext|>", eos = llama_sp ? "</s>" : bos, unk = llama_sp ? "<unk>" : bos,
              pad;
  std::vector<std::string> additional;
  auto take = [&](const json& j, const std::string& where) {
    auto one = [&](const char* key, std::string& out) {
      if (j.contains(key)) out = token_text(j[key], where + " " + key);
    };
    one("bos_token", bos);
    one("eos_token", eos);
    one("unk_token", unk);
    one("pad_token", pad);
    if (j.contains("additional_special_tokens") && j["additional_special_tokens"].is_array())
      for (const json& a : j["additional_special_tokens"]) additional.push_back(token_text(a, where));
  };
  take(cfg, (dir / "tokenizer_config.json").string());
  take(map, (dir / "special_tokens_map.json").string());
  std::function<int32_t(const std::string&)> id_of;
  auto flag = [&](const char* key, bool dflt) {
    if (!cfg.contains(key) || cfg[key].is_null()) return dflt;
    DS_USER_CHECK(cfg[key].is_boolean(), "{}: {} must be true or false", (dir / "tokenizer_config.json").string(), key);
    return cfg[key].get<bool>();
  };
  if (llama_sp) {  // LlamaTokenizer (transformers 4.36): legacy unless the config says otherwise
    auto sp = data::load_llama_sp_tokenizer((dir / "tokenizer.model").string(), flag("legacy", true), unk);
    const data::LlamaSpTokenizer* raw = sp.get();
    t.base_ = std::move(sp);
    t.add_bos_ = flag("add_bos_token", true);
    t.add_eos_ = flag("add_eos_token", false);
    t.sp_prefix_ = !raw->legacy();
    t.underline_id_ = raw->piece_id("\xe2\x96\x81");
    id_of = [raw](const std::string& s) { return raw->piece_id(s); };
  } else if (fs::exists(dir / "tokenizer.json", ec)) {
    t.base_ = data::load_hf_tokenizer(model_dir);
    const data::TokenizerInfo& info = t.base_->info();
    t.add_bos_ = info.add_bos;
    id_of = [&t](const std::string& s) {
      std::vector<int32_t> ids;
      t.base_->encode(s, ids);
      return ids.size() == 1 && t.base_->decode(ids) == s ? ids[0] : -1;
    };
  } else if (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec)) {
    auto bpe = std::make_unique<BpeAdapter>(
        data::BpeTokenizer::load((dir / "vocab.json").string(), (dir / "merges.txt").string()));
    const BpeAdapter* raw = bpe.get();
    t.base_ = std::move(bpe);
    const json& ab = cfg.contains("add_bos_token") ? cfg["add_bos_token"] : json(false);
    DS_USER_CHECK(ab.is_boolean(), "{}: add_bos_token must be true or false", (dir / "tokenizer_config.json").string());
    t.add_bos_ = ab.get<bool>();
    id_of = [raw](const std::string& s) { return raw->token_id(s); };
    const json added = read_json_if_present(dir / "added_tokens.json");
    for (const auto& [text, id] : added.items()) {
      DS_USER_CHECK(id.is_number_integer(), "{}: the id of '{}' is not an integer",
                    (dir / "added_tokens.json").string(), text);
      additional.push_back(text);
    }
  } else if (fs::exists(dir / "tokenizer.model", ec)) {
    throw UserError(fmt::format("{}: a SentencePiece tokenizer (tokenizer.model) without tokenizer.json is read as "
                                "LlamaTokenizer, which DeepSpeed-Chat uses for models named \"llama\" only ('{}')",
                                model_dir, name));
  } else {
    throw UserError(fmt::format("{}: no tokenizer found (looked for tokenizer.json, vocab.json + merges.txt, "
                                "tokenizer.model)",
                                model_dir));
  }
  t.size_ = t.base_->info().vocab_size;
  // A special token missing from the vocabulary gets the next id, as
  // transformers' add_special_tokens gives it.
  auto special = [&](const std::string& text) -> int32_t {
    if (text.empty()) return -1;
    for (const auto& [s, id] : t.specials_)
      if (s == text) return id;
    int32_t id = id_of(text);
    if (id < 0) id = static_cast<int32_t>(t.size_++);
    t.specials_.emplace_back(text, id);
    return id;
  };
  t.bos_id_ = special(bos);
  t.eos_id_ = special(eos);
  // An empty token text names no token: a bos the tokenizer must add, or the
  // eos every example ends with and is padded with, cannot be empty.
  DS_USER_CHECK(!t.add_bos_ || t.bos_id_ >= 0, "{}: add_bos_token is true but bos_token is empty",
                (dir / "tokenizer_config.json").string());
  DS_USER_CHECK(t.eos_id_ >= 0, "{}: eos_token is empty (DeepSpeed-Chat ends every example with it and pads with it)",
                (dir / "tokenizer_config.json").string());
  special(unk);
  for (const std::string& a : additional) special(a);
  // DeepSpeed-Chat's get_tokenizer: LLaMA gets a "[PAD]" token when it has no
  // pad; everything else pads with eos.
  if (name.find("llama") != std::string::npos)
    t.pad_id_ = special(pad.empty() ? "[PAD]" : pad);
  else
    t.pad_id_ = t.eos_id_;
  if (eot_token) special(*eot_token);
  t.eos_text_ = eos;
  // Longest first, so that a special token containing another wins.
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return t;
}

std::vector<int32_t> ChatTokenizer::encode(std::string_view input) const {
  std::vector<int32_t> out;
  if (add_bos_) out.push_back(bos_id_);
  const size_t first = out.size();
  // LlamaTokenizer without legacy: U+2581 first, and every U+2581 of the text a space.
  std::string prefixed;
  if (sp_prefix_ && !input.empty()) {
    prefixed = "\xe2\x96\x81";
    for (size_t i = 0; i < input.size();) {
      if (input.substr(i, 3) == "\xe2\x96\x81") {
        prefixed += ' ';
        i += 3;
      } else {
        prefixed += input[i++];
      }
    }
  }
  const std::string_view text = sp_prefix_ && !input.empty() ? std::string_view(prefixed) : input;
  size_t from = 0;
  while (from < text.size()) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& s : specials_) {  // the leftmost occurrence; the longest at a position
      const size_t at = text.find(s.first, from);
      if (at < best) {
        best = at;
        hit = &s;
      }
    }
    base_->encode(text.substr(from, best == std::string_view::npos ? std::string_view::npos : best - from), out);
    if (!hit) break;
    out.push_back(hit->second);
    from = best + hit->first.size();
  }
  // ... and the U+2581 piece dropped again when a special token follows it.
  if (sp_prefix_ && out.size() > first + 1 && out[first] == underline_id_ &&
      std::any_of(specials_.begin(), specials_.end(), [&](const auto& s) { return s.second == out[first + 1]; }))
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(first));
  if (add_eos_) out.push_back(eos_id_);
  return out;
}

std::string ChatTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  std::vector<int32_t> run;
  auto flush = [&] {
    s += base_->decode(run);
    run.clear();
  };
  for (int32_t id : ids) {
    const auto it = std::find_if(specials_.begin(), specials_.end(), [id](const auto& p) { return p.second == id; });
    if (it == specials_.end()) {
      run.push_back(id);
    } else {
      flush();
      s += it->first;
    }
  }
  flush();
  return s;
}

PaddedIds padded_ids(const ChatTokenizer& tok, const std::string& text, int64_t max_seq_len) {
  DS_CHECK(max_seq_len >= 1, "padded_ids: max_seq_len {}", max_seq_len);
  std::vector<int32_t> ids = tok.encode(text);
  if (static_cast<int64_t>(ids.size()) > max_seq_len) ids.resize(static_cast<size_t>(max_seq_len));
  PaddedIds p;
  p.length = static_cast<int64_t>(ids.size());
  p.ids = std::move(ids);
  p.ids.resize(static_cast<size_t>(max_seq_len), tok.pad_id());
  return p;
}

SftSample sft_sample(const ChatTokenizer& tok, std::string_view prompt_and_chosen, int64_t max_seq_len,
                     int64_t prompt_tokens) {
  PaddedIds p = padded_ids(tok, std::string(prompt_and_chosen) + tok.eos_text(), max_seq_len);
  SftSample s;
  s.length = p.length;
  s.targets.assign(static_cast<size_t>(max_seq_len), -1);
  // Target t predicts id t + 1: a prompt id (t + 1 < prompt_tokens) is not predicted.
  for (int64_t t = std::max<int64_t>(prompt_tokens - 1, 0); t + 1 < s.length; ++t) {
    s.targets[static_cast<size_t>(t)] = p.ids[static_cast<size_t>(t + 1)];
    ++s.counted;
  }
  s.tokens = std::move(p.ids);
  return s;
}

}  // namespace ds::chat
