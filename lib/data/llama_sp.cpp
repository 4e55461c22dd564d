// Hugging Face's LlamaTokenizer over the SentencePiece library (tokenizer.h).
// Its non-legacy behaviour loads the model with normalizer_spec.add_dummy_prefix
// false: the model proto is rewritten here (ModelProto field 3, NormalizerSpec,
// field 3, a bool) with a few lines of protobuf wire format, the library then
// reads the result.
#include <memory>
#include <string>

#include "lib/core/error.h"
#include "lib/data/tokenizer.h"

#ifdef DS_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace ds::data {

#ifdef DS_HAVE_SENTENCEPIECE

namespace {

constexpr std::string_view kUnderline = "\xe2\x96\x81";  // U+2581

// Protobuf wire format, as far as needed: varints and a message's fields.
bool read_varint(std::string_view b, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; at < b.size() && shift < 64; shift += 7) {
    const auto c = static_cast<uint8_t>(b[at++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

void put_varint(std::string& out, uint64_t v) {
  do {
    const auto c = static_cast<uint8_t>(v & 0x7f);
    v >>= 7;
    out.push_back(static_cast<char>(v ? c | 0x80 : c));
  } while (v);
}

struct Field {
  uint32_t number, wire;
  std::string_view whole;    // tag and value as in the message
  std::string_view payload;  // a length-delimited field's bytes
};

// The message's fields in order; false when it is not well formed.
bool fields(std::string_view msg, std::vector<Field>& out) {
  size_t at = 0;
  while (at < msg.size()) {
    const size_t start = at;
    uint64_t tag = 0, v = 0;
    if (!read_varint(msg, at, tag)) return false;
    Field f{static_cast<uint32_t>(tag >> 3), static_cast<uint32_t>(tag & 7), {}, {}};
    switch (f.wire) {
      case 0: if (!read_varint(msg, at, v)) return false; break;
      case 1: at += 8; break;
      case 5: at += 4; break;
      case 2:
        if (!read_varint(msg, at, v) || v > msg.size() - at) return false;
        f.payload = msg.substr(at, v);
        at += v;
        break;
      default: return false;
    }
    if (at > msg.size()) return false;
    f.whole = msg.substr(start, at - start);
    out.push_back(f);
  }
  return true;
}

// The model with normalizer_spec.add_dummy_prefix = false (transformers'
// get_spm_processor for legacy = false: NormalizerSpec(add_dummy_prefix=False)
// merged into the model's).
std::string without_dummy_prefix(const std::string& model, const std::string& path) {
  std::vector<Field> top;
  DS_USER_CHECK(fields(model, top), "{}: not a SentencePiece model (malformed protobuf)", path);
  std::string out;
  bool done = false;
  for (const Field& f : top) {
    if (f.number != 3 || f.wire != 2 || done) {
      out.append(f.whole);
      continue;
    }
    std::vector<Field> norm;
    DS_USER_CHECK(fields(f.payload, norm), "{}: not a SentencePiece model (malformed normalizer spec)", path);
    std::string spec;
    for (const Field& g : norm)
      if (g.number != 3) spec.append(g.whole);
    spec += '\x18';  // field 3, varint
    spec += '\x00';  // false
    out += '\x1a';   // field 3, length-delimited
    put_varint(out, spec.size());
    out += spec;
    done = true;
  }
  DS_USER_CHECK(done, "{}: the SentencePiece model has no normalizer spec", path);
  return out;
}

class LlamaSp final : public LlamaSpTokenizer {
 public:
  LlamaSp(const std::string& path, bool legacy, const std::string& unk_text) : legacy_(legacy), unk_text_(unk_text) {
    std::string bytes = read_tokenizer_file(path, "tokenizer.model");
    if (!legacy) bytes = without_dummy_prefix(bytes, path);
    sentencepiece::util::Status st;
    try {
      st = sp_.LoadFromSerializedProto(bytes);
    } catch (const std::exception& e) {
      DS_USER_ERROR("{}: not a readable SentencePiece model ({})", path, e.what());
    }
    DS_USER_CHECK(st.ok(), "{}: not a readable SentencePiece model ({})", path, st.ToString());
    DS_USER_CHECK(sp_.GetPieceSize() > 0, "{}: the SentencePiece model has no pieces", path);
    info_.kind = TokenizerKind::Llama2;
    info_.vocab_size = sp_.GetPieceSize();
    info_.bos_id = sp_.bos_id();
    info_.eos_id = info_.eod_id = sp_.eos_id();
    info_.pad_id = sp_.pad_id();
    std::vector<int> ids;
    (void)sp_.Encode(unk_text_, &ids);
    unk_length_ = ids.size();
  }
  const TokenizerInfo& info() const override { return info_; }
  bool legacy() const override { return legacy_; }
  int32_t piece_id(const std::string& piece) const override {
    const int id = sp_.PieceToId(piece);
    return id != sp_.unk_id() || piece == sp_.IdToPiece(sp_.unk_id()) ? id : -1;
  }
  // LlamaTokenizer._tokenize.
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    if (text.empty()) return;
    std::vector<int> ids;
    if (legacy_ || !(text.starts_with(' ') || text.starts_with(kUnderline))) {
      (void)sp_.Encode(text, &ids);
      out.insert(out.end(), ids.begin(), ids.end());
      return;
    }
    (void)sp_.Encode(unk_text_ + std::string(text), &ids);
    const size_t skip = ids.size() >= unk_length_ ? unk_length_ : 0;
    out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(skip), ids.end());
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v;
    for (int32_t id : ids)
      if (id >= 0 && id < sp_.GetPieceSize()) v.push_back(id);
    std::string s;
    (void)sp_.Decode(v, &s);
    return s;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  TokenizerInfo info_;
  bool legacy_;
  std::string unk_text_;
  size_t unk_length_ = 0;
};

}  // namespace

std::unique_ptr<LlamaSpTokenizer> load_llama_sp_tokenizer(const std::string& model_path, bool legacy,
                                                          const std::string& unk_text) {
  return std::make_unique<LlamaSp>(model_path, legacy, unk_text);
}

#else  // !DS_HAVE_SENTENCEPIECE

std::unique_ptr<LlamaSpTokenizer> load_llama_sp_tokenizer(const std::string& model_path, bool, const std::string&) {
  DS_USER_ERROR("{}: LLaMA's SentencePiece tokenizer needs the SentencePiece library, which this build does not "
                "have: install libsentencepiece-dev (scripts/setup.sh) and rebuild",
                model_path);
}

#endif

}  // namespace ds::data
