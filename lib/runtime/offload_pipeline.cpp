// The offloaded AdamW step in buckets: the schedule, the memcpy copier and the
// pipeline that walks the schedule (see offload_pipeline.h).
#include "lib/runtime/offload_pipeline.h"

#include <algorithm>
#include <utility>
#include <cstring>

#include "lib/core/cuda_module.h"
#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

std::vector<OffloadOp> offload_schedule(int n_buckets, int n_buffers) {
  DS_CHECK(n_buckets >= 0 && n_buffers >= 1, "offload schedule: {} buckets, {} buffers", n_buckets, n_buffers);
  std::vector<OffloadOp> ops;
  for (int b = 0; b < std::min(n_buckets, n_buffers); ++b) ops.push_back({OffloadOpKind::GradToHost, b, b});
  for (int b = 0; b < n_buckets; ++b) {
    const int buf = b % n_buffers;
    ops.push_back({OffloadOpKind::WaitGrad, b, buf});
    ops.push_back({OffloadOpKind::Update, b, buf});
    ops.push_back({OffloadOpKind::ParamToDevice, b, -1});
    // The update has read the buffer: the bucket n_buffers ahead may fill it.
    if (b + n_buffers < n_buckets) ops.push_back({OffloadOpKind::GradToHost, b + n_buffers, buf});
  }
  ops.push_back({OffloadOpKind::Finish, -1, -1});
  return ops;
}

namespace {

class HostCopier : public OffloadCopier {
 public:
  Tensor host_buffer(int64_t numel, bool) override { return Tensor::empty({numel}, DType::F32, Device::cpu()); }
  void begin() override {}
  void to_host(const Tensor& dst, const Tensor& src, int) override { copy(dst, src); }
  void to_device(const Tensor& dst, const Tensor& src, int) override { copy(dst, src); }
  void wait(int) override {}
  void finish() override {}

 private:
  static void copy(const Tensor& dst, const Tensor& src) {
    DS_CHECK(dst.nbytes() == src.nbytes() && dst.device().is_cpu() && src.device().is_cpu(),
             "offload copy of {} bytes into {} bytes", src.nbytes(), dst.nbytes());
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
  }
};

}  // namespace

std::unique_ptr<OffloadCopier> make_host_copier() { return std::make_unique<HostCopier>(); }

std::unique_ptr<OffloadCopier> make_offload_copier(Device dev) {
  if (dev.is_cuda()) {
    const auto* api = static_cast<const OffloadModuleApi*>(cuda_module_part(CudaModulePart::Offload));
    DS_CHECK(api && api->make_copier, "the CUDA backend module has no offload copier");
    return api->make_copier();
  }
  DS_CHECK(dev.is_cpu(), "offload copier: no copy engine for this device");
  return make_host_copier();
}

OffloadPipeline::OffloadPipeline(std::unique_ptr<OffloadCopier> copier, int64_t bucket_numel, bool pinned)
    : copier_(std::move(copier)), bucket_numel_(bucket_numel), pinned_(pinned) {
  DS_CHECK(bucket_numel > 0, "offload pipeline: bucket of {} elements", bucket_numel);  // config_validate checks the key
}

Tensor OffloadPipeline::host_copy(const Tensor& device_master) {
  Tensor h = copier_->host_buffer(device_master.numel(), pinned_);
  h.copy_from(device_master);
  master_bytes_ += h.nbytes();
  return h;
}

namespace {

constexpr int kBuffers = 2;  // double buffering: one bucket updated while the next one arrives

// step()'s bucket size and number of gradient buffers for a range of n elements.
std::pair<int64_t, int> bucket_plan(int64_t n, int64_t bucket_numel) {
  const int64_t bucket = std::min(bucket_numel, std::max<int64_t>(n, 1));
  const int n_buckets = static_cast<int>((n + bucket - 1) / bucket);
  return {bucket, std::min(kBuffers, std::max(n_buckets, 1))};
}

}  // namespace

int64_t OffloadPipeline::host_bytes_for(int64_t numel, int64_t bucket_numel, bool master_copy) {
  const auto [bucket, n_buffers] = bucket_plan(numel, bucket_numel);
  return static_cast<int64_t>(sizeof(float)) * ((master_copy ? numel : 0) + n_buffers * bucket);
}

int64_t OffloadPipeline::host_bytes() const {
  int64_t b = master_bytes_;
  for (const std::vector<Tensor>* v : {&grad_buffers_, &tier_grads_, &tier_params_})
    for (const Tensor& t : *v) b += t.nbytes();
  return b;
}

int64_t OffloadPipeline::tier_host_bytes_for(int64_t numel, int64_t sub_group, bool params_too) {
  if (numel <= 0) return 0;
  const int64_t groups = (numel + sub_group - 1) / sub_group;
  return static_cast<int64_t>(sizeof(float)) * (params_too ? 2 : 1) * std::min<int64_t>(groups, kBuffers) *
         std::min(numel, sub_group);
}

void OffloadPipeline::step_tier(Optimizer& opt, NvmeStateTier& tier, ParamsAt where, const Tensor& params,
                                const Tensor& grads, const StepHyper& h, float grad_scale) {
  const int64_t n = opt.end() - opt.begin();
  const int param_states = where == ParamsAt::Tier ? 1 : 0;
  const int64_t np = where == ParamsAt::Tier ? n : params.numel();
  DS_CHECK(np == n && grads.numel() == n && tier.numel() == n &&
               tier.n_states() == param_states + static_cast<int>(opt.state_specs().size()),
           "offload step through the NVMe tier: params {}, grads {}, tier {} elements and {} states for a range of {} "
           "with {} states", np, grads.numel(), tier.numel(), tier.n_states(), n, opt.state_specs().size());
  DS_CHECK(grads.dtype() == DType::F32 && (where == ParamsAt::Tier || params.dtype() == DType::F32) &&
               (where != ParamsAt::Host || params.device().is_cpu()),
           "offload step: f32 params and grads expected");
  const bool copy_params = where == ParamsAt::Device;
  const int64_t sub = tier.sub_group();
  const int groups = tier.n_sub_groups();
  const int pairs = std::min(groups, kBuffers);
  const int64_t bucket = std::min(n, sub);
  if (static_cast<int>(tier_grads_.size()) != pairs || (pairs > 0 && tier_grads_[0].numel() != bucket) ||
      tier_params_.size() != (copy_params ? tier_grads_.size() : 0)) {
    tier_grads_.clear();
    tier_params_.clear();
    for (int i = 0; i < pairs; ++i) {
      tier_grads_.push_back(copier_->host_buffer(bucket, pinned_));
      if (copy_params) tier_params_.push_back(copier_->host_buffer(bucket, pinned_));
    }
  }
  // Tickets by buffer pair: the gradients' copy 3p, the master's 3p + 1 (to
  // the host), the master's copy back 3p + 2.
  auto fetch = [&](int g) {
    const int64_t lo = g * sub, m = std::min(n, lo + sub) - lo;
    const int p = g % kBuffers;
    if (g >= kBuffers && copy_params) copier_->wait(3 * p + 2);  // the pair's last copy up has read it
    copier_->to_host(tier_grads_[p].view(0, {m}), grads.view(lo, {m}), 3 * p);
    if (copy_params) copier_->to_host(tier_params_[p].view(0, {m}), params.view(lo, {m}), 3 * p + 1);
  };
  opt.count_step();  // as Optimizer::step: one step for the whole range
  copier_->begin();
  if (groups > 0) fetch(0);
  tier.for_each(
      [&](int64_t lo, int64_t hi, const std::vector<Tensor>& states) {
        const int g = static_cast<int>(lo / sub), p = g % kBuffers;
        copier_->wait(3 * p);
        if (copy_params) copier_->wait(3 * p + 1);
        if (g + 1 < groups) fetch(g + 1);
        const Tensor master = where == ParamsAt::Tier   ? states[0]
                              : where == ParamsAt::Host ? params.view(lo, {hi - lo})
                                                        : tier_params_[p].view(0, {hi - lo});
        const std::vector<Tensor> opt_states(states.begin() + param_states, states.end());
        DS_CHECK(opt.step_part(lo, hi, {.params = master, .grads = tier_grads_[p].view(0, {hi - lo}),
                                        .params_lowp = Tensor(), .states = opt_states},
                               h, grad_scale),
                 "offload_optimizer nvme: optimizer {} does not update a range in parts", opt.type());
        if (copy_params) copier_->to_device(params.view(lo, {hi - lo}), master, 3 * p + 2);
      },
      true);
  copier_->finish();
}

void OffloadPipeline::step(Optimizer& opt, const Tensor& params, const Tensor& grads, const Tensor& host_master,
                           const StepHyper& h, float grad_scale) {
  const int64_t n = opt.end() - opt.begin();
  const std::vector<Tensor> state = opt.states();
  DS_CHECK(params.numel() == n && grads.numel() == n && host_master.numel() == n &&
               std::all_of(state.begin(), state.end(), [](const Tensor& t) { return t.device().is_cpu(); }),
           "offload step: params {}, grads {}, host master {} for a range of {}", params.numel(), grads.numel(),
           host_master.numel(), n);
  DS_CHECK(grads.dtype() == DType::F32 && params.dtype() == DType::F32, "offload step: f32 params and grads expected");
  // offload_param cpu: the host master is the parameter shard itself.
  const bool params_home = params.raw() == host_master.raw() && params.device() == host_master.device();
  const auto [bucket, n_buffers] = bucket_plan(n, bucket_numel_);
  const int n_buckets = static_cast<int>((n + bucket - 1) / bucket);
  if (static_cast<int>(grad_buffers_.size()) != n_buffers || grad_buffers_[0].numel() != bucket) {
    grad_buffers_.clear();
    for (int i = 0; i < n_buffers; ++i) grad_buffers_.push_back(copier_->host_buffer(bucket, pinned_));
  }
  auto part = [&](int b) {
    const int64_t lo = b * bucket;
    return std::pair<int64_t, int64_t>{lo, std::min(n, lo + bucket)};
  };
  opt.count_step();  // as Optimizer::step: one step for the whole range
  copier_->begin();
  // Tickets: gradient copy of bucket b is 2b, its weights' copy 2b + 1.
  for (const OffloadOp& op : offload_schedule(n_buckets, n_buffers)) {
    if (op.kind == OffloadOpKind::Finish) {
      copier_->finish();
      continue;
    }
    const auto [lo, hi] = part(op.bucket);
    const Tensor buf = op.buffer >= 0 ? grad_buffers_[op.buffer].view(0, {hi - lo}) : Tensor();
    switch (op.kind) {
      case OffloadOpKind::GradToHost: copier_->to_host(buf, grads.view(lo, {hi - lo}), 2 * op.bucket); break;
      case OffloadOpKind::WaitGrad: copier_->wait(2 * op.bucket); break;
      case OffloadOpKind::Update:
        DS_CHECK(opt.step_part(lo, hi, {.params = host_master.view(lo, {hi - lo}), .grads = buf, .params_lowp = Tensor()}, h, grad_scale),
                 "offload: optimizer {} does not update a range in parts", opt.type());
        break;
      case OffloadOpKind::ParamToDevice:
        if (!params_home)
          copier_->to_device(params.view(lo, {hi - lo}), host_master.view(lo, {hi - lo}), 2 * op.bucket + 1);
        break;
      case OffloadOpKind::Finish: break;
    }
  }
}

}  // namespace ds
