// The three tuners (DeepSpeed's names): gridsearch tries the points in order,
// random in a seeded random order, model_based fits measured step times with
// the FLOP/communication cost model (search_space.h cost_features) by
// non-negative least squares and proposes the unmeasured point with the best
// predicted metric. Pure: the autotuner feeds it results; see docs/autotuning.md.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "launcher/autotune/search_space.h"

namespace ds::launch::autotune {

// Non-negative least squares: w >= 0 minimizing |A w - y|^2 (rows of A are
// samples). Columns are scaled to unit size internally. Projected coordinate descent.
std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& A, const std::vector<double>& y);

class Tuner {
 public:
  Tuner(TunerType type, std::vector<Point> space, ModelFacts facts, Metric metric, uint64_t seed);
  // Index into space() of the next point to try, or -1 when none is left.
  int next();
  // The point was measured (step time in seconds) or failed (nullopt).
  void report(int index, std::optional<double> step_seconds);
  // The point will not be tried (pruned by the memory estimate or invalid).
  void exclude(int index);
  const std::vector<Point>& space() const { return space_; }
  // model_based: the predicted step time of a point under the current fit (< 0: no fit yet).
  double predicted_seconds(int index) const;

 private:
  void refit();
  TunerType type_;
  std::vector<Point> space_;
  ModelFacts facts_;
  Metric metric_;
  std::mt19937_64 rng_;
  std::vector<int> order_;           // grid / random order
  size_t cursor_ = 0;
  std::vector<bool> done_;           // tried or excluded
  std::vector<int> measured_;        // indices with a step time
  std::vector<double> seconds_;      // their step times
  std::vector<double> weights_;      // model_based fit (empty: none)
};

}  // namespace ds::launch::autotune
