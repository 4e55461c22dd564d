// Counter-based initialization of a shard (param_init.h).
#include "lib/model/param_init.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "lib/core/error.h"
#include "lib/core/rng.h"

namespace ds {
namespace {

// The weight's random stream: FNV-1a of its (full-model) name.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Elements [full_at, full_at + n) of weight p's full tensor into dst.
void fill_run(const ParamSpec& p, uint64_t seed, double normal_std, double scaled_std, int64_t full_at, int64_t n,
              float* dst) {
  switch (p.init) {
    case InitKind::Zeros: std::fill(dst, dst + n, 0.f); return;
    case InitKind::Ones: std::fill(dst, dst + n, 1.f); return;
    case InitKind::Normal:
    case InitKind::ScaledNormal: {
      const double s = p.init == InitKind::Normal ? normal_std : scaled_std;
      const uint64_t stream = name_hash(p.name);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(s * normal_at(seed, stream, static_cast<uint64_t>(full_at + i)));
      return;
    }
    case InitKind::LinearUniform:
    case InitKind::LoraRight: {
      const double fan_in = static_cast<double>(p.init == InitKind::LoraRight ? p.full_shape[0] : p.full_shape.back());
      const double bound = 1.0 / std::sqrt(fan_in);
      const uint64_t stream = name_hash(p.name);
      for (int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(bound * (2.0 * uniform_at(seed, stream, static_cast<uint64_t>(full_at + i)) - 1.0));
      return;
    }
  }
}

}  // namespace

void init_params(const ModelConfig& cfg, const ModelLayout& local, uint64_t seed, float std, float* out,
                 int64_t begin, int64_t end) {
  if (end < 0) end = local.total;
  DS_CHECK(0 <= begin && begin <= end && end <= local.total, "init_params: range [{}, {}) of a layout of {}", begin,
           end, local.total);
  const double scaled = std / std::sqrt(2.0 * cfg.num_layers);
  for (const ParamSpec& p : local.params) {
    if (p.offset >= end || p.offset + p.numel <= begin) continue;
    // Each contiguous run of the local weight sits at full_off in the full one.
    for_each_shard_run(p, local.shard, [&](int64_t full_off, int64_t local_off, int64_t n) {
      const int64_t lo = std::max(p.offset + local_off, begin), hi = std::min(p.offset + local_off + n, end);
      if (lo >= hi) return;
      const int64_t skip = lo - (p.offset + local_off);
      fill_run(p, seed, std, scaled, full_off + skip, hi - lo, out + (lo - begin));
    });
  }
}

}  // namespace ds
