// compare_offload_step (offload_case.h).
#include "test/zero/offload_case.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <random>

#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/optim/adamw.h"
#include "lib/optim/optimizer.h"
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

// CPU tensors; copies queued per direction and run in order when waited for.
class DeferredCopier : public OffloadCopier {
 public:
  Tensor host_buffer(int64_t numel, bool) override { return Tensor::empty({numel}, DType::F32, Device::cpu()); }
  void begin() override {}
  void to_host(const Tensor& dst, const Tensor& src, int ticket) override { queue_[0].push_back({dst, src, ticket}); }
  void to_device(const Tensor& dst, const Tensor& src, int ticket) override { queue_[1].push_back({dst, src, ticket}); }
  void wait(int ticket) override {
    for (std::deque<Copy>& q : queue_) {
      const auto it = std::find_if(q.begin(), q.end(), [&](const Copy& c) { return c.ticket == ticket; });
      if (it == q.end()) continue;
      run(q, it - q.begin() + 1);
      return;
    }
  }
  void finish() override {
    run(queue_[1], queue_[1].size());
    run(queue_[0], queue_[0].size());
  }

 private:
  struct Copy {
    Tensor dst, src;
    int ticket;
  };
  static void run(std::deque<Copy>& q, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(q.front().dst.raw(), q.front().src.raw(), q.front().src.nbytes());
      q.pop_front();
    }
  }
  std::deque<Copy> queue_[2];  // to the host, to the device
};

std::unique_ptr<OffloadCopier> copier_for(Device dev, bool deferred) {
  return deferred ? std::make_unique<DeferredCopier>() : make_offload_copier(dev);
}

}  // namespace

OffloadCompare compare_offload_step(Device dev, int64_t bucket, bool pinned, bool deferred, bool host_params) {
  const ModelLayout layout = small_layout();
  const int64_t begin = 50, end = 640, n = end - begin;  // a rank's range, cutting parameters a and d
  AdamW blocking(layout, Device::cpu(), begin, end), piped(layout, Device::cpu(), begin, end);
  StepHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;

  const Tensor init = random_host(n, 1);
  Tensor dev_a = init.to(dev), dev_b = init.to(dev);  // the device master ranges
  Tensor host_a = dev_a.to(Device::cpu());
  OffloadPipeline pipe(copier_for(dev, deferred), bucket, pinned);
  // offload_param cpu: the parameters are the host master, nothing goes back.
  if (host_params) dev_b = init.clone();
  Tensor host_b = host_params ? dev_b : pipe.host_copy(dev_b);
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
  r.host_bytes_reported = OffloadPipeline::host_bytes_for(n, bucket, !host_params);
  return r;
}

OffloadCompare compare_nvme_offload_step(Device dev, const std::string& dir, const NvmeOffloadCase& c) {
  const ModelLayout layout = small_layout();
  const int64_t begin = 50, end = 640, n = end - begin;
  const OptimizerSpec spec{.type = "AdamW"};
  std::unique_ptr<Optimizer> blocking = make_optimizer(spec, layout, Device::cpu(), begin, end);
  std::unique_ptr<Optimizer> piped = make_optimizer(spec, layout, Device::cpu(), begin, end, StateHome::Elsewhere);
  StepHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  using At = OffloadPipeline::ParamsAt;
  const int param_states = c.params == At::Tier ? 1 : 0;
  std::vector<float> initial(param_states, 0.f);  // offload_param nvme: the parameters are state 0
  for (size_t i = 0; i < piped->state_specs().size(); ++i) initial.push_back(piped->initial_state_value(i));
  AioConfig aio;
  aio.block_size = 8192;
  NvmeStateTier tier({.dir = dir, .name = "swap", .aio = aio, .sub_group_size = c.sub_group,
                      .buffer_count = c.buffer_count, .pipeline_read = c.pipelined, .pipeline_write = c.pipelined},
                     initial, n);
  const Tensor init = random_host(n, 1);
  Tensor host_a = init.clone();
  // The parameters: on the device, in host memory, or the tier's state 0.
  Tensor params = c.params == At::Device ? init.to(dev) : c.params == At::Host ? init.clone() : Tensor();
  if (c.params == At::Tier) tier.write(0, 0, n, init.data<float>());
  auto current = [&] {
    if (c.params != At::Tier) return params.to(Device::cpu());
    Tensor back = Tensor::empty({n}, DType::F32, Device::cpu());
    tier.read(0, 0, n, back.data<float>());
    return back;
  };
  OffloadPipeline pipe(copier_for(dev, c.deferred), 1 << 20, c.pinned);
  for (int step = 0; step < 3; ++step) {
    const Tensor grads = random_host(n, 100 + step).to(dev);
    const float scale = 0.5f + 0.25f * step;
    blocking->step({.params = host_a, .grads = grads.to(Device::cpu()), .params_lowp = Tensor()}, h, scale);
    pipe.step_tier(*piped, tier, c.params, params, grads, h, scale);
  }
  OffloadCompare r;
  r.params_equal = same_bytes(host_a, current());
  r.moments_equal = blocking->step_count() == piped->step_count();
  const std::vector<Tensor> mem = blocking->states();
  for (size_t i = 0; i < mem.size(); ++i) {
    Tensor back = Tensor::empty({n}, DType::F32, Device::cpu());
    tier.read(static_cast<int>(i) + param_states, 0, n, back.data<float>());
    r.moments_equal = r.moments_equal && same_bytes(mem[i], back);
  }
  r.changed = !same_bytes(current(), init);
  r.host_bytes = pipe.host_bytes();
  r.host_bytes_reported = OffloadPipeline::tier_host_bytes_for(n, tier.sub_group(), c.params == At::Device);
  return r;
}

}  // namespace ds
