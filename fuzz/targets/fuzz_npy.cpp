// Fuzz target: .npy files (lib/data/npy.cpp) and Megatron's GPT index maps
// over them (lib/data/index_maps.cpp). Input: "DOC\n@@SAMPLE@@\nSAMPLE\n@@SHUFFLE@@\nSHUFFLE",
// three .npy files (a lone file is just read). Every element of an opened array
// is read; maps that pass validation against a fixed six-document dataset
// (seq_length 4) have every sample read, which must stay inside the dataset.
#include <vector>

#include "fuzz/targets/fuzz_common.h"
#include "lib/data/index_maps.h"

namespace {

// Documents of 0, 3, 9, 1, 20 and 5 tokens, written once per process.
const ds::data::IndexedDataset& dataset() {
  static const ds::data::IndexedDataset* d = [] {
    const std::string prefix = ds::fuzz::scratch_dir() + "/maps_corpus";
    ds::data::IndexedDatasetWriter w(prefix, ds::data::TokenDType::U16);
    int32_t next = 0;
    for (int len : {0, 3, 9, 1, 20, 5}) {
      std::vector<int32_t> doc(static_cast<size_t>(len));
      for (int32_t& t : doc) t = next++;
      w.add_document(doc);
    }
    w.finalize();
    return new ds::data::IndexedDataset(ds::data::IndexedDataset::open(prefix));
  }();
  return *d;
}

uint64_t read_all(const std::string& path) {
  const ds::data::NpyArray a = ds::data::NpyArray::open(path);
  uint64_t sum = 0;
  for (int64_t i = 0; i < a.size(); ++i) sum += static_cast<uint64_t>(a.at(i));
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [doc, rest] = ds::fuzz::split_input(in, "\n@@SAMPLE@@\n");
  const auto [sample, shuffle] = ds::fuzz::split_input(rest, "\n@@SHUFFLE@@\n");
  const ds::data::IndexMapPaths paths{ds::fuzz::write_scratch("doc.npy", doc),
                                      ds::fuzz::write_scratch("sample.npy", sample),
                                      ds::fuzz::write_scratch("shuffle.npy", shuffle)};
  for (const std::string& p : {paths.doc_idx, paths.sample_idx, paths.shuffle_idx})
    ds::fuzz::run_one([&] { (void)read_all(p); });
  return ds::fuzz::run_one([&] {
    const ds::data::IndexMaps maps(dataset(), paths, 4);
    std::vector<int32_t> out(5);
    for (int64_t i = 0; i < maps.num_samples() && i < 4096; ++i) maps.read_row(maps.row(i), out.data());
  });
}
