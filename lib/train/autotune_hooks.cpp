// Experiment metrics and the memory estimate as JSON for dsrun's autotuner.
#include "lib/train/autotune_hooks.h"

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/core/device_runtime.h"
#include "lib/core/error.h"
#include "lib/core/mem_tag.h"
#include "lib/model/layout.h"
#include "lib/train/memory_estimate.h"
#include "lib/train/metrics.h"

namespace ds {
namespace {

int64_t env_step(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  DS_USER_CHECK(*end == 0 && n >= 0, "{}='{}' must be a non-negative integer", name, v);
  return n;
}

// Writes `j` to `path` through a temporary name, so a reader never sees half a file.
void write_json(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    DS_USER_CHECK(f.good(), "cannot write '{}'", tmp);
    f << j.dump(2) << "\n";
  }
  DS_USER_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '{}' to '{}'", tmp, path);
}

}  // namespace

ProfileWindow ProfileWindow::from_env() {
  ProfileWindow w;
  if (const char* p = std::getenv("DS_AUTOTUNING_METRIC_PATH")) w.path_ = p;
  w.start_ = env_step("DS_AUTOTUNING_START_PROFILE_STEP", 3);
  w.end_ = env_step("DS_AUTOTUNING_END_PROFILE_STEP", 5);
  DS_USER_CHECK(!w.enabled() || w.end_ > w.start_,
                "DS_AUTOTUNING_END_PROFILE_STEP {} must be larger than DS_AUTOTUNING_START_PROFILE_STEP {}", w.end_,
                w.start_);
  return w;
}

bool ProfileWindow::record(double ms) {
  if (!enabled()) return false;
  ++steps_;
  if (steps_ > start_) timed_ms_ += ms;
  return steps_ >= end_;
}

void ProfileWindow::write(Communicator& world, Device dev, const ProfileFacts& f) const {
  const int64_t rss = peak_rss_bytes();
  int64_t peak = rss;
  if (dev.is_cuda()) peak = static_cast<int64_t>(device_runtime(dev).max_allocated_bytes());
  // Every rank takes part; the job's figure is the largest rank's (exact below 2^53 bytes).
  const double peak_max = world.size() > 1 ? world.all_reduce_scalar(double(peak), dev, ReduceOp::Max) : peak;
  const double rss_max = world.size() > 1 ? world.all_reduce_scalar(double(rss), dev, ReduceOp::Max) : rss;
  if (world.rank() != 0) return;
  const double latency = timed_ms_ / 1000.0 / static_cast<double>(end_ - start_);  // seconds per step
  const double samples_per_s = static_cast<double>(f.global_batch) / latency;
  nlohmann::json j = {
      {"latency", latency},
      {"throughput", samples_per_s},
      {"FLOPS_per_gpu", samples_per_s * f.seq_length * f.flops_per_token / world.size()},
      {"tokens_per_s", samples_per_s * f.seq_length},
      {"peak_memory_bytes", static_cast<int64_t>(peak_max)},
      {"peak_rss_bytes", static_cast<int64_t>(rss_max)},
      {"profile_steps", {start_ + 1, end_}},
      {"world_size", world.size()},
  };
  write_json(path_, j);
}

void write_estimate_json_if_asked(const TrainConfig& cfg, int world_size) {
  const char* path = std::getenv("DS_AUTOTUNING_ESTIMATE_PATH");
  if (!path || !*path) return;
  const MemoryEstimate e = estimate_memory(cfg, 1, world_size);
  const MemoryEstimateRow* row = nullptr;
  for (const MemoryEstimateRow& r : e.rows)
    if (r.configured) row = &r;
  DS_CHECK(row != nullptr, "the memory estimate has no row for the configured ZeRO stage");
  const ModelConfig& m = cfg.model;
  const int64_t vocab = m.padded_vocab_size > 0 ? m.padded_vocab_size : (m.vocab_size > 0 ? m.vocab_size : 50257);
  nlohmann::json j = {
      {"device", cfg.device == DeviceType::CUDA ? "cuda" : "cpu"},
      {"world_size", world_size},
      {"tp", e.tp},
      {"pp", e.pp},
      {"dp", e.dp},
      {"n_params", e.n_params},
      {"num_layers", m.num_layers},
      {"hidden_size", m.hidden_size},
      {"num_heads", m.num_heads},
      {"sequence_parallel", cfg.parallel.sequence_parallel},
      {"recompute_granularity", recompute_granularity_name(cfg.parallel.recompute)},
      {"num_layers_per_virtual_pipeline_stage", cfg.parallel.num_layers_per_virtual_stage},
      {"seq_length", m.seq_length},
      {"vocab_size", vocab},
      {"flops_per_token", flops_per_token(m, e.n_params)},
      {"train_batch_size", cfg.batch.train_batch_size},
      {"micro_batch_size", cfg.batch.micro_batch_size},
      {"gradient_accumulation_steps", cfg.batch.grad_accum_steps},
      {"zero_stage", row->stage},
      {"offload_optimizer", row->offload_optimizer},
      {"offload_device", row->nvme ? "nvme" : row->offload_optimizer ? "cpu" : "none"},
      {"nvme_bytes_per_rank", row->nvme_per_rank},
      {"activation_bytes", e.activations.total()},
      {"device_bytes_per_rank", row->device_total},
      {"host_bytes_per_rank", row->host_per_rank},
  };
  write_json(path, j);
}

}  // namespace ds
