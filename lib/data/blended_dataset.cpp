#include "lib/data/blended_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <numeric>

#include "lib/core/decimal.h"
#include "lib/core/error.h"

namespace ds::data {

BlendSpec parse_blend(const std::vector<std::string>& items, const std::string& what) {
  DS_USER_CHECK(!items.empty(), "{}: no dataset given", what);
  if (items.size() == 1) return {{1.0}, {items[0]}};
  DS_USER_CHECK(items.size() % 2 == 0, "{} with weights needs pairs 'WEIGHT PREFIX ...', got {} items", what,
                items.size());
  BlendSpec b;
  double sum = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    const std::string& w = items[i];
    const std::optional<double> v = parse_decimal(w);  // plain decimals: no hex, inf, nan or spaces
    DS_USER_CHECK(v && *v >= 0, "{}: '{}' is not a weight (item {}; the form is WEIGHT PREFIX WEIGHT PREFIX ...)",
                  what, w, i);
    DS_USER_CHECK(!items[i + 1].empty(), "{}: empty dataset prefix after weight '{}'", what, w);
    b.weights.push_back(*v);
    b.prefixes.push_back(items[i + 1]);
    sum += *v;
  }
  DS_USER_CHECK(sum > 0, "{}: the weights are all 0", what);
  return b;
}

BlendIndex::BlendIndex(std::vector<double> weights) : weights_(std::move(weights)) {
  DS_USER_CHECK(!weights_.empty() && weights_.size() < 255, "a data blend needs 1 to 254 datasets, got {}",
                weights_.size());
  double sum = 0;
  for (double w : weights_) {
    DS_USER_CHECK(std::isfinite(w) && w >= 0, "data blend weight {} must be a finite number >= 0", w);
    sum += w;
  }
  DS_USER_CHECK(sum > 0, "data blend weights must not all be 0");
  for (double& w : weights_) w /= sum;
  checkpoints_.push_back(std::vector<int64_t>(weights_.size(), 0));
}

int BlendIndex::choose(int64_t i, const std::vector<int64_t>& counts) const {
  const double x = std::max(static_cast<double>(i), 1.0);
  int best = 0;
  double best_err = weights_[0] * x - static_cast<double>(counts[0]);
  for (size_t d = 1; d < weights_.size(); ++d) {
    const double err = weights_[d] * x - static_cast<double>(counts[d]);
    if (err > best_err) {
      best_err = err;
      best = static_cast<int>(d);
    }
  }
  return best;
}

BlendIndex::Pick BlendIndex::at(int64_t sample) const {
  DS_CHECK(sample >= 0, "BlendIndex::at: negative sample {}", sample);
  if (weights_.size() == 1) return {0, sample};
  const size_t k = static_cast<size_t>(sample / kStride);
  std::vector<int64_t> counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (checkpoints_.size() <= k) {  // extend the table: replay one stride
      std::vector<int64_t> c = checkpoints_.back();
      const int64_t first = static_cast<int64_t>(checkpoints_.size() - 1) * kStride;
      for (int64_t i = first; i < first + kStride; ++i) c[choose(i, c)] += 1;
      checkpoints_.push_back(std::move(c));
    }
    counts = checkpoints_[k];
  }
  for (int64_t i = static_cast<int64_t>(k) * kStride; i < sample; ++i) counts[choose(i, counts)] += 1;
  const int d = choose(sample, counts);
  return {d, counts[d]};
}

BlendedDataset::BlendedDataset(std::vector<const GptDataset*> parts, std::vector<double> weights)
    : parts_(std::move(parts)), index_(std::move(weights)) {
  DS_CHECK(parts_.size() == index_.weights().size(), "BlendedDataset: {} parts for {} weights", parts_.size(),
           index_.weights().size());
}

BlendIndex::Pick BlendedDataset::pick(int64_t sample) const { return index_.at(sample); }

void BlendedDataset::get(int64_t sample, int32_t* out) const {
  const BlendIndex::Pick p = index_.at(sample);
  parts_[static_cast<size_t>(p.dataset)]->get(p.sample, out);
}

}  // namespace ds::data
