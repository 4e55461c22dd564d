// bf16 / f16 tensors on the CPU backend (emulated in f32 by the dispatcher;
// bf16 matmuls and attention where the CPU runs them natively:
// test_cpu_bf16_matmul).
// For every op and both low dtypes: run once with low-precision tensors and
// once in f32 on the exactly upcast inputs; the f32 outputs rounded to the low
// dtype must be bit-identical to the low-precision run, and f32 fields (stats,
// f32 weight gradients accumulating into bf16 activations' ops, optimizer
// state) bit-identical too. Also: aliased fields, partial overlaps, inf/nan
// detection, cast's own conversions, thread-count independence.
#include <chrono>
#include <map>
#include <utility>

#include "lib/cpu/bf16_gemm.h"
#include "lib/cpu/cpu_ops.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

constexpr int64_t B = 2, T = 5, C = 12, NH = 3, V = 37, Vp = 40, N = B * T;

template <class A>
struct Field {
  Tensor A::*member;
  const char* name;
};
template <class A>
using Fields = std::vector<Field<A>>;

// Runs `op` on a low-precision version of `base` (the `lowp` fields in dtype
// dt, the `exact` fields fresh copies as they are, usually f32) and on an f32
// version (the `lowp` fields upcast exactly) and compares the results bitwise. Fields sharing
// storage in `base` share it in both versions (aliases stay aliases). Fields
// in neither list are shared by both runs and must be read-only.
template <class A, class Op>
void check_lowp(const A& base, DType dt, const Fields<A>& lowp, const Fields<A>& exact, Op&& op) {
  INFO("dtype " << dtype_name(dt));
  A lo = base, ref = base;
  std::map<const void*, std::pair<Tensor, Tensor>> made;  // base storage -> (lo, ref)
  auto make = [&](const Field<A>& f, bool low) {
    const Tensor& b = base.*(f.member);
    if (!b.defined()) return;
    auto it = made.find(b.raw());
    if (it == made.end()) {
      Tensor l = low ? to_dtype(b, dt) : b.clone();
      Tensor r = low ? to_dtype(l, DType::F32) : b.clone();
      it = made.emplace(b.raw(), std::make_pair(l, r)).first;
    }
    lo.*(f.member) = it->second.first.reshape(b.shape());
    ref.*(f.member) = it->second.second.reshape(b.shape());
  };
  for (const auto& f : lowp) make(f, true);
  for (const auto& f : exact) make(f, false);
  op(lo);
  op(ref);
  for (const auto& f : lowp) {
    if (!(base.*(f.member)).defined()) continue;
    INFO("low-precision field " << f.name);
    CHECK((lo.*(f.member)).dtype() == dt);
    CHECK(bit_equal(lo.*(f.member), to_dtype(ref.*(f.member), dt)));
  }
  for (const auto& f : exact) {
    INFO("field " << f.name);
    CHECK(bit_equal(lo.*(f.member), ref.*(f.member)));
  }
}

const DType kLowp[] = {DType::BF16, DType::F16};

Tensor tokens_bt() { return tokens_tensor({B, T}, {3, 0, 36, 21, 7, 21, 39, 12, 5, 30}); }

#define DS_F(A, name) Field<A>{&A::name, #name}

}  // namespace

TEST_CASE("lowp embedding forward and backward") {
  using E = EmbeddingArgs;
  using EB = EmbeddingBwdArgs;
  for (DType dt : kLowp) {
    for (int64_t vstart : {int64_t{0}, int64_t{20}}) {
      INFO("vocab_start " << vstart);
      E f;
      f.out = randn({B, T, C}, 1);
      f.tokens = tokens_bt();
      f.wte = randn({vstart ? 20 : Vp, C}, 2);
      f.wpe = randn({8, C}, 3);
      f.vocab_start = vstart;
      f.pos_offset = 2;
      const auto fwd = [](const E& x) { ops::embedding_forward(x); };
      check_lowp(f, dt, {DS_F(E, out), DS_F(E, wte), DS_F(E, wpe)}, {}, fwd);
      EB g;
      g.dwte = randn(f.wte.shape(), 4);  // += into nonzero values
      g.dwpe = randn({8, C}, 5);
      g.dout = randn({B, T, C}, 6);
      g.tokens = f.tokens;
      g.vocab_start = vstart;
      g.pos_offset = 2;
      const auto bwd = [](const EB& x) { ops::embedding_backward(x); };
      check_lowp(g, dt, {DS_F(EB, dwte), DS_F(EB, dwpe), DS_F(EB, dout)}, {}, bwd);
      check_lowp(g, dt, {DS_F(EB, dout)}, {DS_F(EB, dwte), DS_F(EB, dwpe)}, bwd);  // f32 dweights
    }
  }
  // The bf16 forward runs natively (not the emulation, which upcasts the whole tables): with and without the
  // position table, with padding lengths, OPT's padding row and shifted real positions, the emulated f32
  // kernel's bits; an empty token table gives the positions alone.
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    E f;
    f.out = to_dtype(randn({B, T, C}, 7), DType::BF16);
    f.tokens = tokens_bt();
    f.wte = to_dtype(randn({variant == 2 ? 0 : Vp, C}, 8), DType::BF16);
    if (variant > 0) {
      f.wpe = to_dtype(randn({10, C}, 9), DType::BF16);
      f.row_offset = 2;
      f.lengths = tokens_tensor({B}, {3, 5});
      f.pad_row = 1;
      f.shifts = tokens_tensor({B}, {2, 0});
    }
    E em = f;
    em.out = to_dtype(f.out, DType::F32);
    em.wte = to_dtype(f.wte, DType::F32);
    if (f.wpe.defined()) em.wpe = to_dtype(f.wpe, DType::F32);
    REQUIRE(cpu::lowp::embedding_forward(f, Stream{}));
    cpu::embedding_forward(em, Stream{});
    CHECK(bit_equal(f.out, to_dtype(em.out, DType::BF16)));
  }
}

TEST_CASE("lowp layernorm forward and backward") {
  using L = LayerNormArgs;
  using LB = LayerNormBwdArgs;
  L f;
  f.out = Tensor::empty({B, T, C}, DType::F32);
  f.mean = Tensor::empty({N}, DType::F32);
  f.rstd = Tensor::empty({N}, DType::F32);
  f.inp = randn({B, T, C}, 10, 2.0);
  f.weight = randn({C}, 11);
  f.bias = randn({C}, 12);
  ops::layernorm_forward(f);  // f32 mean/rstd for the backward
  LB g;
  g.dinp = randn({B, T, C}, 13);
  g.dweight = randn({C}, 14);
  g.dbias = randn({C}, 15);
  g.dout = randn({B, T, C}, 16);
  g.inp = f.inp, g.weight = f.weight, g.mean = f.mean, g.rstd = f.rstd;
  const auto fwd = [](const L& x) { ops::layernorm_forward(x); };
  const auto bwd = [](const LB& x) { ops::layernorm_backward(x); };
  for (DType dt : kLowp) {
    check_lowp(f, dt, {DS_F(L, out), DS_F(L, inp), DS_F(L, weight), DS_F(L, bias)},
               {DS_F(L, mean), DS_F(L, rstd)}, fwd);
    for (Accum acc : {Accum::Overwrite, Accum::Add}) {
      g.accum = acc;
      check_lowp(g, dt, {DS_F(LB, dinp), DS_F(LB, dweight), DS_F(LB, dbias), DS_F(LB, dout), DS_F(LB, inp),
                         DS_F(LB, weight)}, {}, bwd);
      check_lowp(g, dt, {DS_F(LB, dinp), DS_F(LB, dout), DS_F(LB, inp), DS_F(LB, weight)},
                 {DS_F(LB, dweight), DS_F(LB, dbias)}, bwd);  // f32 dweight/dbias +=
    }
  }
}

TEST_CASE("lowp rmsnorm forward and backward") {
  using R = RMSNormArgs;
  using RB = RMSNormBwdArgs;
  R f;
  f.out = Tensor::empty({B, T, C}, DType::F32);
  f.rstd = Tensor::empty({N}, DType::F32);
  f.inp = randn({B, T, C}, 20, 2.0);
  f.weight = randn({C}, 21);
  ops::rmsnorm_forward(f);
  RB g;
  g.dinp = randn({B, T, C}, 22);
  g.dweight = randn({C}, 23);
  g.dout = randn({B, T, C}, 24);
  g.inp = f.inp, g.weight = f.weight, g.rstd = f.rstd;
  g.accum = Accum::Add;
  const auto fwd = [](const R& x) { ops::rmsnorm_forward(x); };
  const auto bwd = [](const RB& x) { ops::rmsnorm_backward(x); };
  for (DType dt : kLowp) {
    check_lowp(f, dt, {DS_F(R, out), DS_F(R, inp), DS_F(R, weight)}, {DS_F(R, rstd)}, fwd);
    check_lowp(g, dt, {DS_F(RB, dinp), DS_F(RB, dweight), DS_F(RB, dout), DS_F(RB, inp), DS_F(RB, weight)}, {},
               bwd);
    check_lowp(g, dt, {DS_F(RB, dinp), DS_F(RB, dout), DS_F(RB, inp), DS_F(RB, weight)}, {DS_F(RB, dweight)},
               bwd);
  }
}

TEST_CASE("lowp matmul forward and backward") {
  using M = MatmulArgs;
  using MB = MatmulBwdArgs;
  const int64_t OC = 7;
  M f;
  f.out = Tensor::empty({B, T, OC}, DType::F32);
  f.inp = randn({B, T, C}, 30);
  f.weight = randn({OC, C}, 31, 0.3);
  f.bias = randn({OC}, 32);
  MB g;
  g.dinp = randn({B, T, C}, 33);
  g.dweight = randn({OC, C}, 34);
  g.dbias = randn({OC}, 35);
  g.dout = randn({B, T, OC}, 36);
  g.inp = f.inp, g.weight = f.weight;
  const auto fwd = [](const M& x) { ops::matmul_forward(x); };
  const auto bwd = [](const MB& x) { ops::matmul_backward(x); };
  for (DType dt : kLowp) {
    // Native bf16 matmuls are not the emulation: test_cpu_bf16_matmul checks them.
    if (dt == DType::BF16 && cpu::bf16_gemm_mode().isa != cpu::Bf16GemmIsa::None) continue;
    check_lowp(f, dt, {DS_F(M, out), DS_F(M, inp), DS_F(M, weight), DS_F(M, bias)}, {}, fwd);
    M nb = f;
    nb.bias = Tensor();
    check_lowp(nb, dt, {DS_F(M, out), DS_F(M, inp), DS_F(M, weight)}, {}, fwd);
    for (Accum acc : {Accum::Overwrite, Accum::Add}) {
      g.accum = acc;
      check_lowp(g, dt, {DS_F(MB, dinp), DS_F(MB, dweight), DS_F(MB, dbias), DS_F(MB, dout), DS_F(MB, inp),
                         DS_F(MB, weight)}, {}, bwd);
      check_lowp(g, dt, {DS_F(MB, dinp), DS_F(MB, dout), DS_F(MB, inp), DS_F(MB, weight)},
                 {DS_F(MB, dweight), DS_F(MB, dbias)}, bwd);
    }
    MB nd = g;  // no dinp, no dbias
    nd.dinp = Tensor(), nd.dbias = Tensor();
    check_lowp(nd, dt, {DS_F(MB, dweight), DS_F(MB, dout), DS_F(MB, inp), DS_F(MB, weight)}, {}, bwd);
  }
}

TEST_CASE("lowp attention forward and backward") {
  using At = AttentionArgs;
  using AB = AttentionBwdArgs;
  At f;
  f.out = Tensor::empty({B, T, C}, DType::F32);
  f.lse = Tensor::empty({B, NH, T}, DType::F32);
  f.qkv = randn({B, T, 3 * C}, 40);
  f.NH = NH;
  ops::attention_forward(f);  // consistent out/lse for the backward
  AB g;
  g.dqkv = randn({B, T, 3 * C}, 41);
  g.dout = randn({B, T, C}, 42);
  g.out = f.out, g.lse = f.lse, g.qkv = f.qkv;
  g.NH = NH;
  const auto fwd = [](const At& x) { ops::attention_forward(x); };
  const auto bwd = [](const AB& x) { ops::attention_backward(x); };
  for (DType dt : kLowp) {
    // Native bf16 attention is not the emulation: test_cpu_bf16_matmul checks it.
    if (dt == DType::BF16 && cpu::bf16_gemm_mode().isa != cpu::Bf16GemmIsa::None) continue;
    check_lowp(f, dt, {DS_F(At, out), DS_F(At, qkv)}, {DS_F(At, lse)}, fwd);
    check_lowp(g, dt, {DS_F(AB, dqkv), DS_F(AB, dout), DS_F(AB, out), DS_F(AB, qkv)}, {}, bwd);
  }
}

// Decoding against a KV cache: bf16 runs natively (lowp::kv_attention, no
// upcast of the whole caches), f16 emulated; both bit-identical to the f32
// kernel on the exact upcasts, the caches' earlier rows untouched. Grouped
// query heads, samples at different positions, a prefill of two rows.
TEST_CASE("lowp kv_attention: the caches and the output") {
  using K = KvAttentionArgs;
  const int64_t Tmax = 9, HS = 4, NKV = 1;
  for (int64_t Tq : {int64_t{1}, int64_t{2}}) {
    K k;
    k.NH = 2;
    k.NKV = NKV;
    k.out = randn({B, Tq, 2 * HS}, 70);
    k.k_cache = randn({B, Tmax, NKV * HS}, 71);
    k.v_cache = randn({B, Tmax, NKV * HS}, 72);
    k.qkv = randn({B, Tq, (2 + 2 * NKV) * HS}, 73, 2.0);
    k.pos = tokens_tensor({B}, {3, 6});
    for (DType dt : kLowp)
      check_lowp(k, dt, {DS_F(K, out), DS_F(K, k_cache), DS_F(K, v_cache), DS_F(K, qkv)}, {},
                 [](const K& x) { ops::kv_attention(x); });
    // The bf16 kernel itself (not the emulation) ran: the same bits as the emulated f32 kernel.
    K lo = k, em = k;
    lo.out = to_dtype(k.out, DType::BF16);
    lo.k_cache = to_dtype(k.k_cache, DType::BF16);
    lo.v_cache = to_dtype(k.v_cache, DType::BF16);
    lo.qkv = to_dtype(k.qkv, DType::BF16);
    em.out = to_dtype(lo.out, DType::F32);
    em.k_cache = to_dtype(lo.k_cache, DType::F32);
    em.v_cache = to_dtype(lo.v_cache, DType::F32);
    em.qkv = to_dtype(lo.qkv, DType::F32);
    REQUIRE(cpu::lowp::kv_attention(lo, Stream{}));
    cpu::kv_attention(em, Stream{});
    CHECK(bit_equal(lo.out, to_dtype(em.out, DType::BF16)));
    CHECK(bit_equal(lo.k_cache, to_dtype(em.k_cache, DType::BF16)));
    CHECK(bit_equal(lo.v_cache, to_dtype(em.v_cache, DType::BF16)));
  }
}

TEST_CASE("lowp rope forward and backward, separate and in place") {
  using Ro = RopeArgs;
  Ro r;
  r.out = randn({B, T, 3 * C}, 50);
  r.inp = randn({B, T, 3 * C}, 51);
  r.NH = NH;
  r.pos_offset = 3;
  Ro in_place = r;
  in_place.out = in_place.inp;
  for (DType dt : kLowp) {
    for (const Ro& a : {r, in_place}) {
      INFO("in place " << (a.out.raw() == a.inp.raw()));
      check_lowp(a, dt, {DS_F(Ro, out), DS_F(Ro, inp)}, {}, [](const Ro& x) { ops::rope_forward(x); });
      check_lowp(a, dt, {DS_F(Ro, out), DS_F(Ro, inp)}, {}, [](const Ro& x) { ops::rope_backward(x); });
    }
  }
}

TEST_CASE("lowp gelu, swiglu and add") {
  using G = GeluArgs;
  using S = SwigluArgs;
  using SB = SwigluBwdArgs;
  using Ad = AddArgs;
  G g;
  g.out = randn({B, T, C}, 60);
  g.inp = randn({B, T, C}, 61, 3.0);
  g.dout = randn({B, T, C}, 62);
  S s;
  s.out = randn({B, T, 6}, 63);
  s.inp = randn({B, T, 12}, 64, 2.0);
  SB sb;
  sb.dinp = randn({B, T, 12}, 65);
  sb.dout = randn({B, T, 6}, 66);
  sb.inp = s.inp;
  Ad sep;
  sep.out = randn({B, T, C}, 67);
  sep.a = randn({B, T, C}, 68);
  sep.b = randn({B, T, C}, 69);
  Ad out_a = sep, out_b = sep;
  out_a.out = out_a.a;
  out_b.out = out_b.b;
  for (DType dt : kLowp) {
    check_lowp(g, dt, {DS_F(G, out), DS_F(G, inp)}, {}, [](const G& x) { ops::gelu_forward(x); });
    check_lowp(g, dt, {DS_F(G, out), DS_F(G, inp), DS_F(G, dout)}, {},
               [](const G& x) { ops::gelu_backward(x); });
    check_lowp(s, dt, {DS_F(S, out), DS_F(S, inp)}, {}, [](const S& x) { ops::swiglu_forward(x); });
    check_lowp(sb, dt, {DS_F(SB, dinp), DS_F(SB, dout), DS_F(SB, inp)}, {},
               [](const SB& x) { ops::swiglu_backward(x); });
    for (const Ad& a : {sep, out_a, out_b})
      check_lowp(a, dt, {DS_F(Ad, out), DS_F(Ad, a), DS_F(Ad, b)}, {}, [](const Ad& x) { ops::add(x); });
    // bf16 activations plus an f32 residual stream (out aliases the f32 b).
    check_lowp(out_b, dt, {DS_F(Ad, a)}, {DS_F(Ad, b)}, [](const Ad& x) { ops::add(x); });
  }
}

namespace {

Tensor padded_logits(uint64_t seed) {
  Tensor l = randn({N, Vp}, seed, 3.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) l.data<float>()[n * Vp + j] = 50.f;  // padding
  return l;
}

Tensor ce_targets() { return tokens_tensor({N}, {3, -1, 36, 0, 12, 5, 24, 35, -100, 20}); }

}  // namespace

TEST_CASE("lowp cross-entropy: separate, aliased and absent dlogits") {
  using CE = CrossEntropyArgs;
  CE a;
  a.losses = Tensor::empty({N}, DType::F32);
  a.dlogits = randn({N, Vp}, 70);
  a.logits = padded_logits(71);
  a.targets = ce_targets();
  a.V = V;
  a.dloss = 1.f / 7;
  CE alias = a, loss_only = a;
  alias.dlogits = alias.logits;
  loss_only.dlogits = Tensor();
  const auto op = [](const CE& x) { ops::cross_entropy(x); };
  for (DType dt : kLowp)
    for (const CE& c : {a, alias, loss_only})
      check_lowp(c, dt, {DS_F(CE, dlogits), DS_F(CE, logits)}, {DS_F(CE, losses)}, op);
}

TEST_CASE("lowp vocab-parallel cross-entropy, all three phases") {
  using VP = VocabParallelCEArgs;
  for (int64_t vstart : {int64_t{0}, int64_t{20}}) {
    VP a;
    a.logits = vstart ? randn({N, 20}, 80, 3.0) : padded_logits(80);
    a.targets = ce_targets();
    a.rowmax = Tensor::empty({N}, DType::F32);
    a.stats = Tensor::empty({2, N}, DType::F32);
    a.losses = Tensor::empty({N}, DType::F32);
    a.dlogits = a.logits;  // in place, as the trainer does
    a.vocab_start = vstart;
    a.V = V;
    a.dloss = 0.25f;
    VP sep = a;
    sep.dlogits = randn(a.logits.shape(), 81);
    const auto op = [](const VP& x) {  // one shard: no all-reduces in between
      VP p = x;
      for (VocabCEPhase ph : {VocabCEPhase::Max, VocabCEPhase::Stats, VocabCEPhase::Finish}) {
        p.phase = ph;
        ops::vocab_parallel_cross_entropy(p);
      }
    };
    for (DType dt : kLowp)
      for (const VP& c : {a, sep}) {
        INFO("vocab_start " << vstart << " in place " << (c.dlogits.raw() == c.logits.raw()));
        check_lowp(c, dt, {DS_F(VP, logits), DS_F(VP, dlogits)},
                   {DS_F(VP, rowmax), DS_F(VP, stats), DS_F(VP, losses)}, op);
      }
  }
}

TEST_CASE("lowp adamw: bf16/f16 grad and param_lowp, f32 master state") {
  using AW = AdamWArgs;
  const int64_t n = 3 * 4096 + 11;
  AW a;
  a.param = randn({n}, 90);
  a.grad = randn({n}, 91, 0.1);
  a.m = randn({n}, 92, 0.01);
  a.v = randn({n}, 93, 0.01);
  for (int64_t i = 0; i < n; ++i) a.v.data<float>()[i] = std::fabs(a.v.data<float>()[i]);
  a.param_lowp = randn({n}, 94);
  a.lr = 1e-2f, a.weight_decay = 0.1f, a.grad_scale = 0.5f, a.step = 3;
  const auto op = [](const AW& x) { ops::adamw_step(x); };
  for (DType dt : kLowp) {
    check_lowp(a, dt, {DS_F(AW, grad), DS_F(AW, param_lowp)}, {DS_F(AW, param), DS_F(AW, m), DS_F(AW, v)}, op);
    check_lowp(a, dt, {DS_F(AW, param_lowp)}, {DS_F(AW, param), DS_F(AW, m), DS_F(AW, v)}, op);  // f32 grad
    check_lowp(a, dt, {DS_F(AW, grad)}, {DS_F(AW, param), DS_F(AW, m), DS_F(AW, v)}, op);  // no param_lowp
    AW sr = a;  // stochastic rounding into a bf16 param_lowp stays the kernel's own
    sr.param_lowp = Tensor::zeros({n}, DType::BF16);
    sr.sr_seed = 12345;
    check_lowp(sr, dt, {DS_F(AW, grad)}, {DS_F(AW, param), DS_F(AW, m), DS_F(AW, v), DS_F(AW, param_lowp)}, op);
  }
  AW bad = a;  // master state stays f32
  bad.m = to_dtype(a.m, DType::BF16);
  REQUIRE_THROWS(ops::adamw_step(bad));
}

TEST_CASE("lowp sum_squares, scale, and thread-count independence") {
  using SS = SumSquaresArgs;
  using Sc = ScaleArgs;
  const int64_t n = 3 * 4096 + 5;
  SS s;
  s.out = full({1}, 0.5f);  // +=
  s.x = randn({n}, 100, 2.0);
  Sc sc;
  sc.x = randn({n}, 101, 3.0);
  sc.s = 0.37f;
  for (DType dt : kLowp) {
    check_lowp(s, dt, {DS_F(SS, x)}, {DS_F(SS, out)}, [](const SS& x) { ops::sum_squares(x); });
    check_lowp(sc, dt, {DS_F(Sc, x)}, {}, [](const Sc& x) { ops::scale(x); });
    GeluArgs g;
    g.inp = to_dtype(randn({n}, 102, 3.0), dt);
    g.dout = to_dtype(randn({n}, 103), dt);
    Tensor o1 = Tensor::zeros({n}, dt), o3 = Tensor::zeros({n}, dt);
    g.out = o1;
    with_threads(1, [&] { ops::gelu_backward(g); });
    g.out = o3;
    with_threads(3, [&] { ops::gelu_backward(g); });
    CHECK(bit_equal(o1, o3));
  }
}

TEST_CASE("lowp nonfinite_check finds inf and nan in bf16/f16 tensors") {
  using NF = NonFiniteArgs;
  NF a;
  a.flag = full({1}, 0.f);
  a.x = randn({B, T, C}, 110);
  for (DType dt : kLowp) {
    check_lowp(a, dt, {DS_F(NF, x)}, {DS_F(NF, flag)}, [](const NF& x) { ops::nonfinite_check(x); });
    const uint16_t inf = dt == DType::BF16 ? 0x7f80 : 0x7c00;
    const uint16_t nan = dt == DType::BF16 ? 0x7fc0 : 0x7e00;
    const uint16_t max_finite = dt == DType::BF16 ? 0x7f7f : 0x7bff;
    const std::pair<uint16_t, float> cases[] = {{max_finite, 0.f}, {inf, 1.f}, {0x8000 | inf, 1.f},
                                                {nan, 1.f}};
    for (const auto& [bits, want] : cases) {
      INFO(dtype_name(dt) << " bits 0x" << std::hex << bits);
      NF c;
      c.flag = full({1}, 0.f);
      c.x = to_dtype(a.x, dt);
      c.x.data<uint16_t>()[37] = bits;
      const Tensor before = c.x.clone();
      ops::nonfinite_check(c);
      CHECK(c.flag.data<float>()[0] == want);
      CHECK(bit_equal(c.x, before));  // an input: left as it was
    }
  }
}

TEST_CASE("lowp cast converts every float dtype pair natively") {
  const DType all[] = {DType::F32, DType::BF16, DType::F16};
  const Tensor src32 = randn({3, 4099}, 120, 100.0);
  auto value = [](const Tensor& t, int64_t i) -> float {
    if (t.dtype() == DType::F32) return t.data<float>()[i];
    const uint16_t h = t.data<uint16_t>()[i];
    return t.dtype() == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  };
  auto round_to = [](float f, DType dt) -> float {
    if (dt == DType::F32) return f;
    return dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(f)) : f16_to_f32(f32_to_f16(f));
  };
  for (DType din : all)
    for (DType dout : all) {
      INFO(dtype_name(din) << " -> " << dtype_name(dout));
      CastArgs to_in;
      to_in.inp = src32;
      to_in.out = Tensor::empty(src32.shape(), din);
      ops::cast(to_in);
      CastArgs c;
      c.inp = to_in.out;
      c.out = Tensor::empty(src32.shape(), dout);
      ops::cast(c);
      int64_t bad = 0;
      for (int64_t i = 0; i < src32.numel(); ++i) {
        const float want = round_to(value(c.inp, i), dout), got = value(c.out, i);
        bad += std::memcmp(&want, &got, sizeof(float)) != 0;
      }
      CHECK(bad == 0);
    }
  // An in-place bf16 -> f16 conversion reaches cast's own check (emulation
  // would have rejected the two dtypes' overlap first).
  Tensor buf = to_dtype(src32, DType::BF16);
  CastArgs ip;
  ip.inp = buf;
  ip.out = Tensor::from_blob(buf.raw(), buf.shape(), DType::F16);
  REQUIRE_THROWS_WITH(ops::cast(ip), Catch::Contains("in-place conversion"));
}

TEST_CASE("lowp fields that overlap without being identical are an error") {
  Tensor buf = Tensor::zeros({30}, DType::BF16);
  AddArgs a;
  a.out = buf.view(0, {10});
  a.a = buf.view(4, {10});  // overlaps out by 6 elements
  a.b = Tensor::zeros({10}, DType::BF16);
  REQUIRE_THROWS_WITH(ops::add(a), Catch::Contains("overlap"));
  a.a = buf.view(10, {10});  // adjacent, not overlapping: fine
  REQUIRE_NOTHROW(ops::add(a));
  a.a = buf.view(0, {2, 5});  // same memory, other shape: an alias
  REQUIRE_NOTHROW(ops::add(a));
  RopeArgs r;  // same address, different numel
  r.inp = Tensor::zeros({1, 2, 3 * 4}, DType::F16);
  r.out = Tensor::from_blob(r.inp.raw(), {1, 1, 3 * 4}, DType::F16);
  r.NH = 1;
  REQUIRE_THROWS_WITH(ops::rope_forward(r), Catch::Contains("overlap"));
}

TEST_CASE("lowp emulation leaves integer dtypes to the kernel's checks") {
  MatmulArgs f;
  f.inp = to_dtype(randn({4, 5}, 1), DType::BF16);
  f.weight = Tensor::zeros({3, 5}, DType::I32);
  f.out = Tensor::empty({4, 3}, DType::BF16);
  REQUIRE_THROWS_WITH(ops::matmul_forward(f), Catch::Contains("expected f32"));
}

// Cost of the dispatcher's dtype scan on the f32 fast path: ops:: vs the CPU
// kernel called directly, on a tiny tensor. Run with: test_cpu_ops_lowp "[bench]"
TEST_CASE("lowp fast-path overhead", "[.][bench]") {
  Tensor x = full({8}, 1.f);
  MatmulBwdArgs mb;  // the widest args struct: 6 tensors
  mb.dinp = full({1, 1}, 0.f), mb.dweight = full({1, 1}, 0.f), mb.dbias = full({1}, 0.f);
  mb.dout = full({1, 1}, 1.f), mb.inp = full({1, 1}, 1.f), mb.weight = full({1, 1}, 1.f);
  auto time_ns = [](int iters, const std::function<void()>& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
               .count() / iters;
  };
  ScaleArgs s;
  s.x = x;
  s.s = 1.f;
  const int iters = 2000000;
  for (int rep = 0; rep < 2; ++rep) {
    const double direct = time_ns(iters, [&] { cpu::scale(s, Stream{}); });
    const double via = time_ns(iters, [&] { ops::scale(s); });
    const double mb_direct = time_ns(iters / 4, [&] { cpu::matmul_backward(mb, Stream{}); });
    const double mb_via = time_ns(iters / 4, [&] { ops::matmul_backward(mb); });
    WARN("scale: direct " << direct << " ns, via ops " << via << " ns; matmul_backward 1x1: direct "
                          << mb_direct << " ns, via ops " << mb_via << " ns");
  }
}
