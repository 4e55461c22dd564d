// The tokenizers dsprep and dstrain use, behind one interface, chosen by
// Megatron's --tokenizer-type:
//   GPT2BPETokenizer           vocab.json + merges.txt (lib/data/bpe.h)
//   GPTSentencePieceTokenizer  tokenizer.model; eod = the model's eos; no bos added
//   Llama2Tokenizer            tokenizer.model; bos before every document, eod = eos
//   SentencePieceTokenizer     tokenizer.model plus Megatron's special tokens
//                              (<CLS> <SEP> <EOD> <MASK>, and <PAD>/<BOS>/<EOS> when
//                              the model has none) appended after the model's ids;
//                              eod = <EOD>; special tokens in text become their ids
//   HFTokenizer                a Hugging Face tokenizer.json (byte-level BPE):
//                              lib/data/hf_tokenizer.h; eod = eos
// TokenizerInfo carries what the trainer and the Hugging Face export need (the
// vocabulary size and the bos/eos/eod/pad ids); docs/tokenizers.md has the rules.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::data {

enum class TokenizerKind { GPT2BPE, GPTSentencePiece, Llama2, SentencePiece, HF };

// Megatron's name of a kind ("GPT2BPETokenizer", ...).
const char* tokenizer_kind_name(TokenizerKind k);
// Parses a --tokenizer-type value; an unknown or unsupported name is a UserError
// naming `flag` and the supported names.
TokenizerKind parse_tokenizer_kind(std::string_view name, std::string_view flag = "--tokenizer-type");
// True when the build has the SentencePiece library (libsentencepiece-dev).
bool have_sentencepiece();

// Where a tokenizer's files are: vocab_file + merge_file for GPT2BPE,
// model_path (tokenizer.model, or tokenizer.json or a directory holding one)
// for the others.
struct TokenizerSpec {
  TokenizerKind kind = TokenizerKind::GPT2BPE;
  std::string model_path, vocab_file, merge_file;
};

// The ids a model and its Hugging Face config.json need; -1 where the
// tokenizer has no such token.
struct TokenizerInfo {
  TokenizerKind kind = TokenizerKind::GPT2BPE;
  int64_t vocab_size = 0;  // largest id + 1, before padding to --make-vocab-size-divisible-by
  int32_t bos_id = -1, eos_id = -1, eod_id = -1, pad_id = -1;
  bool add_bos = false;  // a bos id starts every document (Llama2Tokenizer, HF templates)
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const TokenizerInfo& info() const = 0;
  // Appends the ids of `text` (no bos/eod added). Thread-safe.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // A document as Megatron's preprocess_data tokenizes it: bos first where the
  // tokenizer adds one, then the text, then eod when append_eod and the
  // document has any token (text that encodes to nothing stays empty).
  void encode_document(std::string_view text, bool append_eod, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;
};

// Checks the spec (every file the kind needs was given; "--vocab-file" /
// "--tokenizer-model" named in the error) and loads the tokenizer. Missing or
// corrupt files are a UserError naming the file.
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerSpec& spec);
// load_tokenizer(spec)->info(), for the trainer and the export.
TokenizerInfo tokenizer_info(const TokenizerSpec& spec);

// SentencePiece text up to kSpWholeBytes is encoded whole (the library's
// ids, for any model); longer text in pieces of about kSpPieceBytes, cut
// where the ids stay those of the whole text; a stretch longer than
// kSpMaxPieceBytes without such a cut is refused (lib/data/sp_tokenizer.cpp).
inline constexpr size_t kSpWholeBytes = size_t(2) << 20;
inline constexpr size_t kSpPieceBytes = size_t(1) << 20;
inline constexpr size_t kSpMaxPieceBytes = size_t(4) << 20;

// Tokenizer files (vocab.json, merges.txt, tokenizer.model, tokenizer.json)
// are read whole, and only when they are regular files of at most this size:
// a directory, a FIFO, a device or a larger file is one UserError naming it.
inline constexpr size_t kMaxTokenizerFileBytes = size_t(1) << 30;
// The contents of such a file; `what` names it in errors ("vocab file").
std::string read_tokenizer_file(const std::string& path, std::string_view what);

// Hugging Face's LlamaTokenizer (transformers' SentencePiece tokenizer, the
// one DeepSpeed-Chat loads for models named "llama") on text between its
// special tokens: encode() is its _tokenize. legacy (tokenizer_config.json's
// "legacy", transformers' default true): the model's ids as the library
// gives them (with its dummy prefix). Not legacy: the model without its dummy
// prefix, and a text starting with a space or U+2581 is encoded after
// `unk_text`, whose pieces are then dropped (so it keeps its leading space).
class LlamaSpTokenizer : public Tokenizer {
 public:
  virtual int32_t piece_id(const std::string& piece) const = 0;  // -1: not a piece
  virtual bool legacy() const = 0;
};
std::unique_ptr<LlamaSpTokenizer> load_llama_sp_tokenizer(const std::string& model_path, bool legacy,
                                                          const std::string& unk_text);

// Internal constructors, one per family (each file defines its own).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerSpec& spec);
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace ds::data
