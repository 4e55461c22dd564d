// ZeRO settings (DeepSpeed's zero_optimization section), read by the ZeRO
// parameter store and optimizer in this folder.
#pragma once
#include <cstdint>
#include <string>

#include "lib/io/aio.h"

namespace ds {

// offload_optimizer.device: where Adam state and the fp32 master range live.
// NVMe: the optimizer state in a swap file per rank (lib/runtime/nvme_tier.h).
enum class OffloadDevice { None, CPU, NVMe };
// DeepSpeed's spelling: "none", "cpu", "nvme".
inline const char* offload_device_name(OffloadDevice d) {
  return d == OffloadDevice::CPU ? "cpu" : d == OffloadDevice::NVMe ? "nvme" : "none";
}

// offload_optimizer's NVMe keys (DeepSpeed's names and defaults) and the
// zero_optimization keys that shape the tier.
struct NvmeOffloadConfig {
  std::string nvme_path;
  int buffer_count = 4;
  bool pipeline_read = false, pipeline_write = false;
  bool fast_init = false;  // accepted: DeepSpeed's faster start-up; the state starts the same either way
  AioConfig aio;           // the `aio` section
};

struct ZeroConfig {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000, allgather_bucket_size = 500000000;
  bool overlap_comm = false, contiguous_gradients = true;
  // Megatron's --overlap-param-gather (parallel.overlap_param_gather; ZeRO 1/2):
  // the parameter all-gather after the step runs asynchronously and the next
  // forward waits for each unit's chunks when it acquires the unit.
  bool overlap_param_gather = false;
  int64_t stage3_prefetch_bucket_size = 50000000, stage3_max_live_parameters = 1000000000,
          stage3_param_persistence_threshold = 100000;
  OffloadDevice offload_optimizer = OffloadDevice::None;  // "none" | "cpu" | "nvme"
  // offload_optimizer.pin_memory (DeepSpeed's default false): page-lock the
  // host master and gradient buffers so the copies overlap the CPU update.
  bool offload_pin_memory = false;
  // offload_optimizer.ratio (DeepSpeed's partial offload, stage 3): the share
  // of the optimizer state that is offloaded. The CPU backend has nothing to
  // move, so any ratio trains the same; a GPU run takes 1 only (validated).
  double offload_ratio = 1.0;
  NvmeOffloadConfig nvme;
  // offload_param.device (stage 3): nvme keeps the rank's parameter shard in
  // its optimizer swap file (with offload_optimizer nvme, the same
  // nvme_path); cpu on the CPU backend: where it already is.
  OffloadDevice offload_param = OffloadDevice::None;
  std::string param_nvme_path;
  // offload_param.pin_memory: page-lock a GPU model's host parameter shard
  // (offload_param cpu), so the gathers' copies up run at full speed.
  bool param_pin_memory = false;
  // sub_group_size: elements of the optimizer step's tile with NVMe offload
  // (each sub-group's state is read, updated and written in turn).
  int64_t sub_group_size = 1000000000;
  // load_from_fp32_weights false (DeepSpeed's ZeRO 1/2 and bf16 optimizers):
  // --load starts the f32 master weights from the 16-bit weights, i.e. the
  // saved f32 values rounded to the training's 16-bit dtype (the trainer).
  bool load_from_fp32_weights = true;
};

// ZeRO-Infinity's gradient tier: with offload_optimizer nvme at stage 3, f32
// gradient accumulation and one sharding group, the gradient shard is the
// last state of the optimizer's swap file (ZeroParamStore::grads_elsewhere)
// where the model is host memory; a GPU model keeps it on the device, where
// its reductions run, and copies it to the host per sub-group in the step.
inline bool grads_in_nvme_tier(const ZeroConfig& z, bool f32_grads, int sharding_groups, bool host_model) {
  return z.stage == 3 && z.offload_optimizer == OffloadDevice::NVMe && f32_grads && sharding_groups == 1 &&
         host_model;
}

}  // namespace ds
