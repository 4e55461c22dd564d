// Fuzz target: Hugging Face tokenizer.json (lib/data/hf_tokenizer.cpp): the
// file loaded, then a fixed text with special tokens, unicode and whitespace
// runs encoded, every id checked against the vocabulary, and decoded.
// Also splits the input itself by the three hand-written regex patterns and
// checks that the pieces cover it exactly.
#include "fuzz/targets/fuzz_common.h"
#include "lib/data/hf_tokenizer.h"
#include "lib/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (auto p : {ds::data::SplitPattern::Gpt2, ds::data::SplitPattern::Cl100k, ds::data::SplitPattern::Qwen2}) {
    std::vector<std::string_view> pieces;
    ds::data::split_by_pattern(p, in, pieces);
    std::string joined;
    for (std::string_view v : pieces) {
      if (v.empty()) std::abort();
      joined += v;
    }
    if (joined != in) std::abort();
  }
  const std::string path = ds::fuzz::write_scratch("tokenizer.json", in);
  return ds::fuzz::run_one([&] {
    const auto tok = ds::data::load_hf_tokenizer(path);
    const std::string text = "Hello <|endoftext|> world, it's 2024!\n\n\t caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x91\x8d  x";
    const std::vector<int32_t> ids = tok->encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= tok->info().vocab_size) std::abort();
    (void)tok->decode(ids);
  });
}
