// Memory estimate for --estimate-memory: model states from the ZeRO byte
// formulas (lib/parallel/zero_partition), the ZeRO-3 working set from the
// fetch plan over the layout's layer units, and activations from what
// GptModel keeps per layer. Approximations are stated in the report itself.
#include "lib/train/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "lib/core/error.h"
#include "lib/model/layout.h"
#include "lib/model/param_store.h"
#include "lib/parallel/pipeline_p2p_plan.h"
#include "lib/runtime/nvme_tier.h"
#include "lib/runtime/offload_pipeline.h"
#include "lib/runtime/zero_optimizer.h"

namespace ds {
namespace {

constexpr int kAssumedVocab = 50257;  // GPT-2's BPE vocabulary

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The model config with a vocabulary filled in (GPT-2's when none is known).
ModelConfig resolved_model(const TrainConfig& cfg, bool& assumed) {
  ModelConfig m = cfg.model;
  assumed = m.vocab_size <= 0;
  if (assumed) {
    m.vocab_size = kAssumedVocab;
    m.padded_vocab_size = 0;
  }
  if (m.padded_vocab_size <= 0)
    m.padded_vocab_size = padded_vocab(m.vocab_size, std::max(1, m.make_vocab_size_divisible_by), cfg.parallel.tp);
  return m;
}

// Layer-granular units of the flat buffer: embeddings, each layer, final norm + head.
std::vector<Range> layer_units(const ModelLayout& layout) {
  std::vector<Range> units;
  int cur = -2;
  for (const ParamSpec& p : layout.params) {
    if (p.layer != cur) {
      units.push_back({p.offset, p.offset});
      cur = p.layer;
    }
    units.back().end = p.offset + p.numel;
  }
  return units;
}

// Expert parallelism: the expert weights of the whole model's layout that
// one of `ep` expert-parallel ranks holds. Each MoE layer's experts are
// stacked tensors (E, ...) named "layers.L.mlp.experts.*", of which a rank
// holds E / EP rows; the router and a PR-MoE dense MLP are not split. Counted
// here from the tensor names while the layout itself does not know EP.
int64_t expert_params_per_rank(const ModelLayout& whole, int ep) {
  int64_t n = 0;
  for (const ParamSpec& p : whole.params)
    if (p.name.find(".mlp.experts.") != std::string::npos) n += p.numel / ep;
  return n;
}

// Activation bytes of one rank (see docs/zero.md for the per-token counts).
ActivationBytes activation_bytes(const TrainConfig& cfg, const ParallelLayout& pl, const ModelDims& d) {
  const int64_t B = cfg.batch.micro_batch_size > 0 ? cfg.batch.micro_batch_size : 1;
  // Tokens per micro-batch on this rank: a Ulysses rank holds T/U positions
  // (inside attention all T with NH/U heads: the same element count).
  const int64_t N = B * pl.local_seq();
  const int64_t a = cfg.precision.precision == Precision::FP32 ? 4 : 2;  // activation element
  const int64_t s = 4;                                                    // statistics are fp32
  const int64_t tp = pl.tp, sp = pl.sequence_parallel ? tp : 1;
  const int64_t C = d.C, F = d.F, F_in = d.swiglu ? 2 * F : F;
  // Per token of one layer: parts split by TP, parts split only by sequence parallelism.
  // qkv widths of all tp ranks together: (NH + 2*NKV)*HS, kv heads replicated when NKV < TP
  const int64_t QKV = (int64_t{d.NH} + 2 * int64_t{d.NKV} * std::max<int64_t>(1, tp / d.NKV)) * d.HS;
  // qkv (+pre-rope), attn, fc, act; activation quantization keeps the
  // attention proj's quantized input beside the attention output.
  const int64_t tp_elems = QKV + (d.rope ? QKV : 0) + C + F_in + F + (cfg.compression.act_quant ? C : 0);
  const int64_t seq_elems = 4 * C;  // norm1 out, residual mid, norm2 out, layer input residual
  const int64_t layer_full = N * a * tp_elems / tp + N * a * seq_elems / sp  // stored tensors
                             + N * s * d.NH / tp + N * s * 4 / sp;           // lse, norm mean/rstd
  const int64_t layer_input = N * a * C / sp;
  const bool full_recompute = cfg.parallel.recompute == RecomputeKind::Full;
  const int64_t per_layer = full_recompute ? layer_input : layer_full;
  const int64_t layers = ceil_div(d.L, cfg.parallel.pp);
  const int64_t in_flight = cfg.parallel.pp;  // 1F1B: the first stage holds PP micro-batches
  // Mixture of Experts (docs/moe.md): an MoE layer keeps, instead of the dense
  // fc / act, the router's (N, E) logits and gates and (N, K) choices, and its
  // experts' buffers, E x rows x (input, fc, act, output), rows the capacity
  // (dropless: N K / E, the balanced load); PR-MoE adds a dense MLP's and the
  // mix's tensors. Every tp rank runs the experts on the same tokens (with
  // expert tensor parallelism each on its slice of fc / act); with sequence
  // parallelism each tp rank runs them on the whole sequence, and under
  // Ulysses each Ulysses rank on all T positions (Nm tokens).
  const int64_t etp = d.expert_tp ? tp : 1;
  const int64_t Nm = N * pl.ulysses;
  int64_t moe_layers = 0, moe_extra = 0;
  for (int l = 0; l < d.L; ++l) {
    const int64_t E = d.layer_experts(l);
    if (E <= 1) continue;
    const MoeConfig& mc = cfg.model.moe;
    const int64_t K = d.topk, kf = K >= 2 ? K : 1;
    const int64_t cap = std::max<int64_t>(
        static_cast<int64_t>(std::ceil(static_cast<double>(Nm) / E * mc.train_capacity_factor * kf)), mc.min_capacity);
    const int64_t rows = mc.drop_tokens ? std::min(cap, Nm) : ceil_div(Nm * K, E);
    int64_t b = Nm * s * (2 * E + 3 * K) + E * rows * a * (2 * C + (F_in + F) / etp) - N * a * (F_in + F) / tp;
    if (d.moe_residual) b += Nm * a * (2 * C + F_in + F) + Nm * s * 2;
    moe_layers += 1;
    moe_extra = std::max(moe_extra, b);
  }
  const int64_t stage_moe = ceil_div(moe_layers, cfg.parallel.pp);  // MoE layers of the fullest stage
  ActivationBytes out;
  out.saved = in_flight * layers * per_layer + (full_recompute ? layer_full : 0);
  if (!full_recompute) out.saved += in_flight * stage_moe * moe_extra;
  else if (moe_layers > 0) out.saved += moe_extra;  // the one recomputed layer's
  out.saved += N * a * 2 * C / sp + N * s * 2 / sp;  // final norm out + last residual, final norm stats
  out.saved += N * a * (d.value_head ? 1 : d.Vp / tp) + N * s;  // logits / values (reused as their gradient) + per-token loss
  out.workspace = N * a * 2 * C / sp + N * a * (QKV + C + F_in + F) / tp;  // dresid, dnorm | dqkv, dattn, dfc, dact
  if (sp > 1 && moe_layers > 0) out.workspace += N * a * C;  // an MoE layer's full-sequence output (gradient)
  if (cfg.random_ltd.active()) out.workspace += 2 * N * a * C;  // random-LTD's kept rows in and out (B*T*C each)
  // Ulysses: the whole sequence's MoE input, output (gradient), input gradient and gather scratch.
  if (pl.ulysses > 1 && moe_layers > 0) out.workspace += 4 * Nm * a * C;
  // CPU backend in bf16/fp16: the dispatcher's f32 copies of an emulated op's
  // low-precision fields (lib/ops/lowp_emulation.h; kept for reuse), the
  // largest being the attention backward's qkv, its gradient, out and dout
  // (emulated where the CPU has no bf16 GEMM) or in fp16 the cross-entropy's
  // logits (bf16 logits are read row by row).
  if (cfg.device == DeviceType::CPU && a == 2) {
    const int64_t logits = cfg.precision.precision == Precision::FP16 && !d.value_head ? N * d.Vp / tp : 0;
    out.workspace += s * std::max(logits, N * (2 * QKV + 2 * C) / tp);
  }
  return out;
}

// Micro-batches per step at `dp` data-parallel ranks (the configured
// gradient accumulation when the batch triple does not give it).
int64_t micro_batches(const TrainConfig& cfg, int dp) {
  const BatchConfig& b = cfg.batch;
  if (b.train_batch_size > 0 && b.micro_batch_size > 0)
    return std::max<int64_t>(1, b.train_batch_size / (b.micro_batch_size * dp));
  return std::max<int64_t>(1, b.grad_accum_steps);
}

// One pipeline message (PipelineExecutor::activation_buffer): B x T x C in
// the compute dtype, T split over the Ulysses ranks and, with sequence
// parallelism, over tp.
int64_t pipeline_buffer_bytes(const TrainConfig& cfg, const ParallelLayout& pl, int64_t C) {
  const int64_t B = cfg.batch.micro_batch_size > 0 ? cfg.batch.micro_batch_size : 1;
  const int64_t a = cfg.precision.precision == Precision::FP32 ? 4 : 2;
  return B * pl.local_seq_sp() * C * a;
}

// "8 (AdamW: exp_avg, exp_avg_sq)": the optimizer's state bytes per parameter.
std::string optimizer_bytes_text(const OptimizerSpec& spec) {
  const OptimizerKind k = optimizer_kind(spec).value_or(OptimizerKind::AdamW);
  const int n = optimizer_state_count(spec);
  const char* names = n == 0                        ? "no state"
                      : k == OptimizerKind::SGD     ? "momentum_buffer"
                      : k == OptimizerKind::Adagrad ? "sum"
                      : k == OptimizerKind::Lion    ? "exp_avg"
                                                    : "exp_avg, exp_avg_sq";
  return fmt::format("{} ({}: {})", 4 * n, optimizer_kind_name(k), names);
}

// The NVMe row's tensors per element in the swap file: the optimizer's
// states, the parameter shard with offload_param nvme and the f32 gradient shard.
int nvme_states(const TrainConfig& cfg, const MemoryEstimateRow& r) {
  return optimizer_state_count(cfg.optim.spec) + (r.nvme_params ? 1 : 0) + (r.nvme_grads ? 1 : 0);
}

// One (stage, offload) row. `e` holds everything that does not depend on the row.
MemoryEstimateRow make_row(const MemoryEstimate& e, const TrainConfig& cfg, const std::vector<Range>& units, int stage,
                           OffloadDevice where) {
  MemoryEstimateRow r;
  r.stage = stage;
  const bool offload = where != OffloadDevice::None;
  r.offload_optimizer = offload;
  r.nvme = where == OffloadDevice::NVMe;
  r.nvme_params = r.nvme && cfg.zero.offload_param == OffloadDevice::NVMe;
  r.host_params = offload && stage == 3 && cfg.device == DeviceType::CUDA && cfg.zero.offload_param == OffloadDevice::CPU;
  // The gradient shard joins the swap file (ZeroParamStore::grads_elsewhere).
  ZeroConfig z = cfg.zero;
  z.stage = stage;
  z.offload_optimizer = where;
  r.nvme_grads = grads_in_nvme_tier(z, cfg.precision.grad_accum == DType::F32, e.layout.ep > 1 && stage >= 1 ? 2 : 1,
                                    cfg.device == DeviceType::CPU);
  // The host AdamW of a GPU run reads f32 gradients: offload there needs fp32
  // accumulation too (on the CPU backend the step reads the shard as it is).
  r.supported = !offload || (stage >= 1 && (e.precision != StatePrecision::MixedLowp || cfg.device == DeviceType::CPU));
  // Expert parallelism with offload: the CPU backend (the NVMe tier keeps a
  // swap file per sharding group; cpu moves nothing); not on a GPU so far.
  r.supported = r.supported && (e.layout.ep == 1 || !offload || cfg.device == DeviceType::CPU);
  // The NVMe tier: ZeRO-3 (config_validate).
  r.supported = r.supported && (!r.nvme || stage == 3);
  r.configured = cfg.zero.stage == stage && cfg.zero.offload_optimizer == where;
  const int64_t n = e.n_params_rank;
  const int64_t shard = make_zero_partition(n, e.sdp).shard;
  const bool fp32 = e.precision == StatePrecision::FP32;
  // Gathered params in the compute dtype; a unit's full gradient is f32 while
  // its backward runs, whatever the accumulation dtype.
  const int64_t P = fp32 ? 4 : 2, G = 4;
  const int ob = 4 * optimizer_state_count(cfg.optim.spec);  // the optimizer's state bytes per element
  // ZeRO partitions each parameter group over the ranks that hold it: with
  // expert parallelism the dense weights over every data-parallel rank, the
  // experts over the expert-data-parallel ones (DP / EP). Each sharding
  // group has its own optimizer state (and with nvme its own swap file).
  struct Part {
    int64_t n;
    int ranks;
  };
  const std::vector<Part> parts = e.layout.ep > 1 && stage >= 1
                                      ? std::vector<Part>{{n - e.n_experts_rank, e.sdp},
                                                          {e.n_experts_rank, e.layout.edp()}}
                                      : std::vector<Part>{{n, e.sdp}};
  NvmeTierOptions tier;  // the NVMe row: the optimizer's state leaves memory for the swap files
  if (r.nvme)
    tier = {.dir = "", .name = "", .aio = cfg.zero.nvme.aio, .sub_group_size = cfg.zero.sub_group_size,
            .buffer_count = cfg.zero.nvme.buffer_count, .pipeline_read = false, .pipeline_write = false};
  int64_t host_optimizer = 0, tier_host = 0;
  for (const Part& p : parts) {
    const ModelStateBytes b = zero_model_state_bytes(p.n, p.ranks, stage, e.precision, offload, ob);
    r.states = {.params = r.states.params + b.params, .grads = r.states.grads + b.grads,
                .optimizer = r.states.optimizer + b.optimizer};
    if (offload && !r.nvme) host_optimizer += host_optimizer_bytes(p.n, p.ranks, stage, e.precision, ob);
    if (!r.nvme) continue;
    const int64_t part_shard = make_zero_partition(p.n, p.ranks).shard;
    r.nvme_per_rank += NvmeStateTier::file_bytes_for(tier, nvme_states(cfg, r), part_shard);
    tier_host += NvmeStateTier::host_bytes_for(tier, nvme_states(cfg, r), part_shard);
  }
  const int64_t params_host = r.host_params ? r.states.params : 0;  // offload_param cpu on a GPU
  if (r.nvme_params || r.host_params) r.states.params = 0;  // the parameter shard leaves the device (nvme: the swap file)
  if (r.nvme_grads) r.states.grads = 0;    // and so does the f32 gradient shard
  // The 1-bit family (stage 0), besides its state tensors: with several
  // ranks the compression errors, the worker's (n, padded) and the server's
  // (n / DP); 0/1 Adam's update accumulator and 1-bit Lamb's copy of the
  // momentum before a compressed step (n each), with one rank too.
  if (const OptimizerKind k = optimizer_kind(cfg.optim.spec).value_or(OptimizerKind::AdamW); stage == 0 && is_onebit(k)) {
    if (e.sdp > 1) r.states.optimizer += 4 * n + 4 * n / e.sdp;
    if (k != OptimizerKind::OneBitAdam) r.states.optimizer += 4 * n;
    // fp16's group units: a group's tensors gathered into one buffer (at most n).
    if (e.sdp > 1 && cfg.optim.spec.compress_param_groups) r.states.optimizer += 4 * n;
  }
  if (stage == 3) {
    int64_t largest = 0, persistent = 0;
    for (size_t i = 0; i < units.size(); ++i) {
      if (e.zero3.persistent[i])
        persistent += units[i].size();
      else
        largest = std::max(largest, units[i].size());
    }
    r.zero3_live = e.zero3.peak_live * P + (largest + persistent) * G;
  }
  r.device_total =
      r.states.total() + r.zero3_live + e.activations.total() + e.pipeline_bytes() + e.teacher_bytes;
  // Host: the start-up staging chunk through which initialisation, --load and
  // --init-from fill the rank's weights (init_fill_into: at most kInitChunk
  // f32 elements, none where the weights are f32 host memory), plus with
  // offload the optimizer state and the fp32 master and gradient ranges the
  // host Adam works on.
  const int64_t opt_elems = stage >= 1 ? shard : n;
  r.host_per_rank = 4 * std::min(n, kInitChunk) + 4 * e.teacher_params;  // the teacher is read whole in f32
  if (cfg.device == DeviceType::CPU) {
    r.host_per_rank += r.device_total + (r.nvme ? tier_host : host_optimizer);
  } else if (r.nvme) {
    // The tier's sub-group buffers and the step's two host buffer pairs
    // (gradients, master) of one sub-group each (OffloadPipeline::step_tier).
    r.host_per_rank += params_host + tier_host +
                       OffloadPipeline::tier_host_bytes_for(opt_elems, cfg.zero.sub_group_size,
                                                            !r.nvme_params && !r.host_params);
  } else if (offload) {
    // Adam m, v, then what the offloaded step allocates (ZeroOptimizer): the
    // host copy of the master range and two gradient buckets.
    r.host_per_rank +=
        params_host + host_optimizer +
        OffloadPipeline::host_bytes_for(opt_elems, ZeroOptimizer::offload_bucket(cfg.zero), !r.host_params);
  }
  r.host_per_node = r.host_per_rank * e.gpus_per_node;
  return r;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / (1024.0 * 1024 * 1024)); }

std::string millions(int64_t n) { return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6); }

}  // namespace

int pipeline_message_buffers(int pp, int stage, int n_micro, int vp, bool overlap, bool zbh1, bool zbh1_exact) {
  if (pp <= 1) return 0;
  const ScheduleKind kind = pipeline_schedule_kind(vp, zbh1, zbh1_exact);
  const std::vector<P2PPlanStep> plan =
      make_p2p_plan(make_schedule(kind, pp, stage, n_micro, vp), kind, overlap);
  std::set<std::pair<int, int>> received_fwd, received_bwd;  // (micro, chunk) waiting for their compute
  int live = 0, peak = 0;
  for (const P2PPlanStep& step : plan) {
    if (step.kind == P2PPlanStep::Kind::Post) {
      // A batch's receives and sends are in flight together: the sent input
      // gradients are released after the batch's receive buffers exist.
      int sent = 0;
      for (const PipeAction& a : step.batch) {
        if (a.kind == ActionKind::RecvForward) received_fwd.insert({a.micro, a.chunk});
        if (a.kind == ActionKind::RecvBackward) received_bwd.insert({a.micro, a.chunk});
        live += a.kind == ActionKind::RecvForward || a.kind == ActionKind::RecvBackward ? 1 : 0;
        sent += a.kind == ActionKind::SendBackward ? 1 : 0;
      }
      peak = std::max(peak, live);
      live -= sent;
      continue;
    }
    const PipeAction& c = step.compute;
    if (c.kind == ActionKind::WeightGrad) continue;  // reads and writes no message
    auto& received = c.kind == ActionKind::Forward ? received_fwd : received_bwd;
    live -= static_cast<int>(received.erase({c.micro, c.chunk}));  // consumed (the executor copies it in)
    // A backward writes its input gradient for the previous stage, except on
    // the first virtual stage.
    if (is_backward(c.kind) && !(stage == 0 && c.chunk == 0)) live += 1;
    peak = std::max(peak, live);
  }
  return peak;
}

int pipeline_message_buffers_max(int pp, int n_micro, int vp, bool overlap, bool zbh1, bool zbh1_exact) {
  int peak = 0;
  for (int stage = 0; stage < pp; ++stage)
    peak = std::max(peak, pipeline_message_buffers(pp, stage, n_micro, vp, overlap, zbh1, zbh1_exact));
  return peak;
}

MemoryEstimate estimate_memory(const TrainConfig& cfg, int num_nodes, int gpus_per_node) {
  DS_USER_CHECK(num_nodes > 0 && gpus_per_node > 0,
                "--estimate-memory: num_nodes {} and gpus_per_node {} must be positive", num_nodes, gpus_per_node);
  MemoryEstimate e;
  e.num_nodes = num_nodes;
  e.gpus_per_node = gpus_per_node;
  e.world = num_nodes * gpus_per_node;
  const ParallelRequest req = parallel_request(cfg.parallel, cfg.model);
  DS_USER_CHECK(req.tp > 0 && req.pp > 0 && req.ulysses > 0 &&
                    e.world % (int64_t{req.tp} * req.pp * req.ulysses) == 0,
                "--estimate-memory: world size {} ({} nodes x {} GPUs) is not divisible by TP {} * PP {} * Ulysses {}",
                e.world, num_nodes, gpus_per_node, req.tp, req.pp, req.ulysses);
  e.layout = make_parallel_layout(req, e.world, cfg.model.num_layers, cfg.model.seq_length);
  e.tp = e.layout.tp;
  e.pp = e.layout.pp;
  e.dp = e.layout.dp;
  e.ulysses = e.layout.ulysses;
  e.sdp = e.layout.sdp();
  e.approximate = e.tp * e.pp > 1;
  e.precision = cfg.precision.precision == Precision::FP32 ? StatePrecision::FP32
                : cfg.precision.grad_accum == DType::F32     ? StatePrecision::Mixed
                                                             : StatePrecision::MixedLowp;
  const ModelConfig m = resolved_model(cfg, e.vocab_assumed);
  const ModelLayout layout = build_layout(m);
  e.n_params = layout.total;
  // A rank holds E / EP of each MoE layer's experts, split over PP (and over
  // TP with expert tensor parallelism, else replicated there); the rest is
  // split over TP x PP.
  const int64_t experts_rank =
      ceil_div(expert_params_per_rank(layout, e.layout.ep), e.pp * (m.moe.expert_tensor_parallelism ? e.tp : 1));
  e.n_params_rank = ceil_div(e.n_params - expert_params_per_rank(layout, 1), e.tp * e.pp) + experts_rank;
  e.n_experts_rank = experts_rank;
  e.activations = activation_bytes(cfg, e.layout, model_dims(m));
  if (e.pp > 1) {
    const ModelDims d = model_dims(m);
    const int n_micro = static_cast<int>(micro_batches(cfg, e.dp));
    int vp = e.layout.vp;
    // A config the interleaved schedule cannot run (dstrain rejects it at
    // start-up, naming the problem) still gets an estimate: 1F1B's buffers.
    if (vp < 1 || (vp > 1 && n_micro % e.pp != 0)) vp = 1;
    const bool zb = cfg.parallel.zbh1_pipeline && vp == 1, exact = cfg.parallel.zbh1_exact_semantics;
    e.pipeline_buffers = pipeline_message_buffers_max(e.pp, n_micro, vp, cfg.zero.overlap_comm, zb, exact);
    e.pipeline_buffer_bytes = pipeline_buffer_bytes(cfg, e.layout, d.C);
    if (zb) {
      const ScheduleKind kind = pipeline_schedule_kind(1, true, exact);
      // Stages hold equal layer counts; the last one waits for the most weight passes.
      std::vector<int> layers;
      for (int l = m.num_layers - m.num_layers / e.pp; l < m.num_layers; ++l) layers.push_back(l);
      for (int s = 0; s < e.pp; ++s) e.weight_passes = std::max(e.weight_passes, max_pending_weight_grads(kind, e.pp, s, n_micro));
      const int64_t micro = cfg.batch.micro_batch_size > 0 ? cfg.batch.micro_batch_size : 1;
      const int64_t elem = e.precision == StatePrecision::FP32 ? 4 : 2;
      e.weight_pass_bytes = e.weight_passes * deferred_weight_grad_bytes(d, e.tp, micro * e.layout.local_seq(), elem, layers);
    }
  }
  if (cfg.distill.enabled && cfg.distill.num_layers > 0) {
    const DistillConfig& kd = cfg.distill;
    ModelConfig tm = m;
    tm.num_layers = kd.num_layers;
    if (kd.hidden_size > 0 && kd.hidden_size != m.hidden_size) {  // the FFN keeps its ratio to the width
      tm.ffn_hidden_size = static_cast<int>(int64_t{m.ffn_hidden_size} * kd.hidden_size / m.hidden_size);
      tm.hidden_size = kd.hidden_size;
    }
    if (kd.num_attention_heads > 0) tm.num_heads = kd.num_attention_heads;
    if (tm.num_kv_heads > 0 && tm.num_heads % tm.num_kv_heads != 0) tm.num_kv_heads = 0;
    if (!kd.num_experts.empty()) tm.moe.num_experts = kd.num_experts;
    tm.moe.expert_parallel_size = 1;
    e.teacher_params = build_layout(tm).total;
    TrainConfig tc = cfg;
    tc.model = tm;
    tc.parallel.recompute = RecomputeKind::None;
    e.teacher_bytes = e.teacher_params * (e.precision == StatePrecision::FP32 ? 4 : 6) +
                      activation_bytes(tc, e.layout, model_dims(tm)).saved;
  }
  std::vector<Range> units = layer_units(layout);
  for (Range& u : units) u = {u.begin / e.tp, u.begin / e.tp + ceil_div(u.size(), e.tp)};  // TP shares a unit
  e.zero3 = make_zero3_plan(units, cfg.zero.stage3_prefetch_bucket_size, cfg.zero.stage3_max_live_parameters,
                            cfg.zero.stage3_param_persistence_threshold);
  for (int stage = 0; stage <= 3; ++stage)
    for (OffloadDevice where : {OffloadDevice::None, OffloadDevice::CPU})
      e.rows.push_back(make_row(e, cfg, units, stage, where));
  e.rows.push_back(make_row(e, cfg, units, 3, OffloadDevice::NVMe));
  return e;
}

namespace {

void append_header(std::string& out, const TrainConfig& cfg, const MemoryEstimate& e) {
  const ModelDims d = model_dims([&] {
    bool unused = false;
    return resolved_model(cfg, unused);
  }());
  out += fmt::format("dstrain memory estimate (nothing allocated){}\n",
                     cfg.config_path.empty() ? "" : " for " + cfg.config_path);
  out += fmt::format("model: {}, L={} C={} NH={} F={} Vp={}: {} parameters ({})\n", family_name(cfg.model.family), d.L,
                     d.C, d.NH, d.F, d.Vp, millions(e.n_params), e.n_params);
  if (e.vocab_assumed)
    out += fmt::format("note: vocab_size is not set (it comes from the vocab file at run time): assumed GPT-2's {}\n",
                       kAssumedVocab);
  out += fmt::format("ranks: {} node(s) x {} GPU(s) = {}; TP={} PP={} DP={}{}{}\n", e.num_nodes, e.gpus_per_node,
                     e.world, e.tp, e.pp, e.dp,
                     e.ulysses > 1 ? fmt::format(" Ulysses={} (ZeRO partitions over Ulysses x DP = {} ranks)",
                                                 e.ulysses, e.sdp)
                                   : std::string(),
                     e.layout.ep > 1 ? fmt::format(" EP={} (each rank holds 1/{} of every MoE layer's experts)",
                                                   e.layout.ep, e.layout.ep)
                                     : std::string());
  if (e.approximate)
    out += fmt::format("note: approximate: each rank holds about 1/(TP*PP) of the model ({} parameters)\n",
                       millions(e.n_params_rank));
  out += fmt::format("precision: {} -> bytes per parameter: {}\n", precision_name(cfg.precision.precision),
                     e.precision == StatePrecision::FP32
                         ? fmt::format("params 4, grads 4, optimizer {}", optimizer_bytes_text(cfg.optim.spec))
                         : fmt::format("params 2 (bf16/fp16 copy) + 4 (fp32 master: all of it at ZeRO-0, the rank's "
                                       "range from ZeRO-1 on; ZeRO-3 keeps only the fp32 shard), grads {}, optimizer "
                                       "{}",
                                       e.precision == StatePrecision::Mixed ? "4 (fp32 accumulation)"
                                                                            : "2 (accumulated in the compute dtype)",
                                       optimizer_bytes_text(cfg.optim.spec)));
  if (cfg.distill.enabled)
    out += e.teacher_params > 0
               ? fmt::format("distillation teacher on every rank: {} parameters, {} GiB (f32 weights{} and its "
                             "forward's activations; in per-rank device)\n",
                             millions(e.teacher_params), gib(e.teacher_bytes),
                             e.precision == StatePrecision::FP32 ? "" : " + the compute copy")
               : "note: distillation teacher not counted: --num-layers-teacher does not give its size\n";
  const std::string rc = recompute_granularity_name(cfg.parallel.recompute);
  out += fmt::format("activations per rank (micro batch {} x seq {}, recompute {}): {} GiB (saved {} + backward {})\n",
                     cfg.batch.micro_batch_size,
                     e.ulysses > 1 ? fmt::format("{} of {}", e.layout.local_seq(), cfg.model.seq_length)
                                   : std::to_string(cfg.model.seq_length),
                     rc.empty() ? "none" : rc,
                     gib(e.activations.total()), gib(e.activations.saved), gib(e.activations.workspace));
  if (e.pp > 1)
    out += fmt::format("pipeline messages per rank: up to {} buffers of {} bytes live on a stage: {} GiB (received "
                       "activations and gradients, input gradients waiting to be sent{})\n",
                       e.pipeline_buffers, e.pipeline_buffer_bytes, gib(int64_t{e.pipeline_buffers} * e.pipeline_buffer_bytes),
                       cfg.zero.overlap_comm ? "; overlap_comm: gradients on their own communicator, each receive "
                                               "posted one compute early"
                                             : "");
  if (e.weight_passes > 0)
    out += fmt::format("ZB-H1 weight passes: up to {} micro-batches wait on a stage, keeping copies of the linear "
                       "layers' inputs and output gradients: {} GiB (in the pipeline total)\n",
                       e.weight_passes, gib(e.weight_pass_bytes));
  int n_persistent = static_cast<int>(std::count(e.zero3.persistent.begin(), e.zero3.persistent.end(), true));
  out += fmt::format("ZeRO-3 fetch plan: {} units, {} persistent, prefetch depth {}, peak {} gathered parameters\n",
                     e.zero3.persistent.size(), n_persistent, e.zero3.prefetch_depth, millions(e.zero3.peak_live));
  if (cfg.device == DeviceType::CPU)
    out += "note: CPU backend: \"device\" memory is host memory and is included in the per-node host column\n";
}

}  // namespace

std::string estimate_memory_report(const TrainConfig& cfg, int num_nodes, int gpus_per_node) {
  const MemoryEstimate e = estimate_memory(cfg, num_nodes, gpus_per_node);
  std::string out;
  append_header(out, cfg, e);
  out += "\n  ZeRO stage | offload_optimizer |  params   grads  optim  zero3 | per-rank device | per-node host"
         " | per-rank NVMe   (GiB)\n";
  for (const MemoryEstimateRow& r : e.rows) {
    std::string head = fmt::format("{} ZeRO {}     | {:<17} |", r.configured ? '*' : ' ', r.stage,
                                   r.nvme_params   ? "nvme (+ params)"
                                   : r.host_params ? (r.nvme ? "nvme, params cpu" : "cpu (+ params)")
                                   : r.nvme        ? "nvme"
                                   : r.offload_optimizer ? "cpu" : "none");
    if (!r.supported) {
      out += head + (e.layout.ep > 1 && r.stage >= 1 && r.offload_optimizer
                         ? "  not supported: expert parallelism on a GPU runs without optimizer offload so far\n"
                     : r.stage >= 1                     ? "  not supported: offload_optimizer on a GPU needs fp32 gradient accumulation\n"
                                                        : "  not supported: offload_optimizer needs ZeRO stage >= 1\n");
      continue;
    }
    out += fmt::format("{} {:>7} {:>7} {:>6} {:>6} | {:>15} | {:>13}", head, gib(r.states.params),
                       gib(r.states.grads), gib(r.states.optimizer), gib(r.zero3_live), gib(r.device_total),
                       gib(r.host_per_node));
    out += r.nvme ? fmt::format(" | {:>13}\n", gib(r.nvme_per_rank)) : "\n";
  }
  out += "\n* = the configured stage. per-rank device = model states + ZeRO-3 working set + activations\n"
         "(+ pipeline messages); per-node host = start-up staging of the weights, at most 16 MiB (+ offloaded optimizer state,\n"
         "its fp32 master copy and two gradient buckets, pinned with pin_memory; with nvme the sub-group buffers,\n"
         "and on a GPU two sub-groups' gradients and master)\n"
         "x ranks per node; per-rank NVMe = the optimizer state in the swap file (sub-groups block aligned).\n"
         "Framework buffers (communication buckets, allocator slack) come on top:\n"
         "see docs/zero.md.\n";
  return out;
}

}  // namespace ds
