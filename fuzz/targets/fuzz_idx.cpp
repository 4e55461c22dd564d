// Fuzz target: Megatron .idx/.bin reading (lib/data/indexed_dataset.cpp).
// Input: "IDX BYTES\n@@BIN@@\nBIN BYTES"; every token of an opened dataset is read.
#include <vector>

#include "fuzz/targets/fuzz_common.h"
#include "lib/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto parts = ds::fuzz::split_input(in, "\n@@BIN@@\n");
  const std::string_view idx = parts.first, bin = parts.second;
  ds::fuzz::write_scratch("d.idx", idx);
  const std::string prefix = ds::fuzz::write_scratch("d.bin", bin);
  return ds::fuzz::run_one([&] {
    auto d = ds::data::IndexedDataset::open(prefix.substr(0, prefix.size() - 4));
    (void)ds::data::max_token_id(d);
    for (int64_t i = 0; i < d.num_documents(); ++i) (void)d.doc_idx()[i];
  });
}
