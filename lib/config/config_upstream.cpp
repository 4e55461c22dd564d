// DeepSpeed features dstrain does not implement, each sorted by what it would
// change. A key that changes the trained values is refused with one line
// naming it when it is on (Apex AMP, torch autocast, progressive layer drop,
// 16-bit master weights, ZeRO++'s quantized communication at stage 3). One that upstream
// itself ignores in the run's settings, or that changes only where state
// lives and how it travels, is accepted with one line saying so (hpZ, MiCS,
// sparse attention, the quantization keys below stage 3). The deprecated
// cpu_offload aliases mean what DeepSpeed makes of them. Everything else
// DeepSpeed defines and dstrain does not read is warned about by name
// (DsSection::finish).
#include <string>

#include "lib/config/config_internal.h"
#include "lib/core/error.h"

namespace ds {
namespace {

// A section whose "enabled" is true is refused: `what` says what it would do.
void refuse_enabled(DsSection& root, const std::string& key, const std::string& what) {
  DsSection s = root.section(key);
  DS_USER_CHECK(!s.get<bool>("enabled", false), "config: '{}.enabled' is true: {} is not implemented by dstrain",
                key, what);
}

}  // namespace

void read_upstream_sections(DsSection& root) {
  refuse_enabled(root, "amp", "NVIDIA Apex AMP (set bf16.enabled or fp16.enabled for mixed precision)");
  refuse_enabled(root, "torch_autocast",
                 "torch autocast (set bf16.enabled: f32 master weights, bf16 matmuls and attention)");
  refuse_enabled(root, "progressive_layer_drop", "progressive layer dropping (layers skipped at random in training)");
  // DeepSpeed reads the section but only a model built of its
  // SparseSelfAttention modules uses it; Megatron's GPT (and dstrain's) is not.
  root.mark("sparse_attention");
  if (root.has("sparse_attention"))
    add_warning(root.warnings(), "config: 'sparse_attention' configures DeepSpeed's SparseSelfAttention modules, "
                                 "which GPT models do not use (in Megatron-DeepSpeed too): ignored");
  // Dividing the gradients by a factor before the sum and by DP / factor
  // after it changes only the rounding of an f32 reduction (as prescale_gradients).
  const double predivide = root.get<double>("gradient_predivide_factor", 1.0);
  DS_USER_CHECK(predivide > 0, "config: 'gradient_predivide_factor' must be > 0, got {}", predivide);
}

void refuse_16bit_master(DsSection& precision, const std::string& key) {
  DS_USER_CHECK(!precision.get<bool>(key, false),
                "config: '{}' is true: master weights and gradients in 16 bits are not implemented by dstrain (it "
                "keeps f32 master weights); drop the key",
                precision.full(key));
}

namespace {

// DeepSpeed's deprecated alias `old` (true: `device` cpu) for the section `now`.
void offload_alias(DsSection& s, const char* old, const char* now, OffloadDevice& device) {
  if (!s.has(old)) return s.mark(old);
  const bool on = s.get<bool>(old, false);
  DS_USER_CHECK(!s.has(now), "config: 'zero_optimization.{}' (deprecated) and 'zero_optimization.{}' are both given; "
                "keep {} (as DeepSpeed requires)", old, now, now);
  if (on) device = OffloadDevice::CPU;
  add_warning(s.warnings(), fmt::format("config: 'zero_optimization.{}' is deprecated (as in DeepSpeed): read as "
                                        "{}.device {}", old, now, on ? "cpu" : "none"));
}

}  // namespace

void read_zero_upstream(DsSection& s, ZeroConfig& z) {
  offload_alias(s, "cpu_offload", "offload_optimizer", z.offload_optimizer);
  offload_alias(s, "cpu_offload_param", "offload_param", z.offload_param);
  s.mark("cpu_offload_use_pin_memory");
  if (s.has("cpu_offload_use_pin_memory"))
    add_warning(s.warnings(), "config: 'zero_optimization.cpu_offload_use_pin_memory' is deprecated and sets nothing "
                              "(as in DeepSpeed): use offload_optimizer.pin_memory / offload_param.pin_memory");
  // ZeRO++'s quantized weights (qwZ) and gradients (qgZ, with LoCo's error
  // feedback): stage 3 only upstream, where they change every value trained.
  for (const char* key : {"zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"}) {
    if (!s.get<bool>(key, false)) continue;
    DS_USER_CHECK(z.stage != 3, "config: 'zero_optimization.{}' is true: ZeRO++'s quantized communication is not "
                  "implemented by dstrain", key);
    add_warning(s.warnings(), fmt::format("config: 'zero_optimization.{}' has no effect below stage 3 (as in "
                                          "DeepSpeed): ignored", key));
  }
  s.mark("zeropp_loco_param");  // LoCo's settings of qgZ (refused above where it would act)
  // hpZ and MiCS: other partitions of the same values. dstrain shards over
  // the whole data-parallel group: less memory per rank, more traffic between nodes.
  if (const int64_t hpz = s.get<int64_t>("zero_hpz_partition_size", 1); hpz > 1 && z.stage == 3)
    add_warning(s.warnings(), fmt::format("config: 'zero_optimization.zero_hpz_partition_size' {} (hpZ's secondary "
                                          "partition) is not implemented: the parameters are gathered over the whole "
                                          "data-parallel group (the same values)", hpz));
  if (const int64_t mics = s.get<int64_t>("mics_shard_size", -1); mics > 0)
    add_warning(s.warnings(), fmt::format("config: 'zero_optimization.mics_shard_size' {} (MiCS) is not implemented: "
                                          "the model state is sharded over the whole data-parallel group (the same "
                                          "values up to the order of the gradient sums)", mics));
  s.mark("mics_hierarchical_params_gather");
}

}  // namespace ds
