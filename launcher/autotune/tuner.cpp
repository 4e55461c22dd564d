// Grid, random and model-based tuners over a list of points.
#include "launcher/autotune/tuner.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ds::launch::autotune {

std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& A, const std::vector<double>& y) {
  const size_t n = A.size(), k = n ? A[0].size() : 0;
  std::vector<double> scale(k, 0.0), w(k, 0.0);
  for (const auto& row : A)
    for (size_t j = 0; j < k; ++j) scale[j] = std::max(scale[j], std::abs(row[j]));
  // Normal equations of the scaled problem, with a tiny ridge for columns that carry no information.
  std::vector<std::vector<double>> G(k, std::vector<double>(k, 0.0));
  std::vector<double> b(k, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < k; ++j) {
      const double aj = scale[j] > 0 ? A[i][j] / scale[j] : 0;
      b[j] += aj * y[i];
      for (size_t l = 0; l < k; ++l) G[j][l] += aj * (scale[l] > 0 ? A[i][l] / scale[l] : 0);
    }
  for (size_t j = 0; j < k; ++j) G[j][j] += 1e-9 * (1.0 + G[j][j]);
  for (int sweep = 0; sweep < 2000; ++sweep) {
    double change = 0;
    for (size_t j = 0; j < k; ++j) {
      if (G[j][j] <= 0) continue;
      double r = b[j];
      for (size_t l = 0; l < k; ++l)
        if (l != j) r -= G[j][l] * w[l];
      const double nw = std::max(0.0, r / G[j][j]);
      change = std::max(change, std::abs(nw - w[j]));
      w[j] = nw;
    }
    if (change < 1e-12) break;
  }
  for (size_t j = 0; j < k; ++j) w[j] = scale[j] > 0 ? w[j] / scale[j] : 0;
  return w;
}

Tuner::Tuner(TunerType type, std::vector<Point> space, ModelFacts facts, Metric metric, uint64_t seed)
    : type_(type), space_(std::move(space)), facts_(std::move(facts)), metric_(metric), rng_(seed),
      order_(space_.size()), done_(space_.size(), false) {
  std::iota(order_.begin(), order_.end(), 0);
  // The default configuration (index 0) always goes first: it is the reference.
  if (type_ != TunerType::Grid && order_.size() > 1) std::shuffle(order_.begin() + 1, order_.end(), rng_);
}

int Tuner::next() {
  // model_based: once two points are measured, the fit proposes the next one.
  if (type_ == TunerType::ModelBased && measured_.size() >= 2 && !weights_.empty()) {
    int best = -1;
    double best_v = 0;
    for (size_t i = 0; i < space_.size(); ++i) {
      if (done_[i]) continue;
      const double t = predicted_seconds(static_cast<int>(i));
      if (!(t > 0)) continue;
      const double v = metric_of_time(metric_, space_[i], facts_, t);
      if (best < 0 || better(metric_, v, best_v)) best = static_cast<int>(i), best_v = v;
    }
    if (best >= 0) {
      done_[best] = true;
      return best;
    }
  }
  while (cursor_ < order_.size() && done_[order_[cursor_]]) ++cursor_;
  if (cursor_ == order_.size()) return -1;
  const int i = order_[cursor_++];
  done_[i] = true;
  return i;
}

void Tuner::report(int index, std::optional<double> step_seconds) {
  done_[index] = true;
  if (!step_seconds) return;
  measured_.push_back(index);
  seconds_.push_back(*step_seconds);
  if (type_ == TunerType::ModelBased) refit();
}

void Tuner::exclude(int index) { done_[index] = true; }

void Tuner::refit() {
  std::vector<std::vector<double>> A;
  for (int i : measured_) A.push_back(cost_features(space_[i], facts_));
  weights_ = fit_nonnegative(A, seconds_);
}

double Tuner::predicted_seconds(int index) const {
  if (weights_.empty()) return -1;
  const std::vector<double> x = cost_features(space_[index], facts_);
  double t = 0;
  for (size_t j = 0; j < x.size(); ++j) t += weights_[j] * x[j];
  return t;
}

}  // namespace ds::launch::autotune
