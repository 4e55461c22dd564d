// Next-token selection (sampler.h). Ties in greedy decoding go to the lowest
// id, as torch.argmax does.
#include "lib/gen/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lib/core/error.h"
#include "lib/core/rng.h"

namespace ds::gen {

void validate_sampling(const SamplingConfig& s) {
  DS_USER_CHECK(s.temperature > 0 && std::isfinite(s.temperature), "--temperature {} must be > 0 (use --greedy for "
                "argmax decoding)", s.temperature);
  DS_USER_CHECK(s.top_k >= 0, "--top-k {} must be >= 0 (0: no limit)", s.top_k);
  DS_USER_CHECK(s.top_p > 0 && s.top_p <= 1, "--top-p {} must be in (0, 1]", s.top_p);
  DS_USER_CHECK(s.repetition_penalty > 0 && std::isfinite(s.repetition_penalty),
                "--repetition-penalty {} must be > 0 (1: none)", s.repetition_penalty);
}

int32_t sample_next(std::span<float> logits, std::span<const int32_t> seen, const SamplingConfig& s,
                    uint64_t sample, uint64_t step) {
  const int64_t V = static_cast<int64_t>(logits.size());
  DS_CHECK(V > 0, "sample_next: empty logits");
  if (s.repetition_penalty != 1.0f) {
    std::vector<char> done(static_cast<size_t>(V), 0);
    for (int32_t t : seen) {
      if (t < 0 || t >= V || done[t]) continue;
      done[t] = 1;
      float& x = logits[t];
      x = x > 0 ? x / s.repetition_penalty : x * s.repetition_penalty;
    }
  }
  if (s.greedy) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates by descending logit (ties: lower id first), cut by top-k.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = s.top_k > 0 ? std::min<int64_t>(s.top_k, V) : V;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<size_t>(k));
  // Softmax of logit / temperature over the candidates, in double.
  const double mx = logits[idx[0]] / static_cast<double>(s.temperature);
  std::vector<double> p(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += p[i] = std::exp(logits[idx[i]] / double(s.temperature) - mx);
  // Top-p: the smallest prefix whose probability reaches p (at least one token).
  size_t keep = idx.size();
  if (s.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      acc += p[i] / sum;
      if (acc >= s.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i];
  const uint64_t key = splitmix64(s.seed ^ splitmix64(sample * 0x9e3779b97f4a7c15ull + 0x51ed27)) + step;
  double u = uniform_from_key(key) * total;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace ds::gen
