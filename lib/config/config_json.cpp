// Reading the merged config JSON into TrainConfig.
// DeepSpeed's keys live at the root and are read leniently: whatever dstrain
// does not implement becomes a warning naming the key. Our own sections
// (model, data, training, parallel) are strict: an unknown key is an error.
// No derivation happens here (see config_validate.cpp).
#include <algorithm>
#include <cctype>
#include <cmath>

#include "lib/config/config_internal.h"
#include "lib/core/log.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer_types.h"

namespace ds {

using nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

void add_warning(Warnings& w, std::string msg) { w.push_back(std::move(msg)); }

DsSection::DsSection(const json& obj, std::string path, Warnings& w) : s_(obj, std::move(path)), w_(w) {}

DsSection DsSection::section(const std::string& key) {
  mark(key);
  const json& r = s_.raw();
  return DsSection(r.contains(key) ? r.at(key) : json::object(), s_.full(key), w_);
}

void DsSection::accept_if(const std::string& key, const json& ours) {
  mark(key);
  if (!s_.has(key) || s_.raw().at(key) == ours) return;
  add_warning(w_, fmt::format("config: '{}' = {} is not implemented by dstrain (it always uses {}); ignored",
                              full(key), s_.raw().at(key).dump(), ours.dump()));
}

void DsSection::finish() {
  for (auto it = s_.raw().begin(); it != s_.raw().end(); ++it)
    if (!read_.count(it.key()))
      add_warning(w_, fmt::format("config: DeepSpeed key '{}' is not implemented by dstrain and is ignored",
                                  full(it.key())));
}

namespace {


// A present batch key must be a positive integer (absent = derive it).
int64_t batch_key(DsSection& root, const std::string& key) {
  const int64_t v = root.get<int64_t>(key, 0);
  DS_USER_CHECK(!root.has(key) || v > 0, "config: '{}' must be a positive integer, got {}", key, v);
  return v;
}

// The keys of one optimizer type alone (DeepSpeed's / torch.optim's names and
// defaults). Keys of another type are warned about as not implemented.
void read_optimizer_keys(DsSection& p, OptimizerKind kind, OptimizerSpec& sp, Warnings& w) {
  if (kind == OptimizerKind::AdamW) {
    sp.adam_w_mode = p.get<bool>("adam_w_mode", true);
    if (!sp.adam_w_mode && sp.type == "AdamW")
      add_warning(w, fmt::format("config: '{}' = false has no effect with optimizer.type AdamW (DeepSpeed keeps "
                                 "decoupled weight decay for AdamW); use type Adam for L2 weight decay",
                                 p.full("adam_w_mode")));
    for (const char* k : {"torch_adam", "fused"})
      if (p.has(k)) {
        p.mark(k);
        add_warning(w, fmt::format("config: '{}' picks an implementation in DeepSpeed (torch.optim or fused); "
                                   "dstrain's Adam computes the same update, so it is accepted and has no effect",
                                   p.full(k)));
      }
  }
  if (kind == OptimizerKind::AdamW || kind == OptimizerKind::Lamb)
    sp.bias_correction = p.get<bool>("bias_correction", sp.bias_correction);
  if (kind == OptimizerKind::SGD) {
    sp.momentum = p.get<float>("momentum", sp.momentum);
    sp.dampening = p.get<float>("dampening", sp.dampening);
    sp.nesterov = p.get<bool>("nesterov", sp.nesterov);
    DS_USER_CHECK(sp.momentum >= 0 && sp.momentum < 1, "config: '{}' must be in [0, 1), got {}", p.full("momentum"),
                  sp.momentum);
    DS_USER_CHECK(!sp.nesterov || (sp.momentum > 0 && sp.dampening == 0),
                  "config: '{}' = true needs a momentum > 0 and zero dampening (torch.optim.SGD), got momentum {} and "
                  "dampening {}", p.full("nesterov"), sp.momentum, sp.dampening);
  }
  if (kind == OptimizerKind::Adagrad) {
    sp.lr_decay = p.get<float>("lr_decay", sp.lr_decay);
    sp.initial_accumulator_value = p.get<float>("initial_accumulator_value", sp.initial_accumulator_value);
    DS_USER_CHECK(sp.lr_decay >= 0, "config: '{}' must be >= 0, got {}", p.full("lr_decay"), sp.lr_decay);
    DS_USER_CHECK(sp.initial_accumulator_value >= 0, "config: '{}' must be >= 0, got {}",
                  p.full("initial_accumulator_value"), sp.initial_accumulator_value);
  }
  if (is_onebit(kind)) {
    auto at_least_1 = [&](const char* key, int64_t& v) {
      v = p.get<int64_t>(key, v);
      DS_USER_CHECK(v >= 1, "config: '{}' must be >= 1, got {}", p.full(key), v);
    };
    if (kind != OptimizerKind::ZeroOneAdam) at_least_1("freeze_step", sp.freeze_step);
    if (kind == OptimizerKind::ZeroOneAdam)
      for (auto [key, v] : {std::pair<const char*, int64_t*>{"var_freeze_step", &sp.var_freeze_step},
                            {"var_update_scaler", &sp.var_update_scaler},
                            {"local_step_scaler", &sp.local_step_scaler},
                            {"local_step_clipper", &sp.local_step_clipper}})
        at_least_1(key, *v);
    if (kind == OptimizerKind::OneBitLamb) {
      sp.coeff_beta = p.get<float>("coeff_beta", sp.coeff_beta);
      sp.factor_max = p.get<float>("factor_max", sp.factor_max);
      sp.factor_min = p.get<float>("factor_min", sp.factor_min);
      sp.factor_threshold = p.get<float>("factor_threshold", sp.factor_threshold);
      DS_USER_CHECK(0 <= sp.coeff_beta && sp.coeff_beta < 1, "config: '{}' must be in [0, 1), got {}",
                    p.full("coeff_beta"), sp.coeff_beta);
      DS_USER_CHECK(0 < sp.factor_min && sp.factor_min <= sp.factor_max,
                    "config: '{}' {} and '{}' {} must satisfy 0 < factor_min <= factor_max", p.full("factor_min"),
                    sp.factor_min, p.full("factor_max"), sp.factor_max);
      DS_USER_CHECK(0 <= sp.factor_threshold && sp.factor_threshold < 1, "config: '{}' must be in [0, 1), got {}",
                    p.full("factor_threshold"), sp.factor_threshold);
    }
    // Upstream's updates have no bias correction and no use for
    // eps_inside_sqrt whatever they say; cuda_aware and comm_backend_name
    // pick DeepSpeed's transport (MPI, NCCL, the compressed backend): here
    // the data-parallel group's own backend carries the exchange.
    for (const char* k : {"bias_correction", "eps_inside_sqrt", "cuda_aware"}) (void)p.get<bool>(k, false);
    const std::string backend = p.get<std::string>("comm_backend_name", "nccl");
    DS_USER_CHECK(backend == "nccl" || backend == "mpi" || backend == "compressed" || backend == "hccl",
                  "config: '{}' '{}' must be nccl, mpi, compressed or hccl", p.full("comm_backend_name"), backend);
  }
  if (kind == OptimizerKind::Lamb || kind == OptimizerKind::OneBitLamb) {
    sp.max_coeff = p.get<float>("max_coeff", sp.max_coeff);
    sp.min_coeff = p.get<float>("min_coeff", sp.min_coeff);
    if (kind == OptimizerKind::Lamb) sp.eps_inside_sqrt = p.get<bool>("eps_inside_sqrt", sp.eps_inside_sqrt);
    DS_USER_CHECK(0 < sp.min_coeff && sp.min_coeff <= sp.max_coeff,
                  "config: '{}' {} and '{}' {} must satisfy 0 < min_coeff <= max_coeff", p.full("min_coeff"),
                  sp.min_coeff, p.full("max_coeff"), sp.max_coeff);
  }
}

void read_optimizer(DsSection& root, OptimizerConfig& o) {
  if (!root.has("optimizer")) {
    root.mark("optimizer");
    return;
  }
  DsSection s = root.section("optimizer");
  const std::string type = s.get<std::string>("type", "AdamW");
  OptimizerSpec& sp = o.spec;
  sp.type = canonical_optimizer_type(type);  // the registry's spelling (lib/optim/optimizer_types.h)
  DS_USER_CHECK(!sp.type.empty(), "config: optimizer.type '{}' is not supported (dstrain implements {})", type,
                optimizer_types_text());
  const OptimizerKind kind = *optimizer_kind(sp.type);
  DsSection p = s.section("params");
  o.lr = p.get<float>("lr", o.lr);
  // Absent betas / eps: the optimizer's own defaults where DeepSpeed's class
  // differs from Adam's (FusedLamb and FusedLion (0.9, 0.999); Adagrad eps 1e-10).
  if (kind == OptimizerKind::Lamb || kind == OptimizerKind::Lion) o.beta1 = 0.9f, o.beta2 = 0.999f;
  if (kind == OptimizerKind::Adagrad) o.eps = 1e-10f;
  if (p.has("betas")) {
    const auto b = p.get<std::vector<float>>("betas", {});
    DS_USER_CHECK(b.size() == 2, "config: optimizer.params.betas must be [beta1, beta2], got {}",
                  p.raw().at("betas").dump());
    o.beta1 = b[0];
    o.beta2 = b[1];
  }
  p.mark("betas");
  o.eps = p.get<float>("eps", o.eps);
  o.weight_decay = p.get<float>("weight_decay", o.weight_decay);
  p.mark("max_grad_norm");
  DS_USER_CHECK(!p.has("max_grad_norm"), "config: 'optimizer.params.max_grad_norm' is not supported (as in "
                "DeepSpeed): use gradient_clipping (--clip-grad)");
  DS_USER_CHECK(!p.get<bool>("amsgrad", false), "config: 'optimizer.params.amsgrad' = true is not implemented by "
                "dstrain; remove it or set it to false");
  read_optimizer_keys(p, kind, sp, root.warnings());
  p.finish();
  s.finish();
}

WarmupKind read_warmup_type(DsSection& p) {
  const std::string t = p.get<std::string>("warmup_type", "log");  // DeepSpeed's default
  if (t == "log") return WarmupKind::Log;
  if (t == "linear") return WarmupKind::Linear;
  DS_USER_ERROR("config: scheduler.params.warmup_type '{}' is not supported (use \"linear\" or \"log\")", t);
}

// OneCycle / LRRangeTest params (DeepSpeed's keys and defaults; OneCycle's
// cycle_min_lr and cycle_max_lr have none there, so they are required).
void read_cycle_scheduler(DsSection& p, OptimizerConfig& o, const std::string& type, Warnings& w) {
  auto positive = [&](const char* key, int64_t v, bool zero_ok) {
    DS_USER_CHECK(zero_ok ? v >= 0 : v > 0, "config: '{}' must be {}, got {}", p.full(key),
                  zero_ok ? ">= 0" : "a positive integer", v);
  };
  o.warmup_iters = 0;
  if (type == "LRRangeTest") {
    LrRangeTestParams& r = o.range_test;
    r.min_lr = p.get<float>("lr_range_test_min_lr", r.min_lr);
    r.step_size = p.get<int64_t>("lr_range_test_step_size", r.step_size);
    r.step_rate = p.get<float>("lr_range_test_step_rate", r.step_rate);
    r.staircase = p.get<bool>("lr_range_test_staircase", r.staircase);
    positive("lr_range_test_step_size", r.step_size, false);
    DS_USER_CHECK(r.min_lr >= 0 && r.step_rate >= 0, "config: '{}' {} and '{}' {} must be >= 0",
                  p.full("lr_range_test_min_lr"), r.min_lr, p.full("lr_range_test_step_rate"), r.step_rate);
    o.lr = r.min_lr;  // what the optimizer starts with
    return;
  }
  OneCycleParams& c = o.one_cycle;
  for (const char* key : {"cycle_min_lr", "cycle_max_lr"})
    DS_USER_CHECK(p.has(key), "config: '{}' is required by scheduler.type OneCycle", p.full(key));
  c.cycle_min_lr = p.get<float>("cycle_min_lr", 0.f);
  c.cycle_max_lr = p.get<float>("cycle_max_lr", 0.f);
  c.decay_lr_rate = p.get<float>("decay_lr_rate", c.decay_lr_rate);
  c.cycle_first_step_size = p.get<int64_t>("cycle_first_step_size", c.cycle_first_step_size);
  c.cycle_second_step_size = p.get<int64_t>("cycle_second_step_size", c.cycle_first_step_size);
  c.cycle_first_stair_count = p.get<int64_t>("cycle_first_stair_count", c.cycle_first_stair_count);
  c.cycle_second_stair_count = p.get<int64_t>("cycle_second_stair_count", c.cycle_first_stair_count);
  c.decay_step_size = p.get<int64_t>("decay_step_size", c.decay_step_size);
  c.cycle_momentum = p.get<bool>("cycle_momentum", c.cycle_momentum);
  c.cycle_min_mom = p.get<float>("cycle_min_mom", c.cycle_min_mom);
  c.cycle_max_mom = p.get<float>("cycle_max_mom", c.cycle_max_mom);
  c.decay_mom_rate = p.get<float>("decay_mom_rate", c.decay_mom_rate);
  positive("cycle_first_step_size", c.cycle_first_step_size, false);
  positive("cycle_second_step_size", c.cycle_second_step_size, true);
  positive("cycle_first_stair_count", c.cycle_first_stair_count, true);
  positive("cycle_second_stair_count", c.cycle_second_stair_count, true);
  positive("decay_step_size", c.decay_step_size, true);
  DS_USER_CHECK(0 <= c.cycle_min_lr && c.cycle_min_lr <= c.cycle_max_lr,
                "config: '{}' {} and '{}' {} must satisfy 0 <= cycle_min_lr <= cycle_max_lr", p.full("cycle_min_lr"),
                c.cycle_min_lr, p.full("cycle_max_lr"), c.cycle_max_lr);
  DS_USER_CHECK(0 <= c.cycle_min_mom && c.cycle_max_mom < 1, "config: '{}' {} and '{}' {} must be in [0, 1)",
                p.full("cycle_min_mom"), c.cycle_min_mom, p.full("cycle_max_mom"), c.cycle_max_mom);
  o.lr = std::max(c.cycle_max_lr, c.cycle_min_lr);  // the peak, for the lr checks
  if (c.cycle_momentum && !cycles_momentum(o))
    add_warning(w, fmt::format("config: '{}' is true but optimizer.type {} has no betas: its momentum is not cycled "
                               "(as in DeepSpeed)", p.full("cycle_momentum"), o.spec.type));
}

// Maps a DeepSpeed scheduler onto OptimizerConfig; defaults are DeepSpeed's.
void read_scheduler(DsSection& root, TrainConfig& cfg) {
  OptimizerConfig& o = cfg.optim;
  if (!root.has("scheduler")) {
    root.mark("scheduler");
    return;
  }
  DsSection s = root.section("scheduler");
  const std::string type = s.get<std::string>("type", "");
  o.scheduler = LrScheduler::Megatron;
  for (const auto& [k, name] : kLrSchedulerNames)
    if (type == name) o.scheduler = k;
  DS_USER_CHECK(o.scheduler != LrScheduler::Megatron,
                "config: scheduler.type '{}' is not supported (use WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                "OneCycle or LRRangeTest, or drop 'scheduler' for the Megatron schedule)", type);
  DsSection p = s.section("params");
  if (type == "OneCycle" || type == "LRRangeTest") {
    read_cycle_scheduler(p, o, type, root.warnings());
    p.mark("last_batch_iteration");
    p.finish();
    s.finish();
    return;
  }
  o.warmup_iters = p.get<int64_t>("warmup_num_steps", 1000);
  o.warmup_type = read_warmup_type(p);
  o.decay_iters = type == "WarmupLR" ? 0 : p.get<int64_t>("total_num_steps", 0);  // 0: train_iters
  if (type == "WarmupCosineLR") {
    o.warmup_min_ratio = p.get<float>("warmup_min_ratio", 0.f);
    o.cos_min_ratio = p.get<float>("cos_min_ratio", 0.0001f);
    o.decay = LrDecay::Cosine;
    o.min_lr = o.cos_min_ratio * o.lr;
    o.warmup_min_lr = o.warmup_min_ratio * o.lr;
  } else {
    o.warmup_min_lr = p.get<float>("warmup_min_lr", 0.f);
    // WarmupLR defaults to the optimizer's lr; WarmupDecayLR to 0.001 (as in DeepSpeed).
    o.lr = p.get<float>("warmup_max_lr", type == "WarmupLR" ? o.lr : 0.001f);
    o.decay = type == "WarmupLR" ? LrDecay::Constant : LrDecay::Linear;
    o.min_lr = type == "WarmupLR" ? o.lr : o.warmup_min_lr;
  }
  p.mark("last_batch_iteration");  // resuming is driven by the checkpoint's iteration
  p.finish();
  s.finish();
}

// data_types.grad_accum_dtype, with DeepSpeed's spellings. Only fp32 or the
// compute dtype are accepted: our backward computes a unit's gradient in f32
// and can round it to the compute dtype, not to a third one.
void read_grad_accum_dtype(DsSection& root, PrecisionConfig& pc) {
  DsSection types = root.section("data_types");
  const std::string key = types.full("grad_accum_dtype");
  const std::string v = types.get<std::string>("grad_accum_dtype", "fp32");
  types.finish();
  DType d = DType::F32;
  if (v == "fp32" || v == "float32" || v == "float")
    d = DType::F32;
  else if (v == "bf16" || v == "bfloat16")
    d = DType::BF16;
  else if (v == "fp16" || v == "float16" || v == "half")
    d = DType::F16;
  else
    DS_USER_CHECK(false, "config: '{}' is '{}'; use \"fp32\", \"bf16\" or \"fp16\"", key, v);
  const DType compute = pc.precision == Precision::BF16   ? DType::BF16
                        : pc.precision == Precision::FP16 ? DType::F16
                                                          : DType::F32;
  DS_USER_CHECK(d == DType::F32 || d == compute,
                "config: '{}' is '{}' but the model computes in {}; use \"fp32\" or the compute dtype{}", key, v,
                pc.precision == Precision::FP32 ? "fp32" : pc.precision == Precision::BF16 ? "bf16" : "fp16",
                pc.precision == Precision::FP32 ? " (or enable bf16 / fp16)" : "");
  pc.grad_accum = d;
}

void read_precision(DsSection& root, PrecisionConfig& pc) {
  DsSection f = root.section("fp16");
  // "bfloat16" is DeepSpeed's older spelling of "bf16".
  DsSection b = root.section(root.has("bfloat16") && !root.has("bf16") ? "bfloat16" : "bf16");
  const bool fp16 = f.get<bool>("enabled", false), bf16 = b.get<bool>("enabled", false);
  DS_USER_CHECK(!(fp16 && bf16), "config: fp16.enabled and bf16.enabled are both true; choose one (or --fp16 / --bf16)");
  pc.precision = fp16 ? Precision::FP16 : bf16 ? Precision::BF16 : Precision::FP32;
  read_fields(f, pc, fp16_fields());
  if (fp16) {  // a disabled section changes nothing: no warnings for it
    refuse_16bit_master(f, "fp16_master_weights_and_grads");
    f.finish();
  }
  if (bf16) b.finish();
  read_grad_accum_dtype(root, pc);
}

// An offload section's "device" (what = "offload_optimizer" / "offload_param").
OffloadDevice read_offload_device(DsSection& sec, const char* what, OffloadDevice current) {
  const std::string d = sec.get<std::string>("device", offload_device_name(current));
  for (OffloadDevice v : {OffloadDevice::None, OffloadDevice::CPU, OffloadDevice::NVMe})
    if (d == offload_device_name(v)) return v;
  DS_USER_ERROR("zero_optimization.{}.device '{}' is not supported (use \"none\", \"cpu\" or \"nvme\")", what, d);
}

void read_zero(DsSection& root, ZeroConfig& z) {
  DsSection s = root.section("zero_optimization");
  const bool overlap_given = s.has("overlap_comm");
  read_fields(s, z, zero_fields());
  // DeepSpeed's dynamic default: overlap_comm is on at stage 3 unless the
  // config says otherwise (the same values either way; see docs/zero.md).
  if (!overlap_given) z.overlap_comm = z.stage == 3;
  read_zero_upstream(s, z);
  s.accept_if("allgather_partitions", true);
  s.accept_if("reduce_scatter", true);
  s.accept_if("round_robin_gradients", false);
  DsSection off = s.section("offload_optimizer");
  z.offload_optimizer = read_offload_device(off, "offload_optimizer", z.offload_optimizer);
  z.offload_pin_memory = off.get<bool>("pin_memory", z.offload_pin_memory);
  // DeepSpeed's partial offload: the share of the optimizer state offloaded
  // (placement only: the update's values are the same either way).
  if (z.offload_optimizer != OffloadDevice::None) z.offload_ratio = off.get<double>("ratio", z.offload_ratio);
  NvmeOffloadConfig& nv = z.nvme;
  if (z.offload_optimizer == OffloadDevice::NVMe) read_fields(off, nv, nvme_fields());
  if (z.offload_optimizer != OffloadDevice::None) off.finish();
  // The aio section (root level) shapes the NVMe swap files' requests.
  DsSection aio = root.section("aio");
  AioConfig& a = nv.aio;
  // thread_count: the older name of intra_op_parallelism (the table's key wins).
  a.intra_op_parallelism = aio.get<int>("thread_count", a.intra_op_parallelism);
  read_fields(aio, a, aio_fields());
  if (aio.get<bool>("use_gds", false))
    add_warning(root.warnings(), "config: aio.use_gds (GPUDirect Storage) is not implemented; the NVMe tier reads "
                                 "and writes through host buffers");
  aio.finish();
  DsSection offp = s.section("offload_param");
  z.offload_param = read_offload_device(offp, "offload_param", z.offload_param);
  if (z.offload_param != OffloadDevice::None) {
    z.param_nvme_path = offp.get<std::string>("nvme_path", z.param_nvme_path);
    z.param_pin_memory = offp.get<bool>("pin_memory", z.param_pin_memory);
    // DeepSpeed's parameter swap buffers and its CPU cache of swapped
    // parameters: here a gathered piece is read straight into the gather
    // buffer, so they size nothing (accepted, as memory-only settings).
    for (const char* k : {"buffer_count", "buffer_size", "max_in_cpu"}) offp.mark(k);
    offp.finish();
  }
  s.finish();
}

// Monitoring / profiling sections: silent when disabled, a warning when enabled.
void read_optional_features(DsSection& root, LoggingConfig& log) {
  DsSection csv = root.section("csv_monitor");
  read_fields(csv, log, csv_monitor_fields());
  csv.finish();
  DsSection tb = root.section("tensorboard");
  read_fields(tb, log, tensorboard_fields());
  tb.finish();
  for (const char* key : {"wandb", "comet", "flops_profiler", "comms_logger"}) {
    root.mark(key);
    if (!root.has(key)) continue;
    const json& sec = root.raw().at(key);
    if (sec.is_object() && !sec.value("enabled", false)) continue;
    add_warning(root.warnings(), fmt::format("config: DeepSpeed section '{}' (enabled) is not implemented by "
                                             "dstrain and is ignored", key));
  }
  // Gradients are reduced and averaged in f32, so dividing by the data-parallel
  // size before or after the sum changes only the last bits: either value is honoured.
  (void)root.get<bool>("prescale_gradients", false);
  log.wall_clock_breakdown = root.get<bool>("wall_clock_breakdown", log.wall_clock_breakdown);
  root.accept_if("memory_breakdown", false);
}

// DeepSpeed Compression and Data Efficiency. Compression's activation
// quantization is read (DeepSpeed's keys and defaults, compression/config.py);
// every other technique that would change what is trained is refused, and what
// upstream leaves inert is accepted with one line.
//   compression_training: Megatron-DeepSpeed runs init_compression whenever the
//     section is present; a technique acts when its shared_parameters.enabled
//     (layer_reduction: its own enabled) is true.
//   data_efficiency.data_routing.random_ltd: random-LTD (config_data_efficiency.cpp),
//     acting with Megatron's --random-ltd.
//   data_efficiency.data_sampling.curriculum_learning: curriculum learning by
//     data sampling (config_data_efficiency.cpp), acting with Megatron's
//     --data-efficiency-curriculum-learning.
// The different_groups' module patterns (default "*", as DeepSpeed).
std::vector<std::string> group_modules(DsSection& gs) {
  gs.mark("modules");
  const nlohmann::json mods = gs.raw().value("modules", nlohmann::json::array({"*"}));
  DS_USER_CHECK(mods.is_array() && !mods.empty(), "config: '{}' must be a non-empty list of module-name patterns",
                gs.full("modules"));
  std::vector<std::string> out;
  for (const auto& m : mods) {
    DS_USER_CHECK(m.is_string(), "config: '{}' must hold strings, got {}", gs.full("modules"), m.dump());
    out.push_back(m.get<std::string>());
  }
  gs.mark("related_modules");
  return out;
}

// Each of a technique's different_groups (required, an object of objects):
// read(name, its section, its params section, its module patterns).
template <class Read>
void for_each_group(DsSection& t, const char* technique, Read&& read) {
  t.mark("different_groups");
  DS_USER_CHECK(t.has("different_groups") && t.raw().at("different_groups").is_object(),
                "config: '{}' is required (an object of groups) when {} is enabled", t.full("different_groups"),
                technique);
  DsSection groups = t.section("different_groups");
  for (const auto& [name, g] : t.raw().at("different_groups").items()) {
    DS_USER_CHECK(g.is_object(), "config: '{}' must be an object", groups.full(name));
    DsSection gs = groups.section(name);
    DsSection params = gs.section("params");
    read(name, params, group_modules(gs));
    params.finish();
    gs.finish();
  }
  groups.finish();
}

void read_activation_quantization(DsSection& t, CompressionConfig& c) {
  DsSection sp = t.section("shared_parameters");
  c.act_quant = true;
  const std::string type = sp.get<std::string>("quantization_type", "symmetric");
  DS_USER_CHECK(type == "symmetric" || type == "asymmetric", "config: '{}' must be symmetric or asymmetric, got '{}'",
                sp.full("quantization_type"), type);
  c.act_symmetric = type == "symmetric";
  const std::string range = sp.get<std::string>("range_calibration", "dynamic");
  DS_USER_CHECK(range == "static" || range == "dynamic", "config: '{}' must be static or dynamic, got '{}'",
                sp.full("range_calibration"), range);
  c.act_static = range == "static";
  c.act_offset = sp.get<int64_t>("schedule_offset", 1000);
  DS_USER_CHECK(c.act_offset >= 0, "config: '{}' must be >= 0, got {}", sp.full("schedule_offset"), c.act_offset);
  (void)sp.get<bool>("enabled", true);
  for_each_group(t, "activation quantization",
                 [&](const std::string& name, DsSection& params, std::vector<std::string> modules) {
                   params.mark("bits");
                   DS_USER_CHECK(params.has("bits"), "config: '{}' is required", params.full("bits"));
                   ActQuantGroup q{.name = name, .bits = params.get<int>("bits", 8), .modules = std::move(modules)};
                   DS_USER_CHECK(q.bits == 4 || q.bits == 8,
                                 "config: '{}' is {}: DeepSpeed quantizes activations to 4 or 8 bits",
                                 params.full("bits"), q.bits);
                   c.act_groups.push_back(std::move(q));
                 });
  sp.finish();
  t.finish();
}

void read_weight_quantization(DsSection& t, CompressionConfig& c) {
  DsSection sp = t.section("shared_parameters");
  c.weight_quant = true;
  (void)sp.get<bool>("enabled", true);
  DS_USER_CHECK(!sp.get<bool>("quantize_weight_in_forward", false),
                "config: '{}' is true: quantizing the weights in the forward is not implemented yet (dstrain runs "
                "DeepSpeed's default, MoQ: the fp16 weights quantized after each optimizer step)",
                sp.full("quantize_weight_in_forward"));
  DS_USER_CHECK(!sp.get<bool>("quantizer_kernel", false),
                "config: '{}' is true: DeepSpeed's CUDA quantizer kernel (which rounds stochastically unless "
                "'rounding' is 'nearest_neighbor') is not implemented; set it false", sp.full("quantizer_kernel"));
  c.wq_offset = sp.get<int64_t>("schedule_offset", 0);
  DS_USER_CHECK(c.wq_offset >= 0, "config: '{}' must be >= 0, got {}", sp.full("schedule_offset"), c.wq_offset);
  c.wq_groups = sp.get<int64_t>("quantize_groups", 1);
  DS_USER_CHECK(c.wq_groups >= 1, "config: '{}' must be >= 1, got {}", sp.full("quantize_groups"), c.wq_groups);
  c.wq_verbose = sp.get<bool>("quantize_verbose", false);
  const std::string type = sp.get<std::string>("quantization_type", "symmetric");
  DS_USER_CHECK(type == "symmetric" || type == "asymmetric", "config: '{}' must be symmetric or asymmetric, got '{}'",
                sp.full("quantization_type"), type);
  c.wq_symmetric = type == "symmetric";
  const std::string rounding = sp.get<std::string>("rounding", "nearest");
  DS_USER_CHECK(rounding == "nearest" || rounding == "stochastic", "config: '{}' must be nearest or stochastic, got '{}'",
                sp.full("rounding"), rounding);
  DS_USER_CHECK(rounding == "nearest", "config: '{}' is stochastic: stochastic rounding of the weights is not "
                "implemented yet", sp.full("rounding"));
  sp.mark("fp16_mixed_quantize");
  const nlohmann::json mixed = sp.raw().value("fp16_mixed_quantize", nlohmann::json::object());
  DS_USER_CHECK(!(mixed.is_object() && mixed.value("enabled", false) == true),
                "config: '{}.enabled' is true: mixing the fp16 and quantized weights is not implemented yet",
                sp.full("fp16_mixed_quantize"));
  for_each_group(t, "weight quantization",
                 [&](const std::string& name, DsSection& params, std::vector<std::string> modules) {
                   for (const char* k : {"start_bits", "target_bits"}) {
                     params.mark(k);
                     DS_USER_CHECK(params.has(k), "config: '{}' is required", params.full(k));
                   }
                   WeightQuantGroup q{.name = name,
                                      .start_bits = params.get<int>("start_bits", 8),
                                      .target_bits = params.get<int>("target_bits", 8),
                                      .period = params.get<int64_t>("quantization_period", 1),
                                      .modules = std::move(modules)};
                   DS_USER_CHECK(q.target_bits >= 3 && q.start_bits >= q.target_bits && q.start_bits <= 16,
                                 "config: '{}' {} and '{}' {}: dstrain quantizes weights to 3-16 bits, start_bits >= "
                                 "target_bits (DeepSpeed's ternary and binary weights are not implemented)",
                                 params.full("start_bits"), q.start_bits, params.full("target_bits"), q.target_bits);
                   DS_USER_CHECK(q.period >= 1, "config: '{}' must be >= 1, got {}",
                                 params.full("quantization_period"), q.period);
                   c.wq_list.push_back(std::move(q));
                 });
  sp.finish();
  t.finish();
}

void read_compression_and_data_efficiency(DsSection& root, CompressionConfig& comp, RandomLtdConfig& ltd,
                                          DataSamplingConfig& ds, bool sampling_flag, Warnings& w) {
  root.mark("compression_training");
  if (root.has("compression_training")) {
    DS_USER_CHECK(root.raw().at("compression_training").is_object(),
                  "config: 'compression_training' must be a JSON object");
    DsSection c = root.section("compression_training");
    bool any = false;
    for (const char* tech : {"weight_quantization", "activation_quantization", "sparse_pruning", "row_pruning",
                             "head_pruning", "channel_pruning"}) {
      c.mark(tech);
      if (!c.has(tech) || !c.raw().at(tech).is_object()) continue;
      DsSection t = c.section(tech);
      const nlohmann::json& shared = t.raw().value("shared_parameters", nlohmann::json::object());
      const bool on = shared.is_object() && shared.value("enabled", false) == true;
      if (!on) continue;
      const std::string name = tech;
      DS_USER_CHECK(name == "activation_quantization" || name == "weight_quantization",
                    "config: 'compression_training.{}.shared_parameters.enabled' is true: this DeepSpeed Compression "
                    "technique is not implemented by dstrain (it would train an uncompressed model); remove the "
                    "section or disable the technique", tech);
      if (name == "weight_quantization")
        read_weight_quantization(t, comp);
      else
        read_activation_quantization(t, comp);
      any = true;
    }
    c.mark("layer_reduction");
    const nlohmann::json lr = c.raw().value("layer_reduction", nlohmann::json::object());
    DS_USER_CHECK(!(lr.is_object() && lr.value("enabled", false) == true),
                  "config: 'compression_training.layer_reduction.enabled' is true: Megatron-DeepSpeed cannot run "
                  "it either (it calls init_compression without the teacher model that DeepSpeed's layer "
                  "reduction asserts); train a smaller student with --kd (knowledge distillation) instead, or "
                  "disable it");
    if (!any) add_warning(w, "config: 'compression_training' enables no technique; nothing is compressed (as upstream)");
  }
  root.mark("data_efficiency");
  if (!root.has("data_efficiency")) return;
  DsSection d = root.section("data_efficiency");
  DsSection routing = d.section("data_routing");
  read_random_ltd(routing, ltd);
  d.mark("enabled");  // upstream acts on each feature's own enabled key
  DsSection sampling = d.section("data_sampling");
  read_data_sampling(d, sampling, ds, sampling_flag);
}

// A list of positive integers at `key` of `s` (curriculum_learning's
// fixed_discrete schedule); anything else is an error naming the key.
std::vector<int64_t> positive_list(DsSection& s, const std::string& key, const std::string& what) {
  s.mark(key);
  DS_USER_CHECK(s.has(key), "config: '{}' is required by the fixed_discrete schedule ({})", s.full(key), what);
  const json& v = s.raw().at(key);
  DS_USER_CHECK(v.is_array() && !v.empty(), "config: '{}' must be a non-empty list of positive integers, got {}",
                s.full(key), v.dump());
  std::vector<int64_t> out;
  for (const json& e : v) {
    const bool whole = e.is_number_integer() || e.is_number_unsigned() ||
                       (e.is_number_float() && std::isfinite(e.get<double>()) &&
                        std::trunc(e.get<double>()) == e.get<double>() && std::fabs(e.get<double>()) < 9e15);
    DS_USER_CHECK(whole && e.get<double>() >= 1 && e.get<double>() <= 9e15,
                  "config: '{}' must be a list of positive integers, got {}", s.full(key), v.dump());
    out.push_back(e.is_number_float() ? static_cast<int64_t>(e.get<double>()) : e.get<int64_t>());
  }
  return out;
}

}  // namespace

// A curriculum schedule's keys in section `s` (DeepSpeed's CurriculumScheduler:
// min_difficulty, max_difficulty, schedule_type, schedule_config), for the
// legacy curriculum_learning section and each data-sampling metric.
void read_curriculum_schedule(DsSection& s, CurriculumConfig& c) {
  auto required = [&](const std::string& key) {
    DS_USER_CHECK(s.has(key), "config: curriculum learning is enabled but '{}' is missing", s.full(key));
  };
  required("min_difficulty");
  required("max_difficulty");
  required("schedule_type");
  c.min_difficulty = s.get<int64_t>("min_difficulty", 0);
  c.max_difficulty = s.get<int64_t>("max_difficulty", 0);
  const std::string kind = s.get<std::string>("schedule_type", "");
  if (kind == "fixed_linear") c.schedule = CurriculumSchedule::FixedLinear;
  else if (kind == "fixed_root") c.schedule = CurriculumSchedule::FixedRoot;
  else if (kind == "fixed_discrete") c.schedule = CurriculumSchedule::FixedDiscrete;
  else
    DS_USER_ERROR("config: '{}' is \"{}\"; expected fixed_linear, fixed_root or fixed_discrete (a custom schedule "
                  "needs DeepSpeed's Python API)", s.full("schedule_type"), kind);
  DsSection sc = s.section("schedule_config");
  if (c.schedule == CurriculumSchedule::FixedDiscrete) {
    c.difficulty = positive_list(sc, "difficulty", "the difficulties in order");
    c.max_step = positive_list(sc, "max_step", "the last step of each difficulty but the last");
  } else {
    for (const char* key : {"total_curriculum_step", "difficulty_step"})
      DS_USER_CHECK(sc.has(key), "config: '{}' is required by the {} schedule", sc.full(key), kind);
    c.total_curriculum_step = sc.get<int64_t>("total_curriculum_step", 0);
    c.difficulty_step = sc.get<int64_t>("difficulty_step", 0);
    if (c.schedule == CurriculumSchedule::FixedRoot) {
      DS_USER_CHECK(sc.has("root_degree"), "config: '{}' is required by the fixed_root schedule",
                    sc.full("root_degree"));
      c.root_degree = sc.get<double>("root_degree", 1.0);
    } else if (sc.has("root_degree")) {
      sc.mark("root_degree");
      add_warning(s.warnings(), fmt::format("config: '{}' is ignored by the fixed_linear schedule (degree 1)",
                                            sc.full("root_degree")));
    }
  }
  sc.finish();
}

json curriculum_schedule_json(const CurriculumConfig& c) {
  if (c.schedule == CurriculumSchedule::FixedDiscrete) return {{"difficulty", c.difficulty}, {"max_step", c.max_step}};
  json sc = {{"total_curriculum_step", c.total_curriculum_step}, {"difficulty_step", c.difficulty_step}};
  if (c.schedule == CurriculumSchedule::FixedRoot) sc["root_degree"] = c.root_degree;
  return sc;
}

namespace {

// DeepSpeed's legacy `curriculum_learning` section. Disabled (or absent
// `enabled`, as Megatron-DeepSpeed reads it): silent, nothing happens.
void read_curriculum(DsSection& root, CurriculumConfig& c) {
  DsSection s = root.section("curriculum_learning");
  c.enabled = s.get<bool>("enabled", false);
  if (!c.enabled) return;
  DS_USER_CHECK(s.has("curriculum_type"), "config: curriculum_learning is enabled but '{}' is missing",
                s.full("curriculum_type"));
  const std::string type = s.get<std::string>("curriculum_type", "");
  DS_USER_CHECK(type == "seqlen",
                "config: '{}' is \"{}\"; dstrain implements only \"seqlen\" (sequence-length warmup); remove the "
                "curriculum_learning section or set curriculum_type to seqlen", s.full("curriculum_type"), type);
  read_curriculum_schedule(s, c);
  if (c.schedule != CurriculumSchedule::FixedDiscrete && c.difficulty_step > 0 && c.difficulty_step % 8 != 0)
    add_warning(root.warnings(),  // DeepSpeed's advice, as a warning
                fmt::format("config: 'curriculum_learning.schedule_config.difficulty_step' {} is not a multiple of 8: "
                            "sequence lengths that are not multiples of 8 keep tensor cores partly idle on GPUs",
                            c.difficulty_step));
  s.finish();
}

}  // namespace

// Our own sections (config_sections.cpp).
void read_model_section(JsonSection s, ModelConfig& m);
void read_data_section(JsonSection s, DataConfig& d);
void read_training_section(JsonSection s, TrainConfig& cfg, bool has_ds_scheduler, bool has_steps_per_print);
void read_parallel_section(JsonSection s, ParallelConfig& p, ZeroConfig& z);

void read_config_json(const json& j, TrainConfig& cfg, Warnings& w) {
  DsSection root(j, "", w);
  BatchConfig& b = cfg.batch;
  b.train_batch_size = batch_key(root, "train_batch_size");
  b.micro_batch_size = batch_key(root, "train_micro_batch_size_per_gpu");
  b.grad_accum_steps = batch_key(root, "gradient_accumulation_steps");
  root.mark("elasticity");
  if (root.has("elasticity")) {
    JsonSection es(j.at("elasticity"), "elasticity");
    b.elasticity = read_elasticity_section(es);
    es.finish(UnknownKeys::Warn);
  }
  cfg.optim.grad_clip = root.get<float>("gradient_clipping", cfg.optim.grad_clip);
  cfg.log.steps_per_print = root.get<int64_t>("steps_per_print", cfg.log.steps_per_print);
  read_optimizer(root, cfg.optim);
  read_scheduler(root, cfg);
  read_precision(root, cfg.precision);
  read_zero(root, cfg.zero);
  read_optional_features(root, cfg.log);
  read_upstream_sections(root);
  read_curriculum(root, cfg.curriculum);
  // Megatron's --data-efficiency-curriculum-learning (our training section) decides whether
  // the data-sampling curriculum is read in full.
  const json flag = j.value(json::json_pointer("/training/data_efficiency_curriculum_learning"), json(false));
  read_compression_and_data_efficiency(root, cfg.compression, cfg.random_ltd, cfg.data_sampling,
                                       flag.is_boolean() && flag.get<bool>(), w);
  // DeepSpeed's data loader drops a short last batch: Megatron trains from it
  // only with the data-sampling curriculum (its own sampler drops nothing).
  cfg.data_sampling.drop_last = root.get<bool>("dataloader_drop_last", false);
  for (const char* k : {"model", "data", "training", "parallel"}) root.mark(k);
  read_model_section(JsonSection(j.value("model", json::object()), "model"), cfg.model);
  read_data_section(JsonSection(j.value("data", json::object()), "data"), cfg.data);
  read_training_section(JsonSection(j.value("training", json::object()), "training"), cfg,
                        cfg.optim.scheduler != LrScheduler::Megatron, root.has("steps_per_print"));
  read_parallel_section(JsonSection(j.value("parallel", json::object()), "parallel"), cfg.parallel, cfg.zero);
  if (root.has("sequence_parallel_size")) {  // DeepSpeed's key for the Ulysses degree
    const int v = root.get<int>("sequence_parallel_size", 1);
    DS_USER_CHECK(cfg.parallel.sp == 1 || cfg.parallel.sp == v,
                  "sequence_parallel_size {} disagrees with parallel.ds_sequence_parallel_size "
                  "(--ds-sequence-parallel-size) {}; give one of them", v, cfg.parallel.sp);
    cfg.parallel.sp = v;
  }
  root.finish();
}

}  // namespace ds
