// Vocab-parallel cross-entropy on the CPU: the logits are split into TP column
// shards, the three phases run per shard with the all-reduces simulated on the
// host; losses must match a double reference of the full softmax and the
// gradient central finite differences, padding and ignored rows excluded.
#include <algorithm>

#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

// Per-row cross-entropy of the full (N, Vp) logits over the first V columns.
Vec ref_ce(const Vec& x, const std::vector<int32_t>& tgt, int64_t N, int64_t Vp, int64_t V) {
  Vec out(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (tgt[n] < 0) continue;
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, x[n * Vp + j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[n * Vp + j] - m);
    out[n] = m + std::log(s) - x[n * Vp + tgt[n]];
  }
  return out;
}

// Runs the op over tp shards of `logits` (N, Vp); returns losses (rank 0's,
// checked equal on all ranks) and writes the full dlogits if asked.
Tensor run_shards(const Tensor& logits, const Tensor& targets, int64_t V, int tp, float dloss, Tensor* dlogits) {
  const int64_t N = logits.size(0), Vp = logits.size(1), Vl = Vp / tp;
  std::vector<Tensor> shard(tp), mx(tp), st(tp), loss(tp);
  for (int r = 0; r < tp; ++r) {
    shard[r] = Tensor::empty({N, Vl}, DType::F32);
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(logits.data<float>() + n * Vp + r * Vl, Vl, shard[r].data<float>() + n * Vl);
    mx[r] = Tensor::empty({N}, DType::F32);
    st[r] = Tensor::empty({2, N}, DType::F32);
    loss[r] = Tensor::empty({N}, DType::F32);
  }
  auto args = [&](int r, VocabCEPhase ph) {
    VocabParallelCEArgs a;
    a.phase = ph;
    a.logits = shard[r];
    a.targets = targets;
    a.rowmax = mx[r];
    a.stats = st[r];
    a.losses = loss[r];
    if (dlogits) a.dlogits = shard[r];  // in place, as the model does
    a.vocab_start = r * Vl;
    a.V = V;
    a.dloss = dloss;
    return a;
  };
  auto all_reduce = [&](std::vector<Tensor>& t, bool max) {
    for (int64_t i = 0; i < t[0].numel(); ++i) {
      float v = t[0].data<float>()[i];
      for (int r = 1; r < tp; ++r) v = max ? std::max(v, t[r].data<float>()[i]) : v + t[r].data<float>()[i];
      for (int r = 0; r < tp; ++r) t[r].data<float>()[i] = v;
    }
  };
  for (int r = 0; r < tp; ++r) ops::vocab_parallel_cross_entropy(args(r, VocabCEPhase::Max));
  all_reduce(mx, true);
  for (int r = 0; r < tp; ++r) ops::vocab_parallel_cross_entropy(args(r, VocabCEPhase::Stats));
  all_reduce(st, false);
  for (int r = 0; r < tp; ++r) ops::vocab_parallel_cross_entropy(args(r, VocabCEPhase::Finish));
  for (int r = 1; r < tp; ++r) CHECK(bit_equal(loss[r], loss[0]));
  if (dlogits) {
    *dlogits = Tensor::empty({N, Vp}, DType::F32);
    for (int r = 0; r < tp; ++r)
      for (int64_t n = 0; n < N; ++n)
        std::copy_n(shard[r].data<float>() + n * Vl, Vl, dlogits->data<float>() + n * Vp + r * Vl);
  }
  return loss[0];
}

}  // namespace

TEST_CASE("vocab-parallel cross-entropy: 1, 2 and 4 shards vs reference and finite differences") {
  const int64_t N = 9, V = 37, Vp = 48;  // the last shard of 4 holds only padding
  const float dloss = 1.f / 7;
  std::vector<int32_t> tgt = {3, -1, 36, 0, 12, 5, 24, 35, -100};
  Tensor logits = randn({N, Vp}, 210, 3.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) logits.data<float>()[n * Vp + j] = 100.f;  // must be ignored
  const Tensor targets = tokens_tensor({N}, tgt);
  const Vec x = to_f64(logits);
  const Vec want = ref_ce(x, tgt, N, Vp, V);
  const Vec fd = fd_grad(x, [&](const Vec& v) {
    double s = 0;
    for (double l : ref_ce(v, tgt, N, Vp, V)) s += dloss * l;
    return s;
  });
  for (int tp : {1, 2, 4}) {
    INFO("tp " << tp);
    Tensor d;
    Tensor loss = run_shards(logits, targets, V, tp, dloss, &d);
    check_close(loss, want, kFwdTol, "losses");
    check_close(d, fd, kBwdTol, "dlogits");
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < Vp; ++j)
        if (j >= V || tgt[n] < 0) CHECK(d.data<float>()[n * Vp + j] == 0.f);
    Tensor loss_only = run_shards(logits, targets, V, tp, dloss, nullptr);
    CHECK(bit_equal(loss_only, loss));
  }
}

TEST_CASE("vocab-parallel cross-entropy: a target >= V is an error") {
  VocabParallelCEArgs a;
  a.logits = randn({2, 8}, 3);
  a.targets = tokens_tensor({2}, {1, 9});
  a.rowmax = Tensor::empty({2}, DType::F32);
  a.V = 9;
  REQUIRE_THROWS(ops::vocab_parallel_cross_entropy(a));
}
