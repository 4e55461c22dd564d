// CPU tests of the Mixture-of-Experts ops. The gate forward is checked
// against an independent double reference of DeepSpeed's gating written the
// way DeepSpeed computes it (one-hot masks over (N, E), cumulative sums over
// tokens, top-k over the token dimension, the dense (N, E, C) combine tensor),
// which the compact (expert, slot, weight) results must reproduce exactly
// (ids, slots, counts) or to 1e-5 (gates, weights, l_aux). The random modes
// (RTS, RSample, second-expert sampling) feed the reference the op's own draws
// (lib/ops/moe_noise.h) and are checked for determinism and for their
// defining properties. Backwards: finite differences (test/ops_harness/moe_cases).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <set>

#include "lib/ops/moe_noise.h"
#include "test/ops_harness/moe_cases.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

// ---- DeepSpeed's gating, dense, in double ----------------------------------

using Mat = Vec;  // (N, E) row-major

Mat softmax_rows(const Vec& l, int64_t N, int64_t E) {
  Mat g(N * E);
  for (int64_t n = 0; n < N; ++n) {
    const double m = *std::max_element(l.begin() + n * E, l.begin() + (n + 1) * E);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(l[n * E + e] - m);
    for (int64_t e = 0; e < E; ++e) g[n * E + e] = std::exp(l[n * E + e] - m) / s;
  }
  return g;
}
// torch.argmax(x, dim=1): the first maximum.
std::vector<int64_t> argmax_rows(const Mat& x, int64_t N, int64_t E) {
  std::vector<int64_t> r(N);
  for (int64_t n = 0; n < N; ++n)
    r[n] = std::max_element(x.begin() + n * E, x.begin() + (n + 1) * E) - (x.begin() + n * E);
  return r;
}
Mat one_hot(const std::vector<int64_t>& idx, int64_t E) {
  Mat m(idx.size() * E, 0.0);
  for (size_t n = 0; n < idx.size(); ++n) m[n * E + idx[n]] = 1.0;
  return m;
}
// torch.cumsum(x, dim=0) - 1.
Mat cumsum_tokens_minus1(const Mat& x, int64_t N, int64_t E) {
  Mat r(N * E);
  for (int64_t e = 0; e < E; ++e) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) r[n * E + e] = (s += x[n * E + e]) - 1;
  }
  return r;
}
Vec sum_tokens(const Mat& x, int64_t N, int64_t E) {
  Vec r(E, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) r[e] += x[n * E + e];
  return r;
}
Mat mul(Mat a, const Mat& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] *= b[i];
  return a;
}
// zeros.scatter_(0, topk(x, k, dim=0).indices, 1): per column the k largest
// entries over the tokens (ties to the lower token, the ops' convention).
Mat top_tokens_mask(const Mat& x, int64_t N, int64_t E, int64_t k) {
  Mat m(N * E, 0.0);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> idx(N);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[a * E + e] > x[b * E + e]; });
    for (int64_t i = 0; i < std::min(k, N); ++i) m[idx[i] * E + e] = 1.0;
  }
  return m;
}

struct Noise {
  const Mat* gumbel = nullptr;  // top-1 RSample / top-2 second-expert sampling
  const Mat* rts = nullptr;     // top-1 random token selection: uniforms
};
struct Dense {
  Mat gates;
  Vec exp_counts;
  double l_aux = 0;
  int64_t C = 0;
  Vec combine;                   // (N, E, C)
  std::vector<int64_t> choice;   // (N, K) the chosen experts, DeepSpeed's order
  std::vector<int64_t> loc;      // (N, K) row of a kept choice, -1 if dropped
};

// The combine tensor of one mask: combine[n, e, loc[n, e]] += w[n, e] * mask.
void add_combine(Dense& r, const Mat& w, const Mat& mask, const Mat& loc, int64_t N, int64_t E) {
  for (int64_t n = 0; n < N; ++n) {
    double ls = 0;  // locations_s = sum(locations * mask, dim=1)
    for (int64_t e = 0; e < E; ++e) ls += loc[n * E + e] * mask[n * E + e];
    for (int64_t e = 0; e < E; ++e)
      if (w[n * E + e] != 0) r.combine[(n * E + e) * r.C + int64_t(ls)] += w[n * E + e];
  }
}
// The compact view of the dense result: choice j kept at loc, or -1.
void read_choices(Dense& r, int K, const std::vector<std::vector<int64_t>>& idx, const std::vector<const Mat*>& mask,
                  const std::vector<const Mat*>& loc, int64_t N, int64_t E) {
  r.choice.assign(N * K, 0);
  r.loc.assign(N * K, -1);
  for (int64_t n = 0; n < N; ++n)
    for (int j = 0; j < K; ++j) {
      const int64_t e = idx[j][n], m = K > 2 ? 0 : j;
      r.choice[n * K + j] = e;
      if ((*mask[m])[n * E + e] != 0) r.loc[n * K + j] = int64_t((*loc[m])[n * E + e]);
    }
}

Dense top1(const Vec& logits, int64_t N, int64_t E, int64_t capacity, Noise nz) {
  Dense r;
  r.gates = softmax_rows(logits, N, E);
  // RSample: argmax(logits + Gumbel noise), else argmax(gates).
  const Mat scores = nz.gumbel ? add_vec(logits, *nz.gumbel) : r.gates;
  const std::vector<int64_t> idx1 = argmax_rows(scores, N, E);
  Mat mask1 = one_hot(idx1, E);
  r.exp_counts = sum_tokens(mask1, N, E);
  r.C = capacity > 0 ? capacity : int64_t(*std::max_element(r.exp_counts.begin(), r.exp_counts.end()));
  const Vec me = sum_tokens(r.gates, N, E), ce = sum_tokens(mask1, N, E);
  for (int64_t e = 0; e < E; ++e) r.l_aux += (me[e] / N) * (ce[e] / N);
  r.l_aux *= E;
  const Mat rand = nz.rts ? mul(mask1, *nz.rts) : mask1;
  mask1 = mul(mask1, top_tokens_mask(rand, N, E, r.C));
  const Mat loc1 = cumsum_tokens_minus1(mask1, N, E);
  r.combine.assign(N * E * r.C, 0.0);
  add_combine(r, mul(r.gates, mask1), mask1, loc1, N, E);
  read_choices(r, 1, {idx1}, {&mask1}, {&loc1}, N, E);
  return r;
}

Dense top2(const Vec& logits, int64_t N, int64_t E, int64_t capacity, Noise nz) {
  Dense r;
  r.gates = softmax_rows(logits, N, E);
  const std::vector<int64_t> idx1 = argmax_rows(r.gates, N, E);
  Mat mask1 = one_hot(idx1, E);
  Mat l2 = logits;
  for (size_t i = 0; i < l2.size(); ++i) {
    if (nz.gumbel) l2[i] += (*nz.gumbel)[i];
    if (mask1[i] != 0) l2[i] = -INFINITY;
  }
  const std::vector<int64_t> idx2 = argmax_rows(l2, N, E);
  Mat mask2 = one_hot(idx2, E);
  const Mat loc1 = cumsum_tokens_minus1(mask1, N, E);
  Mat loc2 = cumsum_tokens_minus1(mask2, N, E);
  const Vec first = sum_tokens(mask1, N, E);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) loc2[n * E + e] += first[e];
  const Vec me = sum_tokens(r.gates, N, E);
  for (int64_t e = 0; e < E; ++e) r.l_aux += (me[e] / N) * (first[e] / N);
  r.l_aux = r.l_aux / E * E * E;
  r.exp_counts = sum_tokens(Mat(add_vec(mask1, mask2)), N, E);
  if (capacity > 0) {
    r.C = capacity;
    for (size_t i = 0; i < mask1.size(); ++i) {
      mask1[i] *= loc1[i] < r.C;
      mask2[i] *= loc2[i] < r.C;
    }
  } else {
    r.C = int64_t(*std::max_element(r.exp_counts.begin(), r.exp_counts.end()));
  }
  Mat g1(N * E, 0.0), g2(N * E, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double s1 = 0, s2 = 0;  // einsum("se,se->s")
    for (int64_t e = 0; e < E; ++e) {
      s1 += r.gates[n * E + e] * mask1[n * E + e];
      s2 += r.gates[n * E + e] * mask2[n * E + e];
    }
    const double denom = std::max(s1 + s2, double(FLT_EPSILON));
    for (int64_t e = 0; e < E; ++e) {
      g1[n * E + e] = s1 / denom * mask1[n * E + e];
      g2[n * E + e] = s2 / denom * mask2[n * E + e];
    }
  }
  r.combine.assign(N * E * r.C, 0.0);
  add_combine(r, g1, mask1, loc1, N, E);
  add_combine(r, g2, mask2, loc2, N, E);
  read_choices(r, 2, {idx1, idx2}, {&mask1, &mask2}, {&loc1, &loc2}, N, E);
  return r;
}

Dense topk(const Vec& logits, int64_t N, int64_t E, int K, int64_t capacity) {
  Dense r;
  // torch.topk(logits, k, dim=1): larger first, ties to the lower expert.
  std::vector<std::vector<int64_t>> idx(K, std::vector<int64_t>(N));
  Mat masked(N * E, 0.0), mask(N * E, 0.0);  // topk_masked_gates: the chosen logits, 0 elsewhere
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return logits[n * E + a] > logits[n * E + b]; });
    for (int j = 0; j < K; ++j) {
      idx[j][n] = order[j];
      masked[n * E + order[j]] = logits[n * E + order[j]];
      mask[n * E + order[j]] = 1.0;
    }
  }
  r.gates = softmax_rows(logits, N, E);
  r.exp_counts = sum_tokens(mask, N, E);
  const Vec me = sum_tokens(r.gates, N, E), ce = sum_tokens(mask, N, E);
  for (int64_t e = 0; e < E; ++e) r.l_aux += (me[e] / N) * (ce[e] / N);
  r.l_aux = r.l_aux / E * E * E / K;
  if (capacity > 0) {
    r.C = capacity;
    mask = mul(mask, top_tokens_mask(masked, N, E, r.C));  // drop policy "probs"
  } else {
    r.C = int64_t(*std::max_element(r.exp_counts.begin(), r.exp_counts.end()));
  }
  Mat gm = mul(r.gates, mask);
  const Mat loc = cumsum_tokens_minus1(mask, N, E);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += gm[n * E + e];
    for (int64_t e = 0; e < E; ++e) gm[n * E + e] /= std::max(s, double(FLT_EPSILON));
  }
  // combine = einsum("se,sec->sec", gates_masked, one_hot(locations * mask, C)).
  r.combine.assign(N * E * r.C, 0.0);
  for (int64_t i = 0; i < N * E; ++i) r.combine[i * r.C + int64_t(loc[i] * mask[i])] += gm[i];
  std::vector<const Mat*> masks(K, &mask), locs(K, &loc);
  read_choices(r, K, idx, masks, locs, N, E);
  return r;
}

Dense reference(const Vec& logits, int64_t N, int64_t E, int K, int64_t capacity, Noise nz = {}) {
  if (K == 1) return top1(logits, N, E, capacity, nz);
  if (K == 2) return top2(logits, N, E, capacity, nz);
  return topk(logits, N, E, K, capacity);
}

// The op's draws as the reference's noise matrices.
Mat gumbel_matrix(const MoeGateArgs& a, int64_t N, int64_t E) {
  Mat m(N * E);
  const uint64_t key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Gumbel);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) m[n * E + e] = moe_gumbel(moe_noise_bits(key, n, e));
  return m;
}
Mat rts_matrix(const MoeGateArgs& a, int64_t N, int64_t E) {  // RTS uniforms: 32 bits, in (0, 1)
  Mat m(N * E);
  const uint64_t key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Rts);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) m[n * E + e] = (double(moe_noise_bits(key, n, e) >> 32) + 0.5) * 0x1.0p-32;
  return m;
}

// ---- the op against the reference ----------------------------------------

std::vector<int64_t> ids(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.data<int32_t>()[i];
  return v;
}

// Runs the gate and compares every output with the dense reference.
MoeGateArgs check_gate(MoeGateArgs a, Noise nz = {}) {
  const int64_t N = a.logits.size(0), E = a.logits.size(1);
  const int K = int(a.expert.size(1));
  INFO("N " << N << " E " << E << " K " << K << " capacity " << a.capacity << " rts " << a.rts << " rsample "
            << a.rsample << " second_sampling " << a.second_sampling);
  ops::moe_gate_forward(a, Stream{});
  const Dense r = reference(to_f64(a.logits), N, E, K, a.capacity, nz);
  check_close(a.gates, r.gates, kFwdTol, "gates");
  CHECK(ids(a.counts) == std::vector<int64_t>(r.exp_counts.begin(), r.exp_counts.end()));
  CHECK(ids(a.expert) == r.choice);
  CHECK(ids(a.slot) == r.loc);
  const double aux = a.aux.data<float>()[0];
  INFO("aux " << aux << " reference " << r.l_aux);
  CHECK(std::fabs(aux - r.l_aux) <= kFwdTol * std::fabs(r.l_aux));
  // The compact result as DeepSpeed's (N, E, C) combine tensor.
  Vec combine(N * E * r.C, 0.0);
  const auto ex = ids(a.expert), sl = ids(a.slot);
  for (int64_t i = 0; i < N * K; ++i) {
    if (sl[i] < 0) {
      CHECK(a.weight.data<float>()[i] == 0.f);
      continue;
    }
    REQUIRE(sl[i] < r.C);
    combine[((i / K) * E + ex[i]) * r.C + sl[i]] += a.weight.data<float>()[i];
  }
  check_close(combine, r.combine, kFwdTol, "combine weights");
  return a;
}

std::vector<Tensor> outputs(const MoeGateArgs& a) {
  return {a.gates, a.expert, a.slot, a.weight, a.counts, a.aux};
}

int64_t dropped(const MoeGateArgs& a) {
  const auto sl = ids(a.slot);
  return std::count(sl.begin(), sl.end(), -1);
}

}  // namespace

TEST_CASE("moe gate forward matches DeepSpeed's dense gating (top-1, top-2, top-3)") {
  const int64_t N = 37;
  for (int K : {1, 2, 3}) {
    const int64_t E = K == 3 ? 8 : 6;
    for (int64_t capacity : {int64_t(0), N, int64_t(3), int64_t(5)}) {
      const Tensor logits = randn({N, E}, 100 + K, 1.5);
      const MoeGateArgs a = check_gate(moe_gate_args(logits, K, capacity));
      // Small capacities must drop (the reference then sees drops too).
      if (capacity > 0 && capacity < 6) CHECK(dropped(a) > 0);
      if (capacity == 0) CHECK(dropped(a) == 0);
    }
  }
}

TEST_CASE("moe gate forward: top-k drop policy 'probs' keeps DeepSpeed's quirk") {
  // All logits negative: every expert's column of topk_masked_gates has
  // zeros (non-choosers) above its choosers' logits, so the top `capacity`
  // rows are mostly tokens that did not choose the expert and are then
  // dropped by the AND with the choice mask: fewer than `capacity` kept.
  const int64_t N = 40, E = 8, K = 3, capacity = 4;
  Tensor logits = randn({N, E}, 7, 0.5);
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] -= 3.f;
  const MoeGateArgs a = check_gate(moe_gate_args(logits, K, capacity));
  bool under_filled = false;
  std::vector<int64_t> kept(E, 0);
  const auto ex = ids(a.expert), sl = ids(a.slot);
  for (int64_t i = 0; i < N * K; ++i) kept[ex[i]] += sl[i] >= 0;
  for (int64_t e = 0; e < E; ++e) under_filled |= kept[e] < std::min<int64_t>(capacity, a.counts.data<int32_t>()[e]);
  CHECK(under_filled);
}

TEST_CASE("moe gate forward: ties and a single expert") {
  // Equal logits everywhere: the first expert wins every argmax, the top-k
  // takes the lowest experts, drops keep the lowest tokens.
  for (int K : {1, 2, 3}) {
    const Tensor logits = full({9, 4}, 0.25f);
    check_gate(moe_gate_args(logits, K, 2));
    check_gate(moe_gate_args(logits, K, 0));
  }
  check_gate(moe_gate_args(randn({5, 1}, 3), 1, 2));
}

TEST_CASE("moe gate forward: random token selection, RSample and second-expert sampling") {
  const int64_t N = 53, E = 5;
  const Tensor logits = randn({N, E}, 21, 1.0);
  auto run = [&](int K, int64_t cap, bool rts, bool rsample, bool second, uint64_t stream) {
    MoeGateArgs a = moe_gate_args(logits, K, cap);
    a.rts = rts, a.rsample = rsample, a.second_sampling = second;
    a.noise_seed = 1234, a.noise_stream = stream;
    return a;
  };
  SECTION("RTS: the kept tokens are those with the largest uniforms, rows in token order") {
    MoeGateArgs a = run(1, 4, true, false, false, 7);
    const Mat u = rts_matrix(a, N, E);
    check_gate(a, Noise{.rts = &u});
    // The property itself: per expert min(count, capacity) kept, and every
    // kept token's RTS key is above every dropped one's.
    const auto ex = ids(a.expert), sl = ids(a.slot);
    const uint64_t key = moe_noise_key(a.noise_seed, a.noise_stream, MoeNoise::Rts);
    for (int64_t e = 0; e < E; ++e) {
      uint64_t min_kept = ~0ull, max_dropped = 0;
      int64_t kept = 0, next_row = 0;
      for (int64_t n = 0; n < N; ++n) {
        if (ex[n] != e) continue;
        const uint64_t k = moe_rts_key(key, n, e);
        if (sl[n] >= 0) {
          CHECK(sl[n] == next_row++);
          min_kept = std::min(min_kept, k), ++kept;
        } else {
          max_dropped = std::max(max_dropped, k);
        }
      }
      CHECK(kept == std::min<int64_t>(4, a.counts.data<int32_t>()[e]));
      if (kept < a.counts.data<int32_t>()[e]) CHECK(min_kept > max_dropped);
    }
    CHECK(dropped(a) > 0);
    // Another stream keeps other tokens; without dropping RTS changes nothing.
    MoeGateArgs b = run(1, 4, true, false, false, 8);
    const Mat ub = rts_matrix(b, N, E);
    check_gate(b, Noise{.rts = &ub});
    CHECK(ids(b.expert) == ids(a.expert));
    CHECK(ids(b.slot) != ids(a.slot));
    check_gate(run(1, 0, true, false, false, 7));
  }
  SECTION("RSample: the choice is argmax(logits + Gumbel), the weight the noise-free gate") {
    MoeGateArgs a = run(1, 6, false, true, false, 3);
    const Mat g = gumbel_matrix(a, N, E);
    check_gate(a, Noise{.gumbel = &g});
    MoeGateArgs b = run(1, 6, false, true, false, 4);
    const Mat gb = gumbel_matrix(b, N, E);
    check_gate(b, Noise{.gumbel = &gb});
    CHECK(ids(a.expert) != ids(b.expert));
    // Some token's choice is not its largest gate.
    CHECK(ids(a.expert) != ids(check_gate(run(1, 6, false, false, false, 3)).expert));
  }
  SECTION("top-2 second-expert sampling changes only the second choice") {
    MoeGateArgs plain = check_gate(run(2, 9, false, false, false, 5));
    MoeGateArgs a = run(2, 9, false, false, true, 5);
    const Mat g = gumbel_matrix(a, N, E);
    check_gate(a, Noise{.gumbel = &g});
    MoeGateArgs b = run(2, 9, false, false, true, 6);
    const Mat gb = gumbel_matrix(b, N, E);
    check_gate(b, Noise{.gumbel = &gb});
    const auto ea = ids(a.expert), eb = ids(b.expert), ep = ids(plain.expert);
    bool second_differs = false;
    for (int64_t n = 0; n < N; ++n) {
      CHECK(ea[2 * n] == ep[2 * n]);
      CHECK(eb[2 * n] == ep[2 * n]);
      second_differs |= ea[2 * n + 1] != eb[2 * n + 1];
    }
    CHECK(second_differs);
    CHECK(a.aux.data<float>()[0] == plain.aux.data<float>()[0]);  // ce counts first choices only
  }
  SECTION("fixed key: the same bits at any thread count") {
    for (int K : {1, 2}) {
      MoeGateArgs ref = run(K, 5, K == 1, K == 1, K == 2, 11);
      with_threads(1, [&] { ops::moe_gate_forward(ref, Stream{}); });
      MoeGateArgs again = run(K, 5, K == 1, K == 1, K == 2, 11);
      with_threads(3, [&] { ops::moe_gate_forward(again, Stream{}); });
      const std::vector<Tensor> x = outputs(ref), y = outputs(again);
      for (size_t i = 0; i < x.size(); ++i) {
        INFO("K " << K << " output " << i);
        CHECK(bit_equal(x[i], y[i]));
      }
      // Another stream draws other noise.
      MoeGateArgs other = run(K, 5, K == 1, K == 1, K == 2, 12);
      ops::moe_gate_forward(other, Stream{});
      CHECK(!bit_equal(ref.expert, other.expert));
    }
  }
}

// Megatron's activations are [s, b, h]: DeepSpeed's gate sees the tokens
// position-major. With seq > 0 the op takes (sample, position) rows in that
// order: the same as the row-order op on the rows permuted into it, in
// every mode (drops by position, RTS, Gumbel sampling, "probs", dropless).
TEST_CASE("moe gate forward: seq > 0 orders the tokens as Megatron's [s, b, h] rows") {
  const int64_t B = 3, T = 7, N = B * T, E = 4;
  const Tensor logits = randn({N, E}, 31, 1.0);
  Tensor perm = Tensor::empty({N, E}, DType::F32);
  for (int64_t i = 0; i < N; ++i)
    std::copy_n(logits.data<float>() + moe_token_row(i, N, T) * E, E, perm.data<float>() + i * E);
  struct Mode {
    int K;
    int64_t cap;
    bool rts, rsample, second;
  };
  for (const Mode m : {Mode{1, 3, false, false, false}, Mode{1, 3, true, true, false}, Mode{2, 5, false, false, true},
                       Mode{3, 9, false, false, false}, Mode{2, 0, false, false, true}}) {
    INFO("K " << m.K << " capacity " << m.cap << " rts " << m.rts);
    auto gate = [&](const Tensor& l, int64_t seq) {
      MoeGateArgs a = moe_gate_args(l, m.K, m.cap);
      a.rts = m.rts, a.rsample = m.rsample, a.second_sampling = m.second;
      a.noise_seed = 99, a.noise_stream = 5, a.seq = seq;
      ops::moe_gate_forward(a, Stream{});
      return a;
    };
    const MoeGateArgs a = gate(logits, T), b = gate(perm, 0);
    const auto ae = ids(a.expert), as = ids(a.slot), be = ids(b.expert), bs = ids(b.slot);
    int64_t drops = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < m.K; ++j) {
        const int64_t i = moe_token_order(n, N, T);
        CHECK(ae[n * m.K + j] == be[i * m.K + j]);
        CHECK(as[n * m.K + j] == bs[i * m.K + j]);
        CHECK(a.weight.data<float>()[n * m.K + j] == b.weight.data<float>()[i * m.K + j]);
        drops += as[n * m.K + j] < 0;
      }
    CHECK(ids(a.counts) == ids(b.counts));
    CHECK(std::abs(a.aux.data<float>()[0] - b.aux.data<float>()[0]) <= 1e-6f * b.aux.data<float>()[0]);
    if (m.cap > 0) CHECK(drops > 0);  // the order decided something
  }
}

TEST_CASE("moe gate forward: RSample picks experts with the softmax's frequencies") {
  // The Gumbel-max trick: argmax(l + G) is distributed as softmax(l). One
  // row of logits repeated; each frequency within 5 standard deviations.
  const int64_t N = 20000, E = 4;
  const float row[E] = {0.3f, -1.0f, 1.2f, 0.0f};
  Tensor logits = Tensor::empty({N, E}, DType::F32);
  for (int64_t i = 0; i < N * E; ++i) logits.data<float>()[i] = row[i % E];
  MoeGateArgs a = moe_gate_args(logits, 1, 0);
  a.rsample = true, a.noise_seed = 99;
  ops::moe_gate_forward(a, Stream{});
  for (int64_t e = 0; e < E; ++e) {
    const double p = a.gates.data<float>()[e];
    const double f = double(a.counts.data<int32_t>()[e]) / N;
    INFO("expert " << e << " frequency " << f << " softmax " << p);
    CHECK(std::fabs(f - p) <= 5 * std::sqrt(p * (1 - p) / N));
  }
}

TEST_CASE("moe gate backward matches finite differences through the weights and l_aux") {
  // loss = sum(r * weight) + daux * l_aux with the choices and drops held
  // fixed (they carry no gradient), so near-ties do not matter.
  const int64_t N = 23;
  for (int K : {1, 2, 3}) {
    const int64_t E = K == 3 ? 7 : 5;
    for (int64_t capacity : {int64_t(0), int64_t(3)}) {
      for (float daux : {0.f, 0.7f}) {
        INFO("K " << K << " capacity " << capacity << " daux " << daux);
        const Tensor logits = randn({N, E}, 300 + K, 1.2);
        MoeGateArgs f = moe_gate_args(logits, K, capacity);
        ops::moe_gate_forward(f, Stream{});
        if (capacity > 0) CHECK(dropped(f) > 0);
        const MoeGateBwdArgs b{.dlogits = randn({N, E}, 5), .dweight = randn({N, K}, 6), .gates = f.gates,
                               .expert = f.expert, .slot = f.slot, .daux = daux};
        check_finite_diff(moe_gate_backward_case(b, logits));
      }
    }
  }
}

TEST_CASE("moe dispatch and combine: references and exact gradients") {
  const int64_t N = 29, E = 4, D = 11;
  for (int K : {1, 2, 3}) {
    for (int64_t capacity : {int64_t(0), int64_t(5)}) {
      INFO("K " << K << " capacity " << capacity);
      MoeGateArgs g = moe_gate_args(randn({N, E}, 40 + K), K, capacity);
      ops::moe_gate_forward(g, Stream{});
      int64_t C = capacity;
      for (int64_t e = 0; e < E && capacity == 0; ++e) C = std::max<int64_t>(C, g.counts.data<int32_t>()[e]);
      const Tensor inp = randn({N, D}, 50), y = randn({E, C, D}, 51), w = randn({N, K}, 52);
      check_reference(moe_dispatch_forward_case(
          {.out = randn({E, C, D}, 53), .inp = inp, .expert = g.expert, .slot = g.slot}));
      check_finite_diff(moe_dispatch_backward_case(
          {.dinp = randn({N, D}, 54), .dout = randn({E, C, D}, 55), .expert = g.expert, .slot = g.slot}, inp));
      check_reference(moe_combine_forward_case(
          {.out = randn({N, D}, 56), .inp = y, .weight = w, .expert = g.expert, .slot = g.slot}));
      check_finite_diff(moe_combine_backward_case({.dinp = randn({E, C, D}, 57), .dweight = randn({N, K}, 58),
                                                   .dout = randn({N, D}, 59), .inp = y, .weight = w,
                                                   .expert = g.expert, .slot = g.slot}));
    }
  }
}

TEST_CASE("moe ops: bf16 dispatch and combine are the f32 ops on rounded values") {
  const int64_t N = 13, E = 3, D = 9, K = 2;
  MoeGateArgs g = moe_gate_args(randn({N, E}, 61), K, 4);
  ops::moe_gate_forward(g, Stream{});
  const Tensor x = randn({N, D}, 62);
  Tensor xb = Tensor::empty({N, D}, DType::BF16), ob = Tensor::empty({E, 4, D}, DType::BF16);
  ops::cast({.out = xb, .inp = x}, Stream{});
  ops::moe_dispatch_forward({.out = ob, .inp = xb, .expert = g.expert, .slot = g.slot}, Stream{});
  Tensor xr = Tensor::empty({N, D}, DType::F32), of = Tensor::empty({E, 4, D}, DType::F32);
  Tensor obf = Tensor::empty({E, 4, D}, DType::F32);
  ops::cast({.out = xr, .inp = xb}, Stream{});
  ops::moe_dispatch_forward({.out = of, .inp = xr, .expert = g.expert, .slot = g.slot}, Stream{});
  ops::cast({.out = obf, .inp = ob}, Stream{});
  CHECK(bit_equal(obf, of));  // a copy: exact
}

TEST_CASE("moe ops: argument errors name the op and the field") {
  const Tensor logits = randn({6, 3}, 1);
  MoeGateArgs a = moe_gate_args(logits, 4, 0);
  CHECK_THROWS_WITH(ops::moe_gate_forward(a, Stream{}), Catch::Contains("moe_gate_forward") && Catch::Contains("K=4"));
  a = moe_gate_args(logits, 2, -1);
  CHECK_THROWS_WITH(ops::moe_gate_forward(a, Stream{}), Catch::Contains("capacity=-1"));
  a = moe_gate_args(logits, 2, 0);
  a.slot = Tensor::zeros({6, 2}, DType::F32);
  CHECK_THROWS_WITH(ops::moe_gate_forward(a, Stream{}), Catch::Contains("'slot'") && Catch::Contains("i32"));
  a = moe_gate_args(logits, 2, 0);
  a.counts = Tensor::zeros({4}, DType::I32);
  CHECK_THROWS_WITH(ops::moe_gate_forward(a, Stream{}), Catch::Contains("'counts'"));
  // Slots past the buffer (a caller that sized C too small) are refused.
  a = moe_gate_args(logits, 2, 0);
  ops::moe_gate_forward(a, Stream{});
  CHECK_THROWS_WITH(ops::moe_dispatch_forward({.out = Tensor::zeros({3, 1, 2}, DType::F32),
                                               .inp = randn({6, 2}, 2), .expert = a.expert, .slot = a.slot},
                                              Stream{}),
                    Catch::Contains("moe_dispatch_forward") && Catch::Contains("slot"));
  CHECK_THROWS_WITH(ops::moe_combine_forward({.out = Tensor::zeros({6, 2}, DType::F32),
                                              .inp = Tensor::zeros({3, 12, 3}, DType::F32),
                                              .weight = a.weight, .expert = a.expert, .slot = a.slot},
                                             Stream{}),
                    Catch::Contains("'inp'") && Catch::Contains("D=2"));
}

// PR-MoE's mix: the forward against a double reference, the backward against
// central differences of sum(r * out) in double.
TEST_CASE("moe mix (PR-MoE): reference forward and finite-difference backward") {
  const int64_t N = 9, D = 13;
  const Tensor moe = randn({N, D}, 41), mlp = randn({N, D}, 42), coef = randn({N, 2}, 43, 2.0), r = randn({N, D}, 44);
  Tensor out = Tensor::empty({N, D}, DType::F32);
  ops::moe_mix_forward({.out = out, .moe = moe, .mlp = mlp, .coef = coef}, Stream{});
  auto loss = [&](const Tensor& mo, const Tensor& ml, const Tensor& co) {  // sum(r * out) in double
    double l = 0;
    for (int64_t n = 0; n < N; ++n) {
      const double a = co.data<float>()[2 * n], b = co.data<float>()[2 * n + 1], m = std::max(a, b);
      const double c0 = std::exp(a - m) / (std::exp(a - m) + std::exp(b - m)), c1 = 1 - c0;
      for (int64_t d = 0; d < D; ++d)
        l += double(r.data<float>()[n * D + d]) *
             (c0 * mo.data<float>()[n * D + d] + c1 * ml.data<float>()[n * D + d]);
    }
    return l;
  };
  for (int64_t n = 0; n < N; ++n) {
    const double a = coef.data<float>()[2 * n], b = coef.data<float>()[2 * n + 1];
    const double c0 = 1 / (1 + std::exp(b - a));
    for (int64_t d = 0; d < D; ++d) {
      const double want = c0 * moe.data<float>()[n * D + d] + (1 - c0) * mlp.data<float>()[n * D + d];
      CHECK(std::abs(out.data<float>()[n * D + d] - want) <= 1e-6 * (1 + std::abs(want)));
    }
  }
  Tensor dmoe = Tensor::empty({N, D}, DType::F32), dmlp = Tensor::empty({N, D}, DType::F32),
         dcoef = Tensor::empty({N, 2}, DType::F32);
  ops::moe_mix_backward({.dmoe = dmoe, .dmlp = dmlp, .dcoef = dcoef, .dout = r, .moe = moe, .mlp = mlp, .coef = coef},
                        Stream{});
  for (auto [t, g] : {std::pair{moe, dmoe}, {mlp, dmlp}, {coef, dcoef}}) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      Tensor tp = t.clone(), tm = t.clone();
      const float h = 1e-2f;
      tp.data<float>()[i] += h;
      tm.data<float>()[i] -= h;
      const bool is_moe = t.raw() == moe.raw(), is_mlp = t.raw() == mlp.raw();
      const double lp = loss(is_moe ? tp : moe, is_mlp ? tp : mlp, !is_moe && !is_mlp ? tp : coef);
      const double lm = loss(is_moe ? tm : moe, is_mlp ? tm : mlp, !is_moe && !is_mlp ? tm : coef);
      const double fd = (lp - lm) / (2.0 * h);
      worst = std::max(worst, std::abs(fd - double(g.data<float>()[i])));
      scale = std::max(scale, std::abs(fd));
    }
    CHECK(worst <= 1e-4 * scale);
  }
  // The same through the op-test harness (the cases the GPU test runs).
  const Tensor zeros = Tensor::zeros({N, D}, DType::F32);
  check_reference(moe_mix_forward_case({.out = zeros.clone(), .moe = moe, .mlp = mlp, .coef = coef}));
  check_finite_diff(moe_mix_backward_case({.dmoe = zeros.clone(), .dmlp = zeros.clone(),
                                           .dcoef = Tensor::zeros({N, 2}, DType::F32), .dout = r, .moe = moe,
                                           .mlp = mlp, .coef = coef}));
  // Arguments: coef must be (N, 2) f32.
  CHECK_THROWS_WITH(ops::moe_mix_forward({.out = out, .moe = moe, .mlp = mlp, .coef = randn({N, 3}, 1)}, Stream{}),
                    Catch::Contains("moe_mix_forward: tensor 'coef' has shape"));
}

// Noisy gate policy Jitter: each element scaled by a uniform in (1 - eps,
// 1 + eps), the same for the same key, other for another stream, centred on 1.
TEST_CASE("moe jitter: keyed uniform scaling in (1 - eps, 1 + eps)") {
  const int64_t N = 64, D = 48;
  const Tensor x = randn({N, D}, 71);
  auto jitter = [&](uint64_t stream) {
    Tensor y = Tensor::empty({N, D}, DType::F32);
    ops::moe_jitter({.out = y, .inp = x, .eps = 0.01f, .noise_seed = 5, .noise_stream = stream}, Stream{});
    return y;
  };
  const Tensor a = jitter(1), b = jitter(1), c = jitter(2);
  double sum = 0, lo = 2, hi = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < N * D; ++i) {
    CHECK(a.data<float>()[i] == b.data<float>()[i]);
    const double f = double(a.data<float>()[i]) / x.data<float>()[i];
    lo = std::min(lo, f), hi = std::max(hi, f), sum += f;
    differ += a.data<float>()[i] != c.data<float>()[i];
  }
  CHECK(lo > 0.99 - 1e-6);
  CHECK(hi < 1.01 + 1e-6);
  CHECK(hi - lo > 0.019);  // the whole interval is used
  CHECK(std::abs(sum / double(N * D) - 1.0) < 1e-3);
  CHECK(differ > N * D * 9 / 10);
  // In place (the backward scales the gradient the same way).
  Tensor z = x.clone();
  ops::moe_jitter({.out = z, .inp = z, .eps = 0.01f, .noise_seed = 5, .noise_stream = 1}, Stream{});
  for (int64_t i = 0; i < N * D; ++i) CHECK(z.data<float>()[i] == a.data<float>()[i]);
}
