// SentencePiece tokenizers (tokenizer.model) through the SentencePiece library,
// with Megatron's three meanings of a model:
//   GPTSentencePieceTokenizer: the model's ids; eod = eos; vocab = piece count.
//   Llama2Tokenizer: the same, plus bos before every document.
//   SentencePieceTokenizer: Megatron's special tokens added after the model's
//     pieces when missing (<CLS> <SEP> <EOD> <MASK>, then the model's pad, bos
//     and eos pieces, or <PAD>/<BOS>/<EOS> where the model has none); in text,
//     the earliest special token is cut out and encoded as its id, the pieces
//     between are encoded separately; eod = <EOD>.
// Without the library (DS_HAVE_SENTENCEPIECE undefined) loading one of these is
// a UserError saying how to get it.
// Text longer than kSpWholeBytes is encoded in pieces of about kSpPieceBytes
// (the library needs some 100-200 bytes of memory per input byte): cut at a
// single space between two printable ASCII characters, the space dropped (the
// next piece's dummy prefix stands for it). That gives the ids of encoding the
// text whole when the model adds a dummy prefix and none of its pieces holds a
// character followed by a space (checked at load; a unigram model may still
// differ at float near-ties, docs/tokenizers.md); a model that fails the check
// encodes up to kSpMaxPieceBytes whole and refuses longer text, as does a
// stretch longer than kSpMaxPieceBytes without such a space.
#include <algorithm>
#include <map>
#include <memory>

#include "lib/core/error.h"
#include "lib/data/tokenizer.h"

#ifdef DS_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace ds::data {

#ifdef DS_HAVE_SENTENCEPIECE

bool have_sentencepiece() { return true; }

namespace {

constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's whitespace

bool printable_ascii(char c) { return c > ' ' && c < 0x7f; }

// A single space between two printable ASCII characters.
bool split_point(std::string_view t, size_t i) {
  return t[i] == ' ' && i > 0 && i + 1 < t.size() && printable_ascii(t[i - 1]) && printable_ascii(t[i + 1]);
}

// The last split point in [lo, hi), or npos.
size_t last_split_point(std::string_view t, size_t lo, size_t hi) {
  for (size_t i = hi; i-- > lo;)
    if (split_point(t, i)) return i;
  return std::string_view::npos;
}

// The first split point in [lo, hi), or npos.
size_t first_split_point(std::string_view t, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i)
    if (split_point(t, i)) return i;
  return std::string_view::npos;
}

class SpTokenizer final : public Tokenizer {
 public:
  explicit SpTokenizer(const TokenizerSpec& spec) {
    // Read here (a regular file of bounded size), so that a directory or a device is refused by name.
    const std::string bytes = read_tokenizer_file(spec.model_path, "--tokenizer-model");
    sentencepiece::util::Status st;
    try {  // the library throws on some malformed models (a piece of zero length: Darts' exception)
      st = sp_.LoadFromSerializedProto(bytes);
    } catch (const std::exception& e) {
      DS_USER_ERROR("--tokenizer-model {}: not a readable SentencePiece model ({})", spec.model_path, e.what());
    }
    if (!st.ok())
      DS_USER_ERROR("--tokenizer-model {}: not a readable SentencePiece model ({})", spec.model_path,
                    st.ToString());
    const int n = sp_.GetPieceSize();
    DS_USER_CHECK(n > 0, "--tokenizer-model {}: the SentencePiece model has no pieces", spec.model_path);
    info_.kind = spec.kind;
    info_.vocab_size = n;
    info_.bos_id = sp_.bos_id();
    info_.eos_id = sp_.eos_id();
    info_.pad_id = sp_.pad_id();
    info_.eod_id = info_.eos_id;
    if (spec.kind == TokenizerKind::SentencePiece) add_megatron_specials();
    info_.add_bos = spec.kind == TokenizerKind::Llama2;
    const char* need = nullptr;
    if (info_.eod_id < 0) need = "an end-of-document (eos) piece";
    if (info_.add_bos && info_.bos_id < 0) need = "a bos piece";
    if (need)
      DS_USER_ERROR("--tokenizer-model {}: the SentencePiece model has no {}, which --tokenizer-type {} needs",
                    spec.model_path, need, tokenizer_kind_name(spec.kind));
    model_path_ = spec.model_path;
    split_exact_ = splits_exactly();
  }

  const TokenizerInfo& info() const override { return info_; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    if (specials_.empty()) return encode_plain(text, out);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t best = std::string_view::npos;
      const Special* hit = nullptr;
      for (const Special& s : specials_) {  // earliest occurrence; first listed wins a tie
        const size_t at = text.find(s.text, pos);
        if (at < best) best = at, hit = &s;
      }
      if (!hit) break;
      encode_plain(text.substr(pos, best - pos), out);
      out.push_back(hit->id);
      pos = best + hit->text.size();
    }
    encode_plain(text.substr(pos), out);
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out, part;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      part.clear();
      (void)sp_.Decode(run, &part);
      out += part;
      run.clear();
    };
    for (int32_t id : ids) {
      auto it = added_.find(id);
      if (it != added_.end()) {
        flush();
        out += it->second;
      } else if (id >= 0 && id < sp_.GetPieceSize()) {
        run.push_back(id);
      }
    }
    flush();
    return out;
  }

 private:
  struct Special {
    std::string text;
    int32_t id;
  };

  // Long text in pieces cut at split points (the file's opening comment).
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    if (text.size() <= kSpWholeBytes || (!split_exact_ && text.size() <= kSpMaxPieceBytes))
      return encode_piece(text, out);
    DS_USER_CHECK(split_exact_,
                  "SentencePiece: a text of {} bytes is more than the {} MiB this model encodes at once (its pieces "
                  "span spaces, so the text cannot be cut exactly); split it into smaller documents",
                  text.size(), kSpMaxPieceBytes >> 20);
    size_t pos = 0;
    while (text.size() - pos > kSpPieceBytes) {
      size_t cut = last_split_point(text, pos + 1, pos + kSpPieceBytes);
      if (cut == std::string_view::npos)
        cut = first_split_point(text, pos + kSpPieceBytes, std::min(text.size(), pos + kSpMaxPieceBytes));
      if (cut == std::string_view::npos) {
        DS_USER_CHECK(text.size() - pos <= kSpMaxPieceBytes,
                      "SentencePiece: {} bytes from byte {} hold no single space between printable ASCII "
                      "characters, where the text can be cut exactly; at most {} MiB are encoded at once; split "
                      "it into smaller documents", text.size() - pos, pos, kSpMaxPieceBytes >> 20);
        break;
      }
      encode_piece(text.substr(pos, cut - pos), out);
      pos = cut + 1;  // the space: the next piece's dummy prefix
    }
    encode_piece(text.substr(pos), out);
  }

  void encode_piece(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    // A malformed model (its normalizer rules inconsistent with its pieces) loads but fails here.
    if (!st.ok())
      DS_USER_ERROR("--tokenizer-model {}: the SentencePiece model cannot encode a text of {} bytes ({})",
                    model_path_, text.size(), st.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // Whether cutting at a split point keeps the ids of the whole text: "a b"
  // normalizes to "a"'s pieces followed by "b"'s, the latter starting with the
  // dummy prefix, and no piece could cross such a cut (no piece holds a
  // non-space character followed by the whitespace mark).
  bool splits_exactly() const {
    auto joined = [&](std::string_view t) {
      std::string s;
      for (const std::string& p : sp_.EncodeAsPieces(t)) s += p;
      return s;
    };
    const std::string b = joined("b");
    if (joined("a b") != joined("a") + b || b.rfind(kSpace, 0) != 0) return false;
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      if (sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsByte(id)) continue;
      const std::string p = sp_.IdToPiece(id);
      for (size_t at = p.find(kSpace, 1); at != std::string::npos; at = p.find(kSpace, at + 1))
        if (at < kSpace.size() || p.compare(at - kSpace.size(), kSpace.size(), kSpace) != 0) return false;
    }
    return true;
  }

  // Megatron's _SentencePieceTokenizer._initalize (without extra ids).
  void add_megatron_specials() {
    auto add = [&](const std::string& t) {
      int32_t id = sp_.PieceToId(t);
      const bool known = id != sp_.unk_id() || t == sp_.IdToPiece(sp_.unk_id());
      if (!known) {
        auto it = std::find_if(specials_.begin(), specials_.end(), [&](const Special& s) { return s.text == t; });
        if (it != specials_.end()) return it->id;
        id = static_cast<int32_t>(info_.vocab_size++);
        added_[id] = t;
      }
      if (std::none_of(specials_.begin(), specials_.end(), [&](const Special& s) { return s.text == t; }))
        specials_.push_back({t, id});
      return id;
    };
    auto piece_or = [&](int id, const char* dflt) {
      return id >= 0 && id < sp_.GetPieceSize() ? sp_.IdToPiece(id) : std::string(dflt);
    };
    for (const char* t : {"<CLS>", "<SEP>"}) add(t);
    info_.eod_id = add("<EOD>");
    add("<MASK>");
    info_.pad_id = add(piece_or(sp_.pad_id(), "<PAD>"));
    info_.bos_id = add(piece_or(sp_.bos_id(), "<BOS>"));
    info_.eos_id = add(piece_or(sp_.eos_id(), "<EOS>"));
  }

  sentencepiece::SentencePieceProcessor sp_;
  TokenizerInfo info_;
  std::string model_path_;
  std::vector<Special> specials_;         // SentencePieceTokenizer only, in Megatron's order
  std::map<int32_t, std::string> added_;  // ids past the model's pieces -> their text
  bool split_exact_ = false;              // long text may be cut at split points
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerSpec& spec) {
  return std::make_unique<SpTokenizer>(spec);
}

#else  // !DS_HAVE_SENTENCEPIECE

bool have_sentencepiece() { return false; }

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerSpec& spec) {
  DS_USER_ERROR(
      "--tokenizer-type {} (--tokenizer-model {}) needs the SentencePiece library, which this build "
      "does not have: install libsentencepiece-dev (scripts/setup.sh) and rebuild",
      tokenizer_kind_name(spec.kind), spec.model_path);
}

#endif

}  // namespace ds::data
