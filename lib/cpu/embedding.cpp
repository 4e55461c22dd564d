// Token + learned-position embedding on the CPU, forward and backward.
// Vocab-parallel: a rank holds rows [vocab_start, vocab_start + Vlocal) of wte;
// tokens outside contribute zeros and receive no gradient. The backward splits
// work over channel slices so each gradient element is summed by one thread in
// token order (deterministic for any thread count). The forward also reads
// bf16 tables as they are (lowp::embedding_forward): generation embeds a few
// tokens per step, and the emulation would upcast the whole tables each time.
#include <cstring>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {
namespace {

struct EmbedDims {
  int64_t B, T, C, V, maxT;
};

// Dimensions of a validated call (lib/ops/op_validate.cpp).
EmbedDims embed_dims(const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  return {tokens.size(0), tokens.size(1), wte.size(1), wte.size(0),
          wpe.defined() ? wpe.size(0) : 0};
}

// The wpe row of position t of sample b: row_offset + pos_offset + t, or
// pad_row for a padding position (lengths, pad_row >= 0); a real position
// moved by the sample's shift (shifts).
template <class A>
int64_t wpe_row(const A& a, int64_t b, int64_t t) {
  const bool pad = a.lengths.defined() && a.pos_offset + t >= a.lengths.template data<int32_t>()[b];
  if (pad && a.pad_row >= 0) return a.pad_row;
  const int64_t shift = a.shifts.defined() && !pad ? a.shifts.template data<int32_t>()[b] : 0;
  return a.row_offset + a.pos_offset + shift + t;
}

}  // namespace

namespace {

// T: float, or uint16_t for bf16 tables and output read as they are (the
// rows' exact upcasts added in f32 and rounded once: what the emulated f32
// kernel gives, without upcasting the whole tables for a few rows).
template <class T>
void embedding_forward_impl(const EmbeddingArgs& a) {
  const EmbedDims d = embed_dims(a.tokens, a.wte, a.wpe);
  const int32_t* tokens = a.tokens.data<int32_t>();  // (B, T)
  const T* wte = a.wte.data<T>();                    // (V, C)
  const T* wpe = a.wpe.defined() ? a.wpe.data<T>() : nullptr;  // (maxT, C)
  T* out = a.out.data<T>();                          // (B, T, C)
  const int64_t C = d.C;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < d.B * d.T; ++n) {
    const int64_t t = n % d.T;
    const int64_t row = static_cast<int64_t>(tokens[n]) - a.vocab_start;
    const bool local = row >= 0 && row < d.V;
    const T* w = local ? wte + row * C : nullptr;
    const T* p = wpe ? wpe + wpe_row(a, n / d.T, t) * C : nullptr;
    T* o = out + n * C;
    if (w && p) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) store(o + c, load(w[c]) + load(p[c]));
    } else if (w) {
      std::memcpy(o, w, C * sizeof(T));
    } else if (p) {
      std::memcpy(o, p, C * sizeof(T));
    } else {
      std::memset(o, 0, C * sizeof(T));
    }
  }
}

}  // namespace

void embedding_forward(const EmbeddingArgs& a, const Stream&) { embedding_forward_impl<float>(a); }

bool lowp::embedding_forward(const EmbeddingArgs& a, const Stream&) {
  if (!all_bf16({&a.wte, &a.out}) || (a.wpe.defined() && a.wpe.dtype() != DType::BF16)) return false;
  embedding_forward_impl<uint16_t>(a);
  return true;
}

void embedding_backward(const EmbeddingBwdArgs& a, const Stream&) {
  const EmbedDims d = embed_dims(a.tokens, a.dwte, a.dwpe);
  const int32_t* tokens = a.tokens.data<int32_t>();  // (B, T)
  const float* dout = a.dout.data<float>();          // (B, T, C)
  float* dwte = a.dwte.data<float>();                // (V, C)
  float* dwpe = a.dwpe.defined() ? a.dwpe.data<float>() : nullptr;  // (maxT, C)
  const int64_t C = d.C, N = d.B * d.T;
  // Channel slices of 16: every element of dwte/dwpe is owned by one slice.
  constexpr int64_t kSlice = 16;
  const int64_t nslices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < nslices; ++s) {
    const int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = static_cast<int64_t>(tokens[n]) - a.vocab_start;
      if (row < 0 || row >= d.V) continue;
      const float* g = dout + n * C;
      float* w = dwte + row * C;
      for (int64_t c = c0; c < c1; ++c) w[c] += g[c];
    }
    if (!dwpe) continue;
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t t = 0; t < d.T; ++t) {
        const float* g = dout + (b * d.T + t) * C;
        float* p = dwpe + wpe_row(a, b, t) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

}  // namespace ds::cpu
