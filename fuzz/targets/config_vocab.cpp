// For the fuzz build of the config parser: vocab_size_from_file as
// lib/train/data_pipeline.cpp defines it (that file needs the whole data
// pipeline, which the fuzz build does not compile).
#include <cstdint>
#include <string>

#include "lib/data/bpe.h"

namespace ds {

int64_t vocab_size_from_file(const std::string& vocab_json) { return data::vocab_file_size(vocab_json); }

}  // namespace ds
