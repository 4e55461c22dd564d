// The CPU backend's native bf16 matmuls and attention (lib/cpu/bf16_gemm.h:
// oneDNN on AVX512-BF16 or AMX) against double references computed from the
// same bf16 inputs: matmul forward with and without bias, backward with every
// output dtype and accumulation, odd shapes that leave partial tiles, shapes
// of both tilings; attention forward and backward (multi-head and grouped-
// query, T not a multiple of the 64-row block, with dropout against the f32
// op); thread-count independence. Registered twice: as the CPU decides, and
// with DS_CPU_BF16_GEMM=f32 (the f32 fallback every CPU without bf16
// instructions takes), where the same tolerances must hold.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <cstdlib>

#include "lib/cpu/bf16_gemm.h"
#include "lib/cpu/cpu_ops.h"
#include "test/ops_harness/attn_ref.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

Vec as_f64(const Tensor& t) { return to_f64(t.dtype() == DType::F32 ? t : to_dtype(t, DType::F32)); }

bool native_on() { return cpu::bf16_gemm_mode().isa != cpu::Bf16GemmIsa::None; }

// Expected C (M, N) = init + A (M, K) @ B (K, N) in double, A(i, k) = a[i*ars + k*acs],
// B(k, j) = b[k*brs + j*bcs], with the bound each element's f32 sum may be off:
// K * 2^-23 * (sum |a b| + |init|) (f32 accumulation in any order).
struct Expect {
  Vec ref, bound;
};
Expect gemm_ref(const Vec& a, int64_t ars, int64_t acs, const Vec& b, int64_t brs, int64_t bcs, int64_t M,
                int64_t N, int64_t K, const Vec& init) {
  Expect e{Vec(M * N), Vec(M * N)};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = init.empty() ? 0.0 : init[i * N + j], mag = std::fabs(s);
      for (int64_t k = 0; k < K; ++k) {
        const double p = a[i * ars + k * acs] * b[k * brs + j * bcs];
        s += p, mag += std::fabs(p);
      }
      e.ref[i * N + j] = s;
      e.bound[i * N + j] = (K + 2) * std::ldexp(mag, -23);
    }
  return e;
}

// got (f32 or bf16) against e: within the f32 bound, plus one bf16 rounding
// (2^-8 relative) for a bf16 result.
void check_gemm(const Tensor& got, const Expect& e, const std::string& what) {
  INFO(what);
  const Vec g = as_f64(got);
  REQUIRE(g.size() == e.ref.size());
  const bool bf16 = got.dtype() == DType::BF16;
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = e.bound[i] + (bf16 ? std::ldexp(std::fabs(e.ref[i]), -8) : 0.0);
    const double d = std::fabs(g[i] - e.ref[i]);
    if (d > tol) ++bad;
    worst = std::max(worst, d / std::max(tol, 1e-300));
  }
  INFO("worst error / bound " << worst);
  CHECK(bad == 0);
}

Vec broadcast_rows(const Vec& row, int64_t M) {
  Vec v;
  for (int64_t i = 0; i < M; ++i) v.insert(v.end(), row.begin(), row.end());
  return v;
}

struct Shape3 {
  int64_t N, C, OC;  // tokens, input and output features
};
// Small, odd (partial tiles of the small-gemm tiling; fewer than 8 rows or
// fewer than 8 output features: the dot-product forwards), and large (the
// split tiling with an edge piece).
const Shape3 kShapes[] = {{1, 1, 1},     {5, 12, 7},     {3, 70, 200},     {45, 37, 4},
                          {130, 64, 1},  {257, 129, 67}, {1029, 300, 771}};

void check_forward(const Shape3& s, DType out_dt, bool bias, DType bias_dt, uint64_t seed) {
  MatmulArgs f;
  f.inp = to_dtype(randn({s.N, s.C}, seed), DType::BF16);
  f.weight = to_dtype(randn({s.OC, s.C}, seed + 1, 0.3), DType::BF16);
  if (bias) f.bias = to_dtype(randn({s.OC}, seed + 2), bias_dt);
  f.out = Tensor::empty({s.N, s.OC}, out_dt);
  ops::matmul_forward(f);
  const Expect e = gemm_ref(as_f64(f.inp), s.C, 1, as_f64(f.weight), 1, s.C, s.N, s.OC, s.C,
                            bias ? broadcast_rows(as_f64(f.bias), s.N) : Vec());
  check_gemm(f.out, e, fmt::format("forward N {} C {} OC {} out {} bias {}", s.N, s.C, s.OC, dtype_name(out_dt),
                                   bias ? dtype_name(bias_dt) : "none"));
}

}  // namespace

TEST_CASE("bf16 matmul: the mode is decided once and named") {
  const cpu::Bf16GemmMode& m = cpu::bf16_gemm_mode();
  INFO(m.description);
  CHECK(!m.description.empty());
  CHECK(std::string(ops::cpu_lowp_description()) == m.description);
  const char* env = std::getenv("DS_CPU_BF16_GEMM");
  if (env && std::string(env) == "f32") CHECK(m.isa == cpu::Bf16GemmIsa::None);
  // The native kernel takes bf16 operands when on and declines everything else.
  MatmulArgs f;
  f.inp = to_dtype(randn({3, 4}, 1), DType::BF16);
  f.weight = to_dtype(randn({5, 4}, 2), DType::BF16);
  f.out = Tensor::empty({3, 5}, DType::BF16);
  CHECK(cpu::lowp::matmul_forward(f, Stream{}) == native_on());
  f.weight = to_dtype(f.weight, DType::F32);
  CHECK_FALSE(cpu::lowp::matmul_forward(f, Stream{}));
  f.inp = to_dtype(f.inp, DType::F16), f.weight = to_dtype(f.weight, DType::F16);
  CHECK_FALSE(cpu::lowp::matmul_forward(f, Stream{}));
}

TEST_CASE("bf16 matmul forward against a double reference") {
  uint64_t seed = 100;
  for (const Shape3& s : kShapes) {
    for (DType out_dt : {DType::BF16, DType::F32}) {
      check_forward(s, out_dt, false, DType::F32, seed += 3);
      check_forward(s, out_dt, true, DType::BF16, seed += 3);
      check_forward(s, out_dt, true, DType::F32, seed += 3);
    }
  }
}

// Few output features (generation's head as logits^T = head @ rows^T) is
// the few-rows forward of the transposed product, bit for bit.
TEST_CASE("bf16 matmul with few output features is the transposed few-rows product") {
  if (!native_on()) return;
  const int64_t N = 45, C = 37, OC = 4;
  MatmulArgs cols, rows;
  cols.inp = to_dtype(randn({N, C}, 7), DType::BF16);
  cols.weight = to_dtype(randn({OC, C}, 8, 0.3), DType::BF16);
  cols.out = Tensor::empty({N, OC}, DType::F32);
  rows.inp = cols.weight;
  rows.weight = cols.inp;
  rows.out = Tensor::empty({OC, N}, DType::F32);
  REQUIRE(cpu::lowp::matmul_forward(cols, Stream{}));
  REQUIRE(cpu::lowp::matmul_forward(rows, Stream{}));
  int64_t same = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o)
      same += std::memcmp(cols.out.data<float>() + n * OC + o, rows.out.data<float>() + o * N + n, 4) == 0;
  CHECK(same == N * OC);
}

TEST_CASE("bf16 matmul backward against a double reference") {
  uint64_t seed = 200;
  for (const Shape3& s : kShapes) {
    for (DType gdt : {DType::F32, DType::BF16}) {     // dweight / dbias dtype
      for (DType idt : {DType::BF16, DType::F32}) {   // dinp dtype
        for (Accum acc : {Accum::Overwrite, Accum::Add}) {
          seed += 10;
          MatmulBwdArgs g;
          g.dout = to_dtype(randn({s.N, s.OC}, seed), DType::BF16);
          g.inp = to_dtype(randn({s.N, s.C}, seed + 1), DType::BF16);
          g.weight = to_dtype(randn({s.OC, s.C}, seed + 2, 0.3), DType::BF16);
          g.dinp = to_dtype(randn({s.N, s.C}, seed + 3), idt);
          g.dweight = to_dtype(randn({s.OC, s.C}, seed + 4), gdt);
          g.dbias = to_dtype(randn({s.OC}, seed + 5), gdt);
          g.accum = acc;
          const Vec dinp0 = as_f64(g.dinp), dw0 = as_f64(g.dweight), db0 = as_f64(g.dbias);
          const Vec dout = as_f64(g.dout), inp = as_f64(g.inp), w = as_f64(g.weight);
          ops::matmul_backward(g);
          const std::string what = fmt::format("backward N {} C {} OC {} dinp {} grads {} accum {}", s.N, s.C, s.OC,
                                               dtype_name(idt), dtype_name(gdt), acc == Accum::Add);
          check_gemm(g.dinp, gemm_ref(dout, s.OC, 1, w, s.C, 1, s.N, s.C, s.OC, acc == Accum::Add ? dinp0 : Vec()),
                     what + " dinp");
          check_gemm(g.dweight, gemm_ref(dout, 1, s.OC, inp, s.C, 1, s.OC, s.C, s.N, dw0), what + " dweight");
          // dbias: column sums of dout (a gemm with a ones vector).
          check_gemm(g.dbias, gemm_ref(Vec(s.N, 1.0), 0, 1, dout, s.OC, 1, 1, s.OC, s.N, db0), what + " dbias");
        }
      }
    }
  }
}

TEST_CASE("bf16 matmul results do not depend on the thread count") {
  // A training-sized GEMM and a decoding step's few rows (dot products).
  for (const Shape3 s : {Shape3{1029, 300, 771}, Shape3{3, 300, 771}, Shape3{1029, 300, 5}}) {
    MatmulArgs f;
    f.inp = to_dtype(randn({s.N, s.C}, 1), DType::BF16);
    f.weight = to_dtype(randn({s.OC, s.C}, 2, 0.3), DType::BF16);
    f.bias = to_dtype(randn({s.OC}, 3), DType::BF16);
    MatmulBwdArgs g;
    g.dout = to_dtype(randn({s.N, s.OC}, 4), DType::BF16);
    g.inp = f.inp, g.weight = f.weight;
    std::vector<Tensor> outs;
    for (int threads : {1, 2, 3}) {
      f.out = Tensor::empty({s.N, s.OC}, DType::BF16);
      g.dinp = Tensor::empty({s.N, s.C}, DType::BF16);
      g.dweight = Tensor::zeros({s.OC, s.C}, DType::F32);
      g.dbias = Tensor::zeros({s.OC}, DType::F32);
      with_threads(threads, [&] {
        ops::matmul_forward(f);
        ops::matmul_backward(g);
      });
      for (const Tensor& t : {f.out, g.dinp, g.dweight, g.dbias}) outs.push_back(t);
    }
    for (size_t i = 4; i < outs.size(); ++i) {
      INFO("rows " << s.N << ", output " << i % 4 << ", run " << i / 4);
      CHECK(bit_equal(outs[i], outs[i % 4]));
    }
  }
}

namespace {

struct AttnBf16 {
  Tensor out, lse, dqkv;
};

// Attention forward and backward with qkv, out, dout and dqkv in dtype dt
// (lse f32).
AttnBf16 run_attention(const Tensor& qkv, const Tensor& dout, const AttnShape& s, float p_drop = 0.f) {
  const DType dt = qkv.dtype();
  AttentionArgs f;
  f.qkv = qkv;
  f.out = Tensor::empty({s.B, s.T, s.NH * s.HS}, dt);
  f.lse = Tensor::empty({s.B, s.NH, s.T}, DType::F32);
  f.NH = static_cast<int>(s.NH);
  f.NKV = static_cast<int>(s.NKV);
  if (p_drop > 0.f) f.dropout = DropoutSpec{.p = p_drop, .stream = 17, .sample0 = 3, .head0 = 1};
  if (!s.len.empty()) {
    f.lengths = Tensor::empty({s.B}, DType::I32);
    for (int64_t b = 0; b < s.B; ++b) f.lengths.data<int32_t>()[b] = s.len[static_cast<size_t>(b)];
  }
  ops::attention_forward(f);
  AttentionBwdArgs g;
  g.dqkv = to_dtype(randn(qkv.shape(), 99), dt);  // garbage: must be overwritten
  g.dout = dout, g.out = f.out, g.lse = f.lse, g.qkv = qkv, g.NH = f.NH, g.NKV = f.NKV, g.dropout = f.dropout;
  g.lengths = f.lengths;
  ops::attention_backward(g);
  return {f.out, f.lse, g.dqkv};
}

}  // namespace

TEST_CASE("bf16 attention forward and backward against double references") {
  // Errors relative to each tensor's largest value: bf16 outputs (2^-9), and
  // natively P and dS rounded to bf16 before their products.
  // (the last two with right padding: per-sample lengths)
  for (AttnShape s : {AttnShape{2, 7, 3, 16}, AttnShape{1, 133, 2, 64}, AttnShape{2, 65, 4, 32, 2},
                      AttnShape{1, 200, 6, 64, 3}, AttnShape{2, 7, 3, 16, 0, {3, 7}},
                      AttnShape{2, 133, 4, 32, 2, {100, 1}}}) {
    DYNAMIC_SECTION("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.kv() << " HS=" << s.HS) {
      const Tensor qkv = to_dtype(randn({s.B, s.T, s.width()}, 60), DType::BF16);
      const Tensor dout = to_dtype(randn({s.B, s.T, s.NH * s.HS}, 61), DType::BF16);
      const AttnBf16 r = run_attention(qkv, dout, s);
      REQUIRE(r.out.dtype() == DType::BF16);
      Vec lse;
      const Vec ref = ref_attention(as_f64(qkv), s, &lse);
      CHECK(rel_err(as_f64(r.out), ref) < 8e-3);
      CHECK(rel_err(to_f64(r.lse), lse) < 1e-5);
      CHECK(rel_err(as_f64(r.dqkv), ref_attention_backward(as_f64(qkv), as_f64(dout), s)) < 1.5e-2);
    }
  }
}

TEST_CASE("bf16 attention with dropout follows the f32 op's mask") {
  const AttnShape s{2, 70, 4, 32, 2};
  const Tensor qkv = to_dtype(randn({s.B, s.T, s.width()}, 70), DType::BF16);
  const Tensor dout = to_dtype(randn({s.B, s.T, s.NH * s.HS}, 71), DType::BF16);
  const AttnBf16 lo = run_attention(qkv, dout, s, 0.3f);
  const AttnBf16 hi = run_attention(to_dtype(qkv, DType::F32), to_dtype(dout, DType::F32), s, 0.3f);
  CHECK(rel_err(as_f64(lo.out), to_f64(hi.out)) < 8e-3);
  CHECK(rel_err(as_f64(lo.dqkv), to_f64(hi.dqkv)) < 1.5e-2);
  // Without the same mask the difference would be of the order of the values.
  const AttnBf16 other = run_attention(to_dtype(qkv, DType::F32), to_dtype(dout, DType::F32), s, 0.5f);
  CHECK(rel_err(to_f64(other.out), to_f64(hi.out)) > 0.1);
}

TEST_CASE("bf16 attention results do not depend on the thread count") {
  const AttnShape s{2, 130, 4, 64, 2};
  const Tensor qkv = to_dtype(randn({s.B, s.T, s.width()}, 80), DType::BF16);
  const Tensor dout = to_dtype(randn({s.B, s.T, s.NH * s.HS}, 81), DType::BF16);
  AttnBf16 r1, r3;
  with_threads(1, [&] { r1 = run_attention(qkv, dout, s); });
  with_threads(3, [&] { r3 = run_attention(qkv, dout, s); });
  CHECK(bit_equal(r1.out, r3.out));
  CHECK(bit_equal(r1.lse, r3.lse));
  CHECK(bit_equal(r1.dqkv, r3.dqkv));
}

TEST_CASE("bf16 matmul speed against the f32 kernel", "[.][bench]") {
  const Shape3 s{1024, 768, 3072};
  MatmulArgs f;
  f.inp = to_dtype(randn({s.N, s.C}, 1), DType::BF16);
  f.weight = to_dtype(randn({s.OC, s.C}, 2, 0.3), DType::BF16);
  f.out = Tensor::empty({s.N, s.OC}, DType::BF16);
  MatmulArgs f32{.out = Tensor::empty({s.N, s.OC}, DType::F32), .inp = to_dtype(f.inp, DType::F32),
                 .weight = to_dtype(f.weight, DType::F32), .bias = Tensor()};
  auto best = [](const std::function<void()>& fn) {
    double b = 1e30;
    for (int r = 0; r < 5; ++r) {
      const double t0 = omp_get_wtime();
      fn();
      b = std::min(b, omp_get_wtime() - t0);
    }
    return b;
  };
  const double tb = best([&] { ops::matmul_forward(f); }), tf = best([&] { ops::matmul_forward(f32); });
  const double fl = 2.0 * s.N * s.C * s.OC;
  WARN(fmt::format("{}: bf16 {:.1f} GFLOP/s, f32 {:.1f} GFLOP/s ({:.2f}x)", cpu::bf16_gemm_mode().description,
                   fl / tb / 1e9, fl / tf / 1e9, tf / tb));
}
