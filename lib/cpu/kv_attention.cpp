// Attention against a key/value cache (incremental decoding), CPU. First the
// k and v parts of the new qkv rows are stored at their positions in the
// cache, then every (sample, query row, head) attends to its cache prefix:
// scores in f32, softmax with the row maximum subtracted and the sum of
// exponentials in double, output as the probability-weighted sum of values.
// Work is independent per (b, t, h), so the result does not depend on the
// thread count. Decode steps have Tq = 1 and a short prefix, so a plain loop
// is enough; the matmuls around it dominate the time. bf16 tensors are read
// as they are (lowp::kv_attention), bit-identical to the emulated f32 kernel.
#include <cmath>
#include <cstring>

#include "lib/cpu/cpu_ops.h"
#include "lib/cpu/cpu_util.h"

namespace ds::cpu {

namespace {

// T: float, or uint16_t for bf16 tensors read as they are (the same values
// and sums as the f32 kernel on their exact upcasts; the new cache rows are
// the qkv rows' own bits, the output rounded to nearest even once).
template <class T>
void kv_attention_impl(const KvAttentionArgs& a) {
  const int64_t B = a.qkv.size(0), Tq = a.qkv.size(1), NH = a.NH, NKV = a.NKV == 0 ? a.NH : a.NKV;
  const int64_t HS = a.qkv.size(2) / (NH + 2 * NKV), W = a.qkv.size(2), G = NH / NKV;
  const int64_t Tmax = a.k_cache.size(1), KW = NKV * HS;
  const int32_t* pos = a.pos.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    DS_CHECK(pos[b] >= 0 && pos[b] + Tq <= Tmax, "kv_attention: sample {} writes positions [{}, {}) outside the "
             "cache of {} positions", b, pos[b], pos[b] + Tq, Tmax);
  const T* qkv = a.qkv.data<T>();
  T* kc = a.k_cache.data<T>();  // (B, Tmax, KW)
  T* vc = a.v_cache.data<T>();
  T* out = a.out.data<T>();  // (B, Tq, NH*HS)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tq; ++t) {
      const T* row = qkv + (b * Tq + t) * W;
      const int64_t at = (b * Tmax + pos[b] + t) * KW;
      std::memcpy(kc + at, row + NH * HS, sizeof(T) * KW);
      std::memcpy(vc + at, row + NH * HS + KW, sizeof(T) * KW);
    }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  const int64_t work = B * Tq * NH;
#pragma omp parallel for schedule(dynamic, 1) if (work > 1)
  for (int64_t i = 0; i < work; ++i) {
    const int64_t h = i % NH, t = (i / NH) % Tq, b = i / (NH * Tq);
    const int64_t n = pos[b] + t + 1, kvh = h / G;  // keys [0, n)
    float* s = thread_scratch(static_cast<size_t>(n + HS), 0);
    float* q = s + n;  // the query row in f32
    double* acc = thread_scratch_f64(static_cast<size_t>(HS));
    const T* qr = qkv + (b * Tq + t) * W + h * HS;
    for (int64_t e = 0; e < HS; ++e) q[e] = load(qr[e]);
    const T* K = kc + b * Tmax * KW + kvh * HS;
    const T* V = vc + b * Tmax * KW + kvh * HS;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      float d = 0.f;
      for (int64_t e = 0; e < HS; ++e) d += q[e] * load(K[j * KW + e]);
      s[j] = d * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    for (int64_t e = 0; e < HS; ++e) acc[e] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T* v = V + j * KW;
      const double p = s[j];
      for (int64_t e = 0; e < HS; ++e) acc[e] += p * load(v[e]);
    }
    T* o = out + (b * Tq + t) * NH * HS + h * HS;
    for (int64_t e = 0; e < HS; ++e) store(o + e, static_cast<float>(acc[e] / sum));
  }
}

}  // namespace

void kv_attention(const KvAttentionArgs& a, const Stream&) { kv_attention_impl<float>(a); }

// bf16 caches as they are: the emulation would upcast both whole caches and
// round them back at every layer of every decoded token.
bool lowp::kv_attention(const KvAttentionArgs& a, const Stream&) {
  if (!all_bf16({&a.qkv, &a.k_cache, &a.v_cache, &a.out})) return false;
  kv_attention_impl<uint16_t>(a);
  return true;
}

}  // namespace ds::cpu
