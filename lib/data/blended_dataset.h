// Megatron's BlendableDataset: global sample i of a blend of several datasets
// with weights w_d is sample n_d of dataset d, where d is the dataset whose
// count lags its target share the most (Megatron's build_blending_indices:
// largest w_d * max(i, 1) - n_d, the first on ties) and n_d counts the samples
// that dataset has already given. Megatron materialises both index arrays for
// the whole run; here the picks are replayed from a checkpoint of the counts
// every kStride samples, so any sample index costs O(kStride x datasets) and
// memory grows by one small row per kStride samples actually reached.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "lib/data/gpt_dataset.h"

namespace ds::data {

class BlendIndex {
 public:
  static constexpr int64_t kStride = 4096;
  // weights: >= 0, not all 0, at most 254 datasets (Megatron's limit); they are normalized.
  explicit BlendIndex(std::vector<double> weights);

  struct Pick {
    int dataset = 0;
    int64_t sample = 0;  // index within that dataset
    bool operator==(const Pick&) const = default;
  };
  Pick at(int64_t sample) const;  // thread-safe
  const std::vector<double>& weights() const { return weights_; }

 private:
  int choose(int64_t i, const std::vector<int64_t>& counts) const;
  std::vector<double> weights_;
  mutable std::mutex mu_;
  mutable std::vector<std::vector<int64_t>> checkpoints_;  // counts before sample k * kStride
};

// Megatron's --data-path forms: "PREFIX", or "W1 PREFIX1 W2 PREFIX2 ..."
// (weights >= 0, not all 0). `what` names the flag/key in errors.
struct BlendSpec {
  std::vector<double> weights;
  std::vector<std::string> prefixes;
};
BlendSpec parse_blend(const std::vector<std::string>& items, const std::string& what);

// A weighted blend of GptDatasets (one dataset: exactly that dataset).
class BlendedDataset {
 public:
  // The parts must outlive this object.
  BlendedDataset(std::vector<const GptDataset*> parts, std::vector<double> weights);
  void get(int64_t sample, int32_t* out) const;
  size_t num_parts() const { return parts_.size(); }
  const GptDataset& part(size_t i) const { return *parts_[i]; }
  BlendIndex::Pick pick(int64_t sample) const;

 private:
  std::vector<const GptDataset*> parts_;
  BlendIndex index_;
};

}  // namespace ds::data
