// dsprep's tokenization pass: documents -> one Megatron .bin/.idx dataset, on
// N worker threads with the same output as one (documents are tokenized in
// batches and written in input order), with a progress line every
// log_interval documents (a redrawn status line on a terminal).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "apps/dsprep/documents.h"
#include "lib/data/tokenizer.h"

namespace ds::prep {

struct TokenizeOptions {
  data::TokenizerSpec tokenizer;
  std::string output_prefix;
  std::string dtype = "auto";  // auto: u16 below 65500 ids, else i32 (Megatron's rule)
  bool append_eod = true;
  int workers = 1;
  int64_t log_interval = 1000;  // documents between progress lines (0: none)
};

struct TokenizeStats {
  int64_t documents = 0, empty_documents = 0, tokens = 0, bytes = 0;
  int64_t vocab_size = 0;
  std::string dtype;
  double seconds = 0;
};

TokenizeStats tokenize_to_dataset(const std::vector<DocumentSource>& sources, const TokenizeOptions& opt);

}  // namespace ds::prep
