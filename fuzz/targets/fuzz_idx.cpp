// Fuzz target: Megatron .idx/.bin reading (lib/data/indexed_dataset.cpp), and
// the same bytes as DeepSpeed's data-analysis flavour (its dtype codes; every
// value read as int64, as the curriculum sampler reads its index files).
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
  const std::string stem = prefix.substr(0, prefix.size() - 4);
  ds::fuzz::run_one([&] {
    auto d = ds::data::IndexedDataset::open(stem);
    (void)ds::data::max_token_id(d);
    for (int64_t i = 0; i < d.num_documents(); ++i) (void)d.doc_idx()[i];
  });
  return ds::fuzz::run_one([&] {
    auto d = ds::data::IndexedDataset::open(stem, ds::data::DTypeCodes::DeepSpeed);
    for (int64_t i = 0; i < d.num_sequences(); ++i) (void)d.values(i);
  });
}
