// Fuzz target: SentencePiece model files (lib/data/sp_tokenizer.cpp): the
// input loaded as tokenizer.model under each SentencePiece type (Megatron's
// special tokens included), then a fixed text encoded, every id checked
// against the vocabulary, and decoded. Without the library the load is one
// UserError, which the target accepts.
#include "fuzz/targets/fuzz_common.h"
#include "lib/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet();
  const std::string path =
      ds::fuzz::write_scratch("tokenizer.model", std::string_view(reinterpret_cast<const char*>(data), size));
  for (auto kind : {ds::data::TokenizerKind::GPTSentencePiece, ds::data::TokenizerKind::Llama2,
                    ds::data::TokenizerKind::SentencePiece}) {
    ds::fuzz::run_one([&] {
      const auto tok = ds::data::load_tokenizer({kind, path, "", ""});
      const std::string text = "Hello <EOD> world,  it's 2024!\n\t caf\xc3\xa9 \xe4\xb8\xad <MASK>x";
      std::vector<int32_t> ids;
      tok->encode_document(text, true, ids);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->info().vocab_size) std::abort();
      (void)tok->decode(ids);
    });
  }
  return 0;
}
