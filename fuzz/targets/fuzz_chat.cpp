// Fuzz target: dschat's inputs. The first byte picks what the rest is:
//   even: a DeepSpeed-Chat data file (train.json: JSON Lines or an array of
//         {prompt, chosen, rejected}) read by lib/chat/pairs.cpp, each usable
//         example made into a step-1 sample (64 positions) with a small
//         byte-level BPE tokenizer;
//   odd:  the tokenizer_config.json beside that tokenizer's vocab.json +
//         merges.txt, loaded by lib/chat/chat_tokenizer.cpp and used on a
//         text holding its special tokens.
// Every sample must hold ids within the tokenizer and targets that are ids
// or -1.
#include "fuzz/targets/fuzz_common.h"
#include "lib/chat/chat_tokenizer.h"
#include "lib/chat/pairs.h"
#include "lib/data/bpe.h"

namespace {

// vocab.json + merges.txt learned once from a fixed text, in the scratch dir.
const std::string& model_dir() {
  static const std::string dir = [] {
    const std::string d = ds::fuzz::scratch_dir() + "/chat_model";
    std::filesystem::create_directories(d);
    const auto bpe = ds::data::train_bpe("Human: hello there. Assistant: hello! <|endoftext|>", 280);
    ds::data::write_bpe_files(bpe, d + "/vocab.json", d + "/merges.txt");
    return d;
  }();
  return dir;
}

void check_sample(const ds::chat::ChatTokenizer& tok, const std::string& text) {
  const ds::chat::SftSample s = ds::chat::sft_sample(tok, text, 64);
  if (s.tokens.size() != 64 || s.targets.size() != 64) std::abort();
  for (int32_t id : s.tokens)
    if (id < 0 || id >= tok.size()) std::abort();
  for (int32_t id : s.targets)
    if (id < -1 || id >= tok.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet();
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string& dir = model_dir();
  if (data[0] % 2 == 0) {
    std::filesystem::remove(dir + "/tokenizer_config.json");
    const std::string path = ds::fuzz::write_scratch("train.json", in);
    return ds::fuzz::run_one([&] {
      const ds::chat::ChatTokenizer tok = ds::chat::ChatTokenizer::load(dir, "fuzz");
      for (const ds::chat::ChatExample& e : ds::chat::read_pair_file(path))
        if (const auto t = ds::chat::prompt_and_chosen(e)) check_sample(tok, *t);
    });
  }
  {
    std::ofstream f(dir + "/tokenizer_config.json", std::ios::binary | std::ios::trunc);
    f.write(in.data(), static_cast<std::streamsize>(in.size()));
  }
  return ds::fuzz::run_one([&] {
    const ds::chat::ChatTokenizer tok = ds::chat::ChatTokenizer::load(dir, size % 3 == 0 ? "llama" : "opt",
                                                                      std::optional<std::string>("<|eot|>"));
    check_sample(tok, "Human: hello" + tok.eos_text() + " there <|eot|> [PAD] " + in.substr(0, 64));
  });
}
