// DeepSpeed-Chat's pairwise reward loss (reward_loss.h).
#include "lib/chat/reward_loss.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace ds::chat {

namespace {

// The position where a sequence ends: its (npb + 1)-th pad id, else T.
int64_t end_of(const int32_t* ids, int64_t T, int32_t pad, int npb) {
  int seen = 0;
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] == pad && seen++ == npb) return t;
  return T;
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

}  // namespace

RewardLoss reward_pair_loss(const RewardPairs& p) {
  DS_CHECK(p.bs >= 1 && p.T >= 1, "reward_pair_loss: bs {} T {}", p.bs, p.T);
  const int64_t T = p.T;
  RewardLoss out;
  out.chosen_scores.resize(static_cast<size_t>(p.bs));
  out.rejected_scores.resize(static_cast<size_t>(p.bs));
  out.dchosen.assign(static_cast<size_t>(p.bs * T), 0.f);
  out.drejected.assign(static_cast<size_t>(p.bs * T), 0.f);
  for (int64_t i = 0; i < p.bs; ++i) {
    const int32_t *c = p.chosen_ids + i * T, *r = p.rejected_ids + i * T;
    const float *cr = p.chosen_rewards + i * T, *rr = p.rejected_rewards + i * T;
    const int64_t c_end = end_of(c, T, p.pad_id, p.num_padding_at_beginning);
    int64_t div = 0;
    while (div < T && c[div] == r[div]) ++div;
    int64_t r_end, end;
    if (div == T) {  // identical: the last position, both scored at the chosen end
      end = T;
      div = T - 1;
      r_end = c_end;
    } else {
      r_end = end_of(r, T, p.pad_id, p.num_padding_at_beginning);
      end = std::max(c_end, r_end);
    }
    DS_USER_CHECK(div > 0, "reward model: pair {} of the batch differs at its first token (DeepSpeed-Chat asserts "
                  "a common first token: a bos, or the prompt)", i);
    // The score before each end (index -1 wraps to the last position, as Python's).
    out.chosen_scores[static_cast<size_t>(i)] = cr[c_end > 0 ? c_end - 1 : T - 1];
    out.rejected_scores[static_cast<size_t>(i)] = rr[r_end > 0 ? r_end - 1 : T - 1];
    const int64_t n = end - div;
    if (n <= 0) {
      out.loss = NAN;  // torch's mean of an empty span
      continue;
    }
    double sum = 0;
    for (int64_t t = div; t < end; ++t) {
      const double d = static_cast<double>(cr[t]) - static_cast<double>(rr[t]);
      sum += -log_sigmoid(d);
      const double g = (sigmoid(d) - 1.0) / static_cast<double>(n * p.bs);  // d(-logsigmoid(d))/dd, averaged
      out.dchosen[static_cast<size_t>(i * T + t)] = static_cast<float>(g);
      out.drejected[static_cast<size_t>(i * T + t)] = static_cast<float>(-g);
    }
    out.loss += sum / static_cast<double>(n);
  }
  out.loss /= static_cast<double>(p.bs);
  return out;
}

}  // namespace ds::chat
