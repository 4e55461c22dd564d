// The tokenizer interface: kind names, the GPT-2 BPE adapter, Megatron's
// document encoding (bos, eod) and the loader that picks a family by kind.
#include "lib/data/tokenizer.h"

#include <cctype>
#include <filesystem>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/data/bpe.h"

namespace ds::data {

namespace {

struct KindName {
  TokenizerKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {{TokenizerKind::GPT2BPE, "GPT2BPETokenizer"},
                               {TokenizerKind::GPTSentencePiece, "GPTSentencePieceTokenizer"},
                               {TokenizerKind::Llama2, "Llama2Tokenizer"},
                               {TokenizerKind::SentencePiece, "SentencePieceTokenizer"},
                               {TokenizerKind::HF, "HFTokenizer"}};
constexpr const char* kSupported =
    "GPT2BPETokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer, HFTokenizer";

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(BpeTokenizer bpe) : bpe_(std::move(bpe)) {
    info_.kind = TokenizerKind::GPT2BPE;
    info_.vocab_size = bpe_.vocab_size();
    info_.bos_id = info_.eos_id = info_.eod_id = bpe_.eod_id();  // GPT-2: <|endoftext|> is all three
  }
  const TokenizerInfo& info() const override { return info_; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override { bpe_.encode(text, out); }
  std::string decode(std::span<const int32_t> ids) const override { return bpe_.decode(ids); }

 private:
  BpeTokenizer bpe_;
  TokenizerInfo info_;
};

void require_file(const std::string& path, const char* flag, TokenizerKind kind) {
  DS_USER_CHECK(!path.empty(), "--tokenizer-type {} needs {}", tokenizer_kind_name(kind), flag);
  std::error_code ec;
  DS_USER_CHECK(std::filesystem::exists(path, ec), "{} {} not found (--tokenizer-type {})", flag, path,
                tokenizer_kind_name(kind));
}

}  // namespace

const char* tokenizer_kind_name(TokenizerKind k) {
  for (const KindName& kn : kKinds)
    if (kn.kind == k) return kn.name;
  return "?";
}

// Case-insensitive, as the command line's --normalization.
static bool same_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

TokenizerKind parse_tokenizer_kind(std::string_view name, std::string_view flag) {
  for (const KindName& kn : kKinds)
    if (same_name(name, kn.name)) return kn.kind;
  if (name == "BertWordPieceLowerCase" || name == "BertWordPieceCase" || name == "NullTokenizer")
    DS_USER_ERROR("{} {} is not supported (GPT pretraining here uses one of: {})", flag, name, kSupported);
  DS_USER_ERROR("{} {} is not a tokenizer type; expected one of: {}", flag, name, kSupported);
}

void Tokenizer::encode_document(std::string_view text, bool append_eod, std::vector<int32_t>& out) const {
  const TokenizerInfo& in = info();
  const size_t start = out.size();
  if (in.add_bos) out.push_back(in.bos_id);
  encode(text, out);
  if (append_eod && out.size() > start) out.push_back(in.eod_id);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerSpec& spec) {
  switch (spec.kind) {
    case TokenizerKind::GPT2BPE:
      require_file(spec.vocab_file, "--vocab-file", spec.kind);
      require_file(spec.merge_file, "--merge-file", spec.kind);
      return std::make_unique<Gpt2Tokenizer>(BpeTokenizer::load(spec.vocab_file, spec.merge_file));
    case TokenizerKind::GPTSentencePiece:
    case TokenizerKind::Llama2:
    case TokenizerKind::SentencePiece:
      require_file(spec.model_path, "--tokenizer-model", spec.kind);
      return load_sentencepiece_tokenizer(spec);
    case TokenizerKind::HF: {
      require_file(spec.model_path, "--tokenizer-model", spec.kind);
      // A model directory without tokenizer.json but with GPT2Tokenizer's
      // files: what AutoTokenizer loads there.
      const std::filesystem::path dir(spec.model_path);
      std::error_code ec;
      if (std::filesystem::is_directory(dir, ec) && !std::filesystem::exists(dir / "tokenizer.json", ec) &&
          std::filesystem::exists(dir / "vocab.json", ec) && std::filesystem::exists(dir / "merges.txt", ec))
        return std::make_unique<Gpt2Tokenizer>(
            BpeTokenizer::load((dir / "vocab.json").string(), (dir / "merges.txt").string()));
      return load_hf_tokenizer(spec.model_path);
    }
  }
  DS_USER_ERROR("unknown tokenizer kind");
}

TokenizerInfo tokenizer_info(const TokenizerSpec& spec) { return load_tokenizer(spec)->info(); }

std::string read_tokenizer_file(const std::string& path, std::string_view what) {
  return read_small_file(path, kMaxTokenizerFileBytes, fmt::format("{} '{}'", what, path));
}

}  // namespace ds::data
