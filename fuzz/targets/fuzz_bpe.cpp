// Fuzz target: GPT-2 BPE files (lib/data/bpe.cpp): vocab.json and merges.txt
// loaded, then a fixed text encoded and decoded. Input: "VOCAB JSON\n@@MERGES@@\nMERGES".
#include "fuzz/targets/fuzz_common.h"
#include "lib/data/bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto parts = ds::fuzz::split_input(in, "\n@@MERGES@@\n");
  const std::string_view vocab = parts.first, merges = parts.second;
  const std::string vp = ds::fuzz::write_scratch("vocab.json", vocab);
  const std::string mp = ds::fuzz::write_scratch("merges.txt", merges);
  ds::fuzz::run_one([&] { (void)ds::data::vocab_file_size(vp); });
  return ds::fuzz::run_one([&] {
    const auto tok = ds::data::BpeTokenizer::load(vp, mp);
    const std::string text = "Hello world, it's 2024!\n\tUnicode: caf\xc3\xa9 \xe4\xb8\xad";
    if (tok.decode(tok.encode(text)) != text) std::abort();  // byte level: always round-trips
  });
}
