// GPU tests of the vocab-parallel cross-entropy phases, of the embedding
// forward / wpe backward and of the column reduction (the matmul bias
// gradient, the long-row norm parameter gradients) on both of their paths:
// 16-byte vectors (row width a multiple of the vector width, every pointer
// aligned) and element by element (odd widths, views at odd offsets into a
// larger buffer, fields at different alignment phases). Each is compared
// with the CPU op in f32, bf16 and f16 (check_cuda_vs_cpu_offsets), and the
// paths that promise the same bits are compared byte for byte. Skipped
// (exit 77) when no device is present.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lib/ops/ops.h"
#include "test/cuda/norm_stats.h"
#include "test/ops_harness/op_case_cuda.h"

using namespace ds;
using namespace ds::test;

namespace {

const DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

Tensor zeros_f32(const Shape& s) { return Tensor::zeros(s, DType::F32); }

// A copy of the device tensor `t` as a view `off` elements into a larger
// buffer (off 1: no longer 16-byte aligned).
Tensor at_offset(const Tensor& t, int64_t off) {
  Tensor big = Tensor::zeros({t.numel() + off}, t.dtype(), Device::cuda(0));
  Tensor v = big.view(off, t.shape());
  v.copy_from(t);
  return v;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// One rank's shard of the padded vocab: Vl local columns from vocab_start,
// real = the local columns below V.
struct Shard {
  const char* what;
  int64_t Vl, vocab_start, V;
};
// Vl 1024: vectors (953 real: the last real vector masked inside; 1024 real:
// no padding; 0 real: a rank that holds only padding); Vl 1001: element by
// element.
const Shard kShards[] = {{"all real", 1024, 0, 3001},
                         {"953 real, padding inside a vector", 1024, 2048, 3001},
                         {"only padding", 1024, 3072, 3001},
                         {"odd width", 1001, 1001, 1900}};

int64_t real_of(const Shard& sh) { return std::clamp<int64_t>(sh.V - sh.vocab_start, 0, sh.Vl); }

// Targets over the whole vocab (most owned by other ranks), some ignored.
Tensor shard_targets(int64_t N, const Shard& sh) {
  Tensor t = randint({N}, 201, 0, int(sh.V));
  t.data<int32_t>()[2] = -1;
  t.data<int32_t>()[5] = -100;
  // Make sure some rows target this shard's real columns when it has any.
  const int64_t real = real_of(sh);
  if (real > 0)
    for (int64_t n = 0; n < N; n += 4) t.data<int32_t>()[n] = int32_t(sh.vocab_start + (n * 37) % real);
  return t;
}

// The statistics a phase reads, as the all-reduces would leave them: rowmax
// the max of this shard's real columns (or a finite value from another rank
// when it has none), stats[0] this shard's sum of exp plus another rank's
// part, stats[1] a target logit.
void shard_stats(const Tensor& logits, const Shard& sh, Tensor& rowmax, Tensor& stats) {
  const int64_t N = logits.size(0), real = real_of(sh);
  rowmax = Tensor::empty({N}, DType::F32);
  stats = Tensor::empty({2, N}, DType::F32);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits.data<float>() + n * sh.Vl;
    float m = 2.5f;
    for (int64_t j = 0; j < real; ++j) m = std::max(m, x[j]);
    double s = 0;
    for (int64_t j = 0; j < real; ++j) s += std::exp(double(x[j]) - m);
    rowmax.data<float>()[n] = m;
    stats.data<float>()[n] = float(s + 3.7);
    stats.data<float>()[N + n] = 1.25f;
  }
}

}  // namespace

TEST_CASE("cuda vocab-parallel cross-entropy phases, vector and scalar paths") {
  if (!gpu_or_skip()) return;
  const int64_t N = 19;
  const auto vpce = ops::vocab_parallel_cross_entropy;
  for (const Shard& sh : kShards)
    for (DType dt : kAllTypes) {
      INFO(sh.what << ": Vl " << sh.Vl << " from " << sh.vocab_start << ", V " << sh.V);
      const Tensor logits = randn({N, sh.Vl}, 202, 3.0f), targets = shard_targets(N, sh);
      Tensor rowmax, stats;
      shard_stats(logits, sh, rowmax, stats);
      VocabParallelCEArgs a;  // phase by phase below
      a.logits = logits;
      a.targets = targets;
      a.vocab_start = sh.vocab_start;
      a.V = sh.V;
      a.dloss = 1.0f / 17;
      a.phase = VocabCEPhase::Max;
      a.rowmax = zeros_f32({N});
      if (real_of(sh) > 0) {
        check_cuda_vs_cpu_offsets(make_case("vocab_parallel_cross_entropy (max)", a, vpce), dt);
      } else {  // rowmax -inf on every row (the comparison takes finite values only)
        VocabParallelCEArgs d = a;
        d.logits = upload(logits, dt);
        d.targets = targets.to(Device::cuda(0));
        d.rowmax = Tensor::zeros({N}, DType::F32, Device::cuda(0));
        ops::vocab_parallel_cross_entropy(d);
        const Tensor m = d.rowmax.to(Device::cpu());
        for (int64_t n = 0; n < N; ++n) CHECK(m.data<float>()[n] == -std::numeric_limits<float>::infinity());
      }
      a.phase = VocabCEPhase::Stats;
      a.rowmax = rowmax;
      a.stats = zeros_f32({2, N});
      check_cuda_vs_cpu_offsets(make_case("vocab_parallel_cross_entropy (stats)", a, vpce), dt);
      a.phase = VocabCEPhase::Finish;
      a.stats = stats;
      a.losses = zeros_f32({N});
      for (bool grad : {false, true}) {
        a.dlogits = grad ? zeros_f32({N, sh.Vl}) : Tensor{};
        check_cuda_vs_cpu_offsets(make_case("vocab_parallel_cross_entropy (finish)", a, vpce), dt);
      }
    }
}

// The max and the finish phase give the same bytes on the vector path, on
// the scalar path (logits and dlogits at offset 1) and in place (dlogits =
// logits, as the model calls it).
TEST_CASE("cuda vocab-parallel cross-entropy: max and finish bits do not depend on the path") {
  if (!gpu_or_skip()) return;
  const int64_t N = 11;
  const Shard sh = kShards[1];
  const Tensor host = randn({N, sh.Vl}, 211, 3.0f), tgt = shard_targets(N, sh);
  Tensor hmax, hstats;
  shard_stats(host, sh, hmax, hstats);
  const Tensor targets = tgt.to(Device::cuda(0));
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    INFO(dtype_name(dt));
    const Tensor logits = upload(host, dt), logits1 = at_offset(logits, 1);
    const Tensor stats = hstats.to(Device::cuda(0));
    auto call = [&](VocabCEPhase ph, const Tensor& x, const Tensor& rowmax, const Tensor& dlogits,
                    const Tensor& losses) {
      ops::vocab_parallel_cross_entropy(VocabParallelCEArgs{.phase = ph, .logits = x, .targets = targets,
                                                            .rowmax = rowmax, .stats = stats,
                                                            .losses = losses, .dlogits = dlogits,
                                                            .vocab_start = sh.vocab_start, .V = sh.V,
                                                            .dloss = 0.5f});
    };
    Tensor mv = Tensor::zeros({N}, DType::F32, Device::cuda(0)), ms = mv.clone();
    call(VocabCEPhase::Max, logits, mv, Tensor{}, Tensor{});
    call(VocabCEPhase::Max, logits1, ms, Tensor{}, Tensor{});
    CHECK(same_bytes(mv, ms));
    const Tensor rowmax = hmax.to(Device::cuda(0));
    Tensor dv = Tensor::zeros({N, sh.Vl}, dt, Device::cuda(0)), dsc = at_offset(dv, 1);
    Tensor lv = Tensor::zeros({N}, DType::F32, Device::cuda(0)), ls = lv.clone(), li = lv.clone();
    call(VocabCEPhase::Finish, logits, rowmax, dv, lv);
    call(VocabCEPhase::Finish, logits1, rowmax, dsc, ls);
    Tensor inplace = at_offset(logits, 0);
    call(VocabCEPhase::Finish, inplace, rowmax, inplace, li);
    CHECK(same_bytes(dv, dsc));
    CHECK(same_bytes(dv, inplace));
    CHECK(same_bytes(lv, ls));
    CHECK(same_bytes(lv, li));
    CHECK_FALSE(same_bytes(dv, Tensor::zeros({N, sh.Vl}, dt, Device::cuda(0))));  // the op did write
  }
}

// Embedding forward at C 291 (odd: element by element in every dtype), 12
// (vectors in f32 only) and 768 (vectors), with and without wpe, wte/wpe in
// the compute dtype or f32 (mixed precision: a wider table than out), at the
// harness's offsets; and the wpe backward at the same widths.
TEST_CASE("cuda embedding forward and wpe backward, vector and scalar paths") {
  if (!gpu_or_skip()) return;
  const int64_t B = 2, T = 37, V = 70, maxT = 48, vs = 10, off = 5;
  const Tensor tokens = randint({B, T}, 221, 0, 90);  // some outside this rank's rows [10, 80)
  for (int64_t C : {291, 12, 768})
    for (DType dt : kAllTypes)
      for (bool f32_tables : {false, true}) {
        if (f32_tables && dt == DType::F32) continue;
        INFO("C " << C << (f32_tables ? " f32 tables" : ""));
        for (bool with_wpe : {true, false}) {
          const EmbeddingArgs f{.out = zeros_f32({B, T, C}), .tokens = tokens, .wte = randn({V, C}, 222),
                                .wpe = with_wpe ? randn({maxT, C}, 223) : Tensor{}, .vocab_start = vs,
                                .pos_offset = off};
          OpCase c = make_case("embedding_forward", f, ops::embedding_forward);
          if (f32_tables) {
            set_kind(c, {"wte"}, Kind::F32);
            if (with_wpe) set_kind(c, {"wpe"}, Kind::F32);
          }
          check_cuda_vs_cpu_offsets(c, dt);
        }
        EmbeddingBwdArgs b{.dwte = randn({V, C}, 224), .dwpe = randn({maxT, C}, 225), .dout = randn({B, T, C}, 226),
                           .tokens = tokens, .vocab_start = vs, .pos_offset = off};
        OpCase c = make_case("embedding_backward", b, ops::embedding_backward);
        if (f32_tables) set_kind(c, {"dwte", "dwpe"}, Kind::F32);
        check_cuda_vs_cpu_offsets(c, dt);
      }
}

// The embedding forward and the wpe backward give the same bytes whether
// they run on vectors or element by element (one table at offset 1).
TEST_CASE("cuda embedding forward and wpe backward bits do not depend on the path") {
  if (!gpu_or_skip()) return;
  const int64_t B = 3, T = 40, C = 256, V = 90, maxT = 64, pos_offset = 7;
  const Tensor tokens = upload(randint({B, T}, 231, 0, 100), DType::F32);
  const Tensor hwte = randn({V, C}, 232), hwpe = randn({maxT, C}, 233), hdout = randn({B, T, C}, 234);
  for (DType dt : kAllTypes)
    for (int k = 0; k < (dt == DType::F32 ? 1 : 2); ++k) {
      const DType table = k == 0 ? dt : DType::F32;  // tables in the compute dtype, then f32
      INFO(dtype_name(dt) << " activations, " << dtype_name(table) << " tables");
      const Tensor wte = upload(hwte, table), wpe = upload(hwpe, table);
      auto forward = [&](const Tensor& w, const Tensor& p) {
        Tensor out = Tensor::zeros({B, T, C}, dt, Device::cuda(0));
        ops::embedding_forward(EmbeddingArgs{.out = out, .tokens = tokens, .wte = w, .wpe = p,
                                             .vocab_start = 5, .pos_offset = pos_offset});
        return out;
      };
      const Tensor vec = forward(wte, wpe);
      CHECK(same_bytes(vec, forward(at_offset(wte, 1), wpe)));
      CHECK(same_bytes(vec, forward(wte, at_offset(wpe, 1))));
      CHECK_FALSE(same_bytes(vec, Tensor::zeros({B, T, C}, dt, Device::cuda(0))));
      const Tensor dout = upload(hdout, dt);
      auto backward = [&](int64_t offset) {
        Tensor dwpe = at_offset(wpe, offset);
        ops::embedding_backward(EmbeddingBwdArgs{.dwte = Tensor::zeros({V, C}, table, Device::cuda(0)),
                                                 .dwpe = dwpe, .dout = dout, .tokens = tokens,
                                                 .vocab_start = 5, .pos_offset = pos_offset});
        return dwpe;
      };
      const Tensor dv = backward(0);
      CHECK(same_bytes(dv, backward(1)));
      CHECK_FALSE(same_bytes(dv, wpe));
    }
}

namespace {

// matmul_backward asked for dbias only: the column reduction alone.
MatmulBwdArgs bias_grad_args(int64_t N, int64_t OC, uint64_t seed) {
  const int64_t C = 5;
  return MatmulBwdArgs{.dinp = Tensor{}, .dweight = Tensor{}, .dbias = randn({OC}, seed),
                       .dout = randn({N, OC}, seed + 1), .inp = randn({N, C}, seed + 2),
                       .weight = randn({OC, C}, seed + 3)};
}

}  // namespace

// The column reduction (cuda/core/reduce.cuh) through the matmul bias
// gradient. OC 768: 16-byte vectors in every dtype (3 blocks of 256 bf16
// columns); 264: vectors, the last block one vector wide; 12: vectors in f32
// only (one block, 3 of its 32 threads busy); 45: element by element. N 300
// splits the rows into 2 chunks of 150, N 7 leaves most row lanes idle. dbias
// in the compute dtype and in f32, at the harness's offsets (1 and 3: the
// scalar path; 8: vectors again).
TEST_CASE("cuda matmul bias gradient (column reduction), vector and scalar paths") {
  if (!gpu_or_skip()) return;
  for (int64_t N : {300, 7})
    for (int64_t OC : {768, 264, 12, 45})
      for (DType dt : kAllTypes)
        for (bool f32_dbias : {false, true}) {
          if (f32_dbias && dt == DType::F32) continue;
          INFO("N " << N << " OC " << OC << (f32_dbias ? " f32 dbias" : ""));
          OpCase c = make_case("matmul_backward (dbias only)", bias_grad_args(N, OC, 241), ops::matmul_backward);
          if (f32_dbias) set_kind(c, {"dbias"}, Kind::F32);
          check_cuda_vs_cpu_offsets(c, dt);
        }
}

// LayerNorm and RMSNorm backward with rows longer than the one-pass kernel
// holds (8192): the parameter gradients go through the column reduction.
// C 8200 takes its vectors (a multiple of 8), 8201 goes element by element;
// 300 rows make 2 chunks.
TEST_CASE("cuda norm backward, long rows: column reduction on vector and scalar paths") {
  if (!gpu_or_skip()) return;
  const int64_t N = 300;
  for (int64_t C : {8200, 8201}) {
    Tensor inp = randn({N, C}, 251, 1.5f), mean, rstd, rms_rstd;
    norm_stats(inp, mean, rstd, rms_rstd);
    for (DType dt : kAllTypes) {
      INFO("C " << C);
      OpCase ln = make_case("layernorm_backward (long rows)",
                            LayerNormBwdArgs{.dinp = randn({N, C}, 252), .dweight = randn({C}, 253),
                                             .dbias = randn({C}, 254), .dout = randn({N, C}, 255), .inp = inp,
                                             .weight = randn({C}, 256), .mean = mean, .rstd = rstd,
                                             .accum = Accum::Add},
                            ops::layernorm_backward);
      check_cuda_vs_cpu_offsets(set_kind(ln, {"mean", "rstd"}, Kind::F32), dt);
      OpCase rms = make_case("rmsnorm_backward (long rows)",
                             RMSNormBwdArgs{.dinp = randn({N, C}, 257), .dweight = randn({C}, 258),
                                            .dout = randn({N, C}, 259), .inp = inp, .weight = randn({C}, 260),
                                            .rstd = rms_rstd},
                             ops::rmsnorm_backward);
      check_cuda_vs_cpu_offsets(set_kind(rms, {"rstd"}, Kind::F32), dt);
      if (dt == DType::F32) continue;
      OpCase ln32 = make_case("layernorm_backward (long rows, f32 dweight/dbias only)",
                              LayerNormBwdArgs{.dinp = Tensor{}, .dweight = randn({C}, 253),
                                               .dbias = randn({C}, 254), .dout = randn({N, C}, 255), .inp = inp,
                                               .weight = randn({C}, 256), .mean = mean, .rstd = rstd},
                              ops::layernorm_backward);
      check_cuda_vs_cpu(set_kind(ln32, {"mean", "rstd", "dweight", "dbias"}, Kind::F32), dt, 8);
    }
  }
}

// Each column sums the same rows in the same order on both paths, so the
// bias gradient and the long-row norm parameter gradients have the same
// bytes whether dout/inp are read as vectors or element by element (at
// offset 1).
TEST_CASE("cuda column reduction: bias and norm parameter gradient bits do not depend on the path") {
  if (!gpu_or_skip()) return;
  const Device dev = Device::cuda(0);
  const int64_t N = 300, OC = 1032, C = 8200;
  const Tensor hdout = randn({N, OC}, 261), hx = randn({N, C}, 262, 1.5f), hg = randn({N, C}, 263);
  Tensor hmean, hrstd, hrms;
  norm_stats(hx, hmean, hrstd, hrms);
  const Tensor mean = hmean.to(dev), rstd = hrstd.to(dev), rms = hrms.to(dev);
  const Tensor init = randn({C}, 264), binit = randn({OC}, 266);  // gradients accumulate onto them
  for (DType dt : kAllTypes)
    for (int k = 0; k < (dt == DType::F32 ? 1 : 2); ++k) {
      const DType gdt = k == 0 ? dt : DType::F32;  // gradients in the compute dtype, then f32
      INFO(dtype_name(dt) << " activations, " << dtype_name(gdt) << " gradients");
      const Tensor dout = upload(hdout, dt), inp = Tensor::zeros({N, 5}, dt, dev),
                   w = Tensor::zeros({OC, 5}, dt, dev);
      auto bias = [&](const Tensor& g) {
        Tensor db = upload(binit, gdt);
        ops::matmul_backward(
            MatmulBwdArgs{.dinp = Tensor{}, .dweight = Tensor{}, .dbias = db, .dout = g, .inp = inp, .weight = w});
        return db;
      };
      const Tensor bv = bias(dout);
      CHECK(same_bytes(bv, bias(at_offset(dout, 1))));
      CHECK_FALSE(same_bytes(bv, upload(binit, gdt)));
      const Tensor x = upload(hx, dt), g = upload(hg, dt), nw = upload(randn({C}, 265), dt);
      auto layernorm = [&](const Tensor& xx, const Tensor& gg) {
        Tensor dw = upload(init, gdt), db = upload(init, gdt);
        ops::layernorm_backward(LayerNormBwdArgs{.dinp = Tensor{}, .dweight = dw, .dbias = db, .dout = gg,
                                                 .inp = xx, .weight = nw, .mean = mean, .rstd = rstd});
        return std::pair{dw, db};
      };
      const auto [lw, lb] = layernorm(x, g);
      const auto [lw1, lb1] = layernorm(at_offset(x, 1), at_offset(g, 1));
      CHECK(same_bytes(lw, lw1));
      CHECK(same_bytes(lb, lb1));
      CHECK_FALSE(same_bytes(lw, upload(init, gdt)));
      auto rmsnorm = [&](const Tensor& xx, const Tensor& gg) {
        Tensor dw = upload(init, gdt);
        ops::rmsnorm_backward(
            RMSNormBwdArgs{.dinp = Tensor{}, .dweight = dw, .dout = gg, .inp = xx, .weight = nw, .rstd = rms});
        return dw;
      };
      const Tensor rv = rmsnorm(x, g);
      CHECK(same_bytes(rv, rmsnorm(at_offset(x, 1), at_offset(g, 1))));
      CHECK_FALSE(same_bytes(rv, upload(init, gdt)));
    }
}
