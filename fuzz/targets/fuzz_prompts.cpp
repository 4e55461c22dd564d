// Fuzz target: dsgen's prompts (lib/gen/prompts.cpp): the input read as a
// --prompt-file (JSON lines), and each prompt (and the input itself, as a
// stdin line) checked and encoded with a small byte-level BPE for a model of
// 64 positions; every id must be within the vocabulary.
#include "fuzz/targets/fuzz_common.h"
#include "lib/data/bpe.h"
#include "lib/gen/prompts.h"

namespace {

// A byte-level BPE learned once from a fixed text (every byte has an id).
const ds::data::Tokenizer& tokenizer() {
  static const std::unique_ptr<ds::data::Tokenizer> tok = [] {
    const auto bpe = ds::data::train_bpe("Once upon a time there was a prompt. Once upon a time.", 280);
    const std::string dir = ds::fuzz::scratch_dir();
    ds::data::write_bpe_files(bpe, dir + "/p_vocab.json", dir + "/p_merges.txt");
    return ds::data::load_tokenizer({ds::data::TokenizerKind::GPT2BPE, "", dir + "/p_vocab.json",
                                     dir + "/p_merges.txt"});
  }();
  return *tok;
}

void encode(const std::string& text, int64_t index) {
  const ds::data::Tokenizer& tok = tokenizer();
  const int64_t V = tok.info().vocab_size;
  const std::vector<int32_t> ids = ds::gen::encode_prompt(tok, text, index, 64, V);
  for (int32_t id : ids)
    if (id < 0 || id >= V) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet();
  const std::string in(reinterpret_cast<const char*>(data), size);
  ds::fuzz::run_one([&] { encode(in, 1); });
  const std::string path = ds::fuzz::write_scratch("prompts.jsonl", in);
  return ds::fuzz::run_one([&] {
    const std::vector<std::string> prompts = ds::gen::read_prompt_file(path);
    for (size_t i = 0; i < prompts.size(); ++i) ds::fuzz::run_one([&] { encode(prompts[i], int64_t(i) + 1); });
  });
}
