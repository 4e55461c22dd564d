// compare_offload_step (offload_case.h).
#include "test/zero/offload_case.h"

#include <cstring>
#include <random>

#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/optim/adamw.h"
#include "lib/runtime/offload_pipeline.h"

namespace ds {

namespace {

ModelLayout small_layout() {
  ModelLayout l;
  int64_t off = 0;
  for (auto [name, n, decay] : {std::tuple{"a", 100, true}, std::tuple{"b", 37, false}, std::tuple{"c", 501, true},
                                std::tuple{"d", 13, false}}) {
    ParamSpec p;
    p.name = name;
    p.shape = {n};
    p.full_shape = {n};
    p.offset = off;
    p.numel = n;
    p.decay = decay;
    l.params.push_back(p);
    off += n;
  }
  l.total = off;
  return l;
}

Tensor random_host(int64_t n, uint32_t seed) {
  Tensor t = Tensor::empty({n}, DType::F32, Device::cpu());
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = d(gen);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

}  // namespace

OffloadCompare compare_offload_step(Device dev, int64_t bucket, bool pinned) {
  const ModelLayout layout = small_layout();
  const int64_t begin = 50, end = 640, n = end - begin;  // a rank's range, cutting parameters a and d
  AdamW blocking(layout, Device::cpu(), begin, end), piped(layout, Device::cpu(), begin, end);
  StepHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;

  const Tensor init = random_host(n, 1);
  Tensor dev_a = init.to(dev), dev_b = init.to(dev);  // the device master ranges
  Tensor host_a = dev_a.to(Device::cpu());
  OffloadPipeline pipe(make_offload_copier(dev), bucket, pinned);
  Tensor host_b = pipe.host_copy(dev_b);
  for (int step = 0; step < 3; ++step) {
    const Tensor grads = random_host(n, 100 + step).to(dev);
    const float scale = 0.5f + 0.25f * step;
    blocking.step({.params = host_a, .grads = grads.to(Device::cpu()), .params_lowp = Tensor()}, h, scale);
    dev_a.copy_from(host_a);
    pipe.step(piped, dev_b, grads, host_b, h, scale);
  }
  OffloadCompare r;
  r.params_equal = same_bytes(dev_a, dev_b) && same_bytes(host_a, host_b);
  r.moments_equal = same_bytes(blocking.m(), piped.m()) && same_bytes(blocking.v(), piped.v()) &&
                    blocking.step_count() == piped.step_count();
  r.changed = !same_bytes(dev_b, init);
  r.host_bytes = pipe.host_bytes();
  r.host_bytes_reported = OffloadPipeline::host_bytes_for(n, bucket);
  return r;
}

}  // namespace ds
