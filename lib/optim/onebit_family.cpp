// The 1-bit optimizers' shared part (onebit_family.h).
#include "lib/optim/onebit_family.h"

#include <cmath>

#include "lib/core/error.h"

namespace ds {

OneBitFamily::OneBitFamily(const ModelLayout& layout, Device dev, int64_t begin, int64_t end, const char* type)
    : Optimizer(layout, begin, end) {
  DS_USER_CHECK(dev.is_cpu(), "optimizer.type {} runs on the CPU backend only so far", type);
  segs_ = segments_in(begin, end);
}

void OneBitFamily::exchange_per_tensor(float* x) {
  if (ranks() <= 1) return;
  errors_.resize(segs_.size());
  for (size_t k = 0; k < segs_.size(); ++k)
    onebit_all_reduce(*dp_, x + segs_[k].begin, segs_[k].end - segs_[k].begin, errors_[k]);
}

void OneBitFamily::adam_update(float* p, const float* m, const float* v, float* acc, const StepHyper& h) const {
  for (const Segment& s : segs_) {
    const float wd = s.decay ? h.weight_decay : 0.f;
#pragma omp parallel for schedule(static)
    for (int64_t i = s.begin; i < s.end; ++i) {
      float u = m[i] / (std::sqrt(v[i]) + h.eps);
      if (wd > 0.f) u += wd * p[i];
      p[i] += -h.lr * u;
      if (acc) acc[i] += -h.lr * u;
    }
  }
}

void OneBitFamily::exchange_whole(float* x) {
  if (ranks() <= 1) return;
  errors_.resize(1);
  onebit_all_reduce(*dp_, x, end() - begin(), errors_[0]);
}

}  // namespace ds
