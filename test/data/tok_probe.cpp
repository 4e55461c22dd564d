// tok_probe: runs one of our tokenizers over JSON lines ({"text": ...}) for
// tok_check.py, which compares the ids with the reference libraries.
//   tok_probe TYPE MODEL_OR_VOCAB [MERGES] < texts.jsonl
// Prints one JSON object: {"info": {...}, "docs": [{"ids": [...], "doc": [...],
// "roundtrip": bool}, ...]} where ids is encode(text), doc the document as
// dsprep writes it (bos where the type adds one, eod appended), roundtrip
// whether decode(ids) gives the text back byte for byte.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/core/error.h"
#include "lib/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tok_probe TYPE MODEL_OR_VOCAB [MERGES] < texts.jsonl\n");
    return 2;
  }
  try {
    ds::data::TokenizerSpec spec;
    spec.kind = ds::data::parse_tokenizer_kind(argv[1]);
    if (spec.kind == ds::data::TokenizerKind::GPT2BPE) {
      spec.vocab_file = argv[2];
      spec.merge_file = argc > 3 ? argv[3] : "";
    } else {
      spec.model_path = argv[2];
    }
    const auto tok = ds::data::load_tokenizer(spec);
    const ds::data::TokenizerInfo& in = tok->info();
    nlohmann::json out = {{"info",
                           {{"vocab_size", in.vocab_size}, {"bos_id", in.bos_id}, {"eos_id", in.eos_id},
                            {"eod_id", in.eod_id}, {"pad_id", in.pad_id}, {"add_bos", in.add_bos}}},
                          {"docs", nlohmann::json::array()}};
    std::string line;
    while (std::getline(std::cin, line)) {
      const std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
      const std::vector<int32_t> ids = tok->encode(text);
      std::vector<int32_t> doc;
      tok->encode_document(text, true, doc);
      out["docs"].push_back({{"ids", ids}, {"doc", doc}, {"roundtrip", tok->decode(ids) == text}});
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tok_probe: error: %s\n", e.what());
    return 1;
  }
}
