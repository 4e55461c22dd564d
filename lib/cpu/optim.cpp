// Optimizer-side ops on the CPU: AdamW step (its per-step values by value or
// from a step-scalars block in host memory), the step's gate (gate_step on
// the block), sum of squares (gradient norm), non-finite detection, in-place
// scaling and dtype casts.
// sum_squares reduces fixed-size chunks in double and combines them in chunk
// order, so the result is bit-identical for any thread count.
// AdamW with sr_seed != 0 rounds a bf16 param_lowp stochastically with the
// same hash as cuda/ops/adamw.cu, so both backends write the same bits.
#include <cmath>
#include <cstring>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

// Writes n floats from `src` into `dst` of dtype `dt` (f32, bf16 or f16).
void store_cast(void* dst, DType dt, const float* src, int64_t b, int64_t e) {
  if (dt == DType::F32) {
    std::memcpy(static_cast<float*>(dst) + b, src + b, (e - b) * sizeof(float));
  } else if (dt == DType::BF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = b; i < e; ++i) d[i] = f32_to_bf16(src[i]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = b; i < e; ++i) d[i] = f32_to_f16(src[i]);
  }
}

void load_cast(float* dst, const void* src, DType dt, int64_t b, int64_t e) {
  if (dt == DType::F32) {
    std::memcpy(dst + b, static_cast<const float*>(src) + b, (e - b) * sizeof(float));
  } else if (dt == DType::BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = b; i < e; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = b; i < e; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

// splitmix64 finalizer of (seed, index): 16 random bits. Must stay identical
// to sr_bits in cuda/ops/adamw.cu (test_cuda_ops compares the two).
inline uint32_t sr_bits(uint64_t seed, uint64_t i) {
  uint64_t x = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x >> 48);
}

// f32 -> bf16 rounding up with probability (dropped bits) / 2^16: random low
// bits are added to the bit pattern before truncation. NaN rounds to nearest;
// inf has zero low bits and stays inf.
// Hash index of element i is idx0 + i (its index in the whole op call).
void store_bf16_stochastic(uint16_t* dst, const float* src, uint64_t seed, int64_t idx0, int64_t b,
                           int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    if (std::isnan(src[i])) {
      dst[i] = f32_to_bf16(src[i]);
      continue;
    }
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    dst[i] = static_cast<uint16_t>((u + sr_bits(seed, static_cast<uint64_t>(idx0 + i))) >> 16);
  }
}

// The per-step values of one call: by value, or from its scalars block.
struct StepValues {
  AdamWTerms t;
  float grad_scale = 1;
};

// The update of elements [base, base + n) of the call with weight decay
// `weight_decay` (the call's, or 0). Chunks are counted from `base`, so a
// segment gives the same bits as a call on that segment alone.
void adamw_range(const AdamWArgs& a, const StepValues& sv, int64_t base, int64_t n, float weight_decay) {
  float* p = a.param.data<float>() + base;         // (n)
  const float* g = a.grad.data<float>() + base;    // (n)
  float* m = a.m.data<float>() + base;             // (n)
  float* v = a.v.data<float>() + base;             // (n)
  const float b1 = a.beta1, b2 = a.beta2, eps = a.eps, gs = sv.grad_scale;
  const float decay = sv.t.lr * weight_decay;
  const float step_size = sv.t.step_size;
  const float inv_sqrt_bc2 = sv.t.inv_sqrt_bc2;
  parallel_chunks(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i] * gs;
      const float mi = b1 * m[i] + (1.f - b1) * gi;
      const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float pi = p[i] - decay * p[i];
      p[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
    if (!a.param_lowp.defined()) return;
    const DType lt = a.param_lowp.dtype();
    if (a.sr_seed != 0 && lt == DType::BF16)
      store_bf16_stochastic(a.param_lowp.data<uint16_t>() + base, p, a.sr_seed, base, b, e);
    else
      store_cast(static_cast<char*>(a.param_lowp.raw()) + base * int64_t(dtype_size(lt)), lt, p, b, e);
  });
}

}  // namespace

void adamw_step(const AdamWArgs& a, const Stream&) {
  StepValues sv;
  if (a.scalars.defined()) {
    const float* s = a.scalars.data<float>();  // (AdamWSlot::Count)
    if (s[AdamWSlot::Skip] != 0.f) return;
    sv.t = {s[AdamWSlot::Lr], s[AdamWSlot::WeightDecay], s[AdamWSlot::StepSize], s[AdamWSlot::InvSqrtBc2]};
    sv.grad_scale = s[AdamWSlot::GradScale];
  } else {
    sv.t = adamw_terms(a.lr, a.weight_decay, a.beta1, a.beta2, a.step);
    sv.grad_scale = a.grad_scale;
  }
  if (!a.segments.defined()) {
    adamw_range(a, sv, 0, a.param.numel(), sv.t.weight_decay);
    return;
  }
  const int64_t* seg = a.segments.data<int64_t>();  // (S, 3) {begin, end, decay}
  for (int64_t s = 0; s < a.segments.size(0); ++s)
    adamw_range(a, sv, seg[3 * s], seg[3 * s + 1] - seg[3 * s], seg[3 * s + 2] ? sv.t.weight_decay : 0.f);
}

void step_gate(const StepGateArgs& a, const Stream&) {
  const float* st = a.stats.data<float>();  // (3) sum of squares, overflow flag, loss
  float* s = a.scalars.data<float>();  // (AdamWSlot::Count)
  const double loss_scale = a.scale_in_block ? static_cast<double>(s[AdamWSlot::LossScale]) : a.loss_scale;
  const StepGate g = gate_step(st[0], st[1], st[2], loss_scale, a.max_norm, a.rule);
  s[AdamWSlot::GradScale] = g.grad_scale;
  s[AdamWSlot::Skip] = g.skip ? 1.f : 0.f;
}

void sum_squares(const SumSquaresArgs& a, const Stream&) {
  const float* x = a.x.data<float>();  // (n)
  const int64_t n = a.x.numel(), nchunks = (n + kChunk - 1) / kChunk;
  double* part = thread_scratch_f64(static_cast<size_t>(nchunks));  // (nchunks)
  parallel_chunks(n, [x, part](int64_t b, int64_t e) {
    // By value and from 0: with the pointer read through the closure GCC
    // vectorised this loop as gathers (about 10x slower).
    const float* p = x + b;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < e - b; ++i) s += static_cast<double>(p[i]) * p[i];
    part[b / kChunk] = s;
  });
  double total = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) total += part[c];
  float* out = a.out.data<float>();
  out[0] = static_cast<float>(out[0] + total);
}

void nonfinite_check(const NonFiniteArgs& a, const Stream&) {
  const uint32_t* bits = a.x.data<uint32_t>();  // (n) f32 bit patterns
  const int64_t n = a.x.numel();
  int found = 0;
#pragma omp parallel for simd schedule(static) reduction(| : found)
  for (int64_t i = 0; i < n; ++i) found |= (bits[i] & 0x7f800000u) == 0x7f800000u;
  if (found) a.flag.data<float>()[0] = 1.f;
}

void scale(const ScaleArgs& a, const Stream&) {
  float* x = a.x.data<float>();  // (n)
  const float s = a.s;
  parallel_chunks(a.x.numel(), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) x[i] *= s;
  });
}

void cast(const CastArgs& a, const Stream&) {
  const char* op = "cast";
  const DType din = a.inp.dtype(), dout = a.out.dtype();
  const int64_t n = a.inp.numel();
  if (din == dout) {
    if (a.out.raw() != a.inp.raw()) std::memmove(a.out.raw(), a.inp.raw(), a.inp.nbytes());
    return;
  }
  DS_CHECK(a.out.raw() != a.inp.raw(), "{}: in-place conversion {} -> {} is not supported", op,
           dtype_name(din), dtype_name(dout));
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    if (din == DType::F32) {
      store_cast(a.out.raw(), dout, a.inp.data<float>(), b, e);
    } else if (dout == DType::F32) {
      load_cast(a.out.data<float>(), a.inp.raw(), din, b, e);
    } else {  // bf16 <-> f16 through f32
      const uint16_t* in = a.inp.data<uint16_t>();
      uint16_t* out = a.out.data<uint16_t>();
      for (int64_t i = b; i < e; ++i)
        out[i] = dout == DType::BF16 ? f32_to_bf16(f16_to_f32(in[i]))
                                     : f32_to_f16(bf16_to_f32(in[i]));
    }
  });
}

}  // namespace ds::cpu
