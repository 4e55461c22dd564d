// analysis_probe: dumps the samples dsprep's data analysis reads, for
// analysis_check.py's independent transcription of DeepSpeed's analysis.
//   analysis_probe PREFIX SPLIT SEQ_LENGTH SEED OUT
// Writes OUT: N rows of SEQ_LENGTH + 1 int32 tokens (little endian), row s
// being sample s of epoch 0 of the train split (train_split_dataset, the
// dataset dstrain trains on); prints N.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/data/data_analysis.h"
#include "lib/data/gpt_dataset.h"
#include "lib/data/indexed_dataset.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: analysis_probe PREFIX SPLIT SEQ_LENGTH SEED OUT\n");
    return 2;
  }
  try {
    const auto file = ds::data::IndexedDataset::open(argv[1]);
    const auto train =
        ds::data::train_split_dataset(file, argv[1], argv[2], std::atoll(argv[3]), std::strtoull(argv[4], nullptr, 10));
    const ds::data::AnalysisSamples s = ds::data::epoch_samples(train);
    std::vector<int32_t> row(static_cast<size_t>(s.sample_tokens));
    std::FILE* out = std::fopen(argv[5], "wb");
    if (!out) throw ds::UserError(std::string("cannot write ") + argv[5]);
    for (int64_t i = 0; i < s.num_samples; ++i) {
      s.get(i, row.data());
      std::fwrite(row.data(), sizeof(int32_t), row.size(), out);
    }
    if (std::fclose(out) != 0) throw ds::UserError(std::string("cannot write ") + argv[5]);
    std::printf("%lld\n", static_cast<long long>(s.num_samples));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "analysis_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
