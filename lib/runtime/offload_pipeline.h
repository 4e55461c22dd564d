// The offloaded optimizer step as a pipeline over buckets (DeepSpeed's
// ZeRO-Offload): with `offload_optimizer.device: cpu` on a GPU, Adam m, v and
// the fp32 master range live in host memory. The step copies bucket i+1's
// gradients to the host and bucket i-1's updated weights back to the device
// while the CPU runs AdamW on bucket i, instead of one blocking copy of the
// whole range each way.
//
// The order of operations is data (offload_schedule) and the copies go
// through an OffloadCopier: on CUDA, copies on their own streams from
// (optionally pinned) host buffers, ordered by events; on the CPU, memcpy.
// So the pipelining (bucket order, which buffer a bucket uses, when the host
// waits) is the same code on both and is tested on the CPU bit for bit
// against the blocking update (test/zero/test_offload_pipeline.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/optim/optimizer.h"
#include "lib/runtime/nvme_tier.h"

namespace ds {

enum class OffloadOpKind {
  GradToHost,     // issue: bucket's device gradients -> host buffer `buffer`
  WaitGrad,       // the host waits for that copy
  Update,         // AdamW on the bucket (host master + buffer `buffer`)
  ParamToDevice,  // issue: bucket's updated host master -> device params
  Finish,         // every copy done (the next step may reuse everything)
};

struct OffloadOp {
  OffloadOpKind kind = OffloadOpKind::Finish;
  int bucket = -1;
  int buffer = -1;  // GradToHost, WaitGrad, Update: the gradient buffer
  bool operator==(const OffloadOp&) const = default;
};

// The step's operations for n_buckets buckets and n_buffers (>= 1) host
// gradient buffers: the first n_buffers gradient copies are issued at once;
// bucket b uses buffer b % n_buffers, and its copy is issued right after the
// update of bucket b - n_buffers, which frees that buffer. Each update is
// followed by the copy of its weights to the device.
std::vector<OffloadOp> offload_schedule(int n_buckets, int n_buffers);

// Moves bytes between the device and host buffers, asynchronously where the
// backend can. Tickets name copies; a ticket is used once per step.
class OffloadCopier {
 public:
  virtual ~OffloadCopier() = default;
  // A host tensor (f32) copies can use at full speed: page-locked when
  // `pinned` (CUDA), ordinary host memory otherwise.
  virtual Tensor host_buffer(int64_t numel, bool pinned) = 0;
  // Start of a step: later copies to the host come after the device work
  // issued so far (the gradients are final).
  virtual void begin() = 0;
  virtual void to_host(const Tensor& dst, const Tensor& src, int ticket) = 0;
  virtual void to_device(const Tensor& dst, const Tensor& src, int ticket) = 0;
  virtual void wait(int ticket) = 0;  // the host waits for the copy
  virtual void finish() = 0;          // the host waits for every copy
};

// memcpy (CPU tensors); every copy is done when issued.
std::unique_ptr<OffloadCopier> make_host_copier();
// The copier for `dev`: CUDA streams and events for a CUDA device (from the
// CUDA backend module), else make_host_copier().
std::unique_ptr<OffloadCopier> make_offload_copier(Device dev);

// The CUDA copier as the CUDA backend module hands it over (part Offload of
// lib/core/cuda_module.h; lib/runtime/cuda/offload_copier_cuda.cpp is built
// into the module, so ds_runtime never links the CUDA runtime).
struct OffloadModuleApi {
  std::unique_ptr<OffloadCopier> (*make_copier)() = nullptr;
};

class OffloadPipeline {
 public:
  // bucket_numel: elements per bucket (DeepSpeed's reduce_bucket_size plays
  // this part); pinned: offload_optimizer.pin_memory.
  OffloadPipeline(std::unique_ptr<OffloadCopier> copier, int64_t bucket_numel, bool pinned);

  // A host copy of `device_master` (f32, the rank's master range) in a buffer
  // of the copier (pinned if asked): the master the steps update.
  Tensor host_copy(const Tensor& device_master);

  // One optimizer step: opt's state and host_master are on the host and cover
  // opt's range; params and grads (device, f32) cover it too. opt must be
  // element-wise (Optimizer::step_part). Same result, bit for bit, as copying
  // grads to the host, opt.step on the whole range and copying host_master to
  // params. params may be host_master itself (offload_param cpu: the
  // parameter shard lives on the host): then nothing is copied back.
  void step(Optimizer& opt, const Tensor& params, const Tensor& grads, const Tensor& host_master,
            const StepHyper& h, float grad_scale);

  // The same step with the optimizer state in an NVMe tier (ZeRO-Infinity's
  // offload_optimizer nvme with a GPU model): the buckets are the tier's
  // sub-groups. For each sub-group the tier reads its states into host
  // buffers (ahead, with pipeline_read), its gradients (and f32 master) come
  // from the device into one of two host buffer pairs, the optimizer updates
  // it there, the master goes back to the device and the states to the
  // tier. The next sub-group's device copies are in flight during the
  // update, and a buffer pair is refilled only after the copy to the device
  // that read it. Where the parameters are: ParamsAt::Device, `params` on
  // the device (copied down and up); Host, `params` in host memory, updated
  // in place (offload_param cpu); Tier, the tier's state 0 (offload_param
  // nvme; `params` undefined). The tier holds opt's states after that, never
  // the gradients; grads (device, f32) cover opt's range. Same bits as
  // opt.step on the whole range in memory.
  enum class ParamsAt { Device, Host, Tier };
  void step_tier(Optimizer& opt, NvmeStateTier& tier, ParamsAt where, const Tensor& params, const Tensor& grads,
                 const StepHyper& h, float grad_scale);
  // Host bytes of step_tier's buffers for a range of `numel` elements in
  // sub-groups of `sub_group` (the tier's own buffers not included): two
  // gradient buffers, and with params_too (ParamsAt::Device) two for the master.
  static int64_t tier_host_bytes_for(int64_t numel, int64_t sub_group, bool params_too);

  int64_t bucket_numel() const { return bucket_numel_; }
  // Host bytes a pipeline of `bucket_numel` allocates for a range of `numel`
  // elements: the master copy (host_copy) and the gradient buffers of step()
  // (two buckets, fewer when the range has fewer); without master_copy
  // (offload_param cpu: the shard on the host is the master) the buffers only.
  // The start-up log and --estimate-memory report this as host memory.
  static int64_t host_bytes_for(int64_t numel, int64_t bucket_numel, bool master_copy = true);
  // What this pipeline has allocated so far (host_copy and step()'s buffers).
  int64_t host_bytes() const;

 private:
  std::unique_ptr<OffloadCopier> copier_;
  int64_t bucket_numel_;
  bool pinned_;
  std::vector<Tensor> grad_buffers_;  // 2 host buffers of bucket_numel_
  std::vector<Tensor> tier_grads_, tier_params_;  // step_tier's buffers (params: ParamsAt::Device only)
  int64_t master_bytes_ = 0;          // host_copy's buffers
};

}  // namespace ds
