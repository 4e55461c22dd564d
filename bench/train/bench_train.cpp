// Training-step benchmark: forward + backward + gradient norm + AdamW of a GPT
// model on random tokens, on the CPU or one GPU, through the pieces dstrain's
// trainer uses for a single rank (GptModel with the compute dtype, the flat
// store's f32 master and gradients, ZeroOptimizer stage 0 with the fused
// low-precision AdamW copy, the deferred loss, the update gated on the device
// by the step block and the one packed read per step).
// Prints one JSON line: ms/step, tokens/s, model FLOPs per token and TFLOP/s
// (MFU against the device's nominal bf16 peak on CUDA), host synchronisations
// per step (lib/core/sync_counter.h) and the peak allocation.
//   bench_train --layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 128 --batch 4 --steps 5
//   bench_train --device cuda --dtype bf16 --seq 1024 --batch 16 --steps 10 [--recompute full] [--cuda-graph]
// FLOPs per token are dstrain's own (lib/train/metrics.h): 6*N + 6*L*C*T, N the
// parameters in matrix multiplies (all but learned position embeddings), the
// second term causal attention (QK^T and PV, forward and backward, half of the
// T x T square). Dropout is off, as in torch_ref.py.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/core/sync_counter.h"
#include "lib/model/gpt.h"
#include "lib/ops/ops.h"
#include "lib/parallel/zero_partition.h"
#include "lib/runtime/zero_optimizer.h"
#include "lib/train/metrics.h"
#ifdef DS_WITH_CUDA
#include "cuda/cuda_api.h"
#endif

using namespace ds;

namespace {

struct Options {
  int L = 2, C = 128, NH = 4, V = 512, T = 64, B = 4, steps = 5, warmup = 1;
  std::string family = "gpt2", device = "cpu", dtype = "fp32", recompute = "none", attention = "flash";
  bool cuda_graph = false;
  float loss_scale = 1024.f;  // fp16 only: a static scale (dstrain's default is dynamic, starting at 2^16)
};

Precision precision_of(const std::string& s) {
  return s == "bf16" ? Precision::BF16 : s == "fp16" ? Precision::FP16 : Precision::FP32;
}

RecomputeKind recompute_of(const std::string& s) {
  return s == "full" ? RecomputeKind::Full : s == "selective" ? RecomputeKind::Selective : RecomputeKind::None;
}

// The device the options name, initialised; UserError when it cannot be used.
Device open_device(const Options& o) {
  if (o.device == "cpu") {
    DS_USER_CHECK(o.attention == "flash", "--attention-backend {}: only for --device cuda", o.attention);
    DS_USER_CHECK(!o.cuda_graph, "--cuda-graph needs a GPU: give --device cuda");
    return Device::cpu();
  }
#ifdef DS_WITH_CUDA
  DS_USER_CHECK(cuda::device_available(), "--device cuda: {}", cuda::unavailable_reason());
  cuda::init_device(0);
  cuda::set_attention_backend(cuda::attention_backend_from_name(o.attention));
  return Device::cuda(0);
#else
  throw UserError("--device cuda: this bench_train was built without CUDA (no nvcc at configure time)");
#endif
}

void synchronize(Device dev) {
#ifdef DS_WITH_CUDA
  if (dev.is_cuda()) cuda::synchronize();
#else
  (void)dev;
#endif
}

// Random (B, T) token ids below V on `dev`.
Tensor random_tokens(int B, int T, int V, uint64_t seed, Device dev) {
  Tensor h = Tensor::empty({B, T}, DType::I32);
  Rng r(seed);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<int32_t>()[i] = static_cast<int32_t>(r.below(V));
  return dev.is_cuda() ? h.to(dev) : h;
}

int run(const Options& o) {
  ModelConfig m;
  m.num_layers = o.L;
  m.hidden_size = o.C;
  m.num_heads = o.NH;
  m.seq_length = o.T;
  m.max_position_embeddings = std::max(o.T, 1024);
  m.vocab_size = o.V;
  m.padded_vocab_size = o.V;
  if (o.family == "llama") set_model_family(m, ModelFamily::LLaMA);
  DS_USER_CHECK(o.C % o.NH == 0, "--hidden {} is not a multiple of --heads {}", o.C, o.NH);
  const Device dev = open_device(o);
  const Precision prec = precision_of(o.dtype);
  const DType compute = compute_dtype(prec);

  // As Trainer builds a single rank: flat store (f32 gradients), ZeRO stage 0.
  const ModelLayout layout = build_layout(m);
  const ZeroPartition part = make_zero_partition(layout.total, 1);
  FlatStoreOptions store;
  store.part = part;
  GptModel model(m, dev, 0, TpComm{}, PipeStage{}, compute, store);
  model.set_recompute(RecomputeConfig{.kind = recompute_of(o.recompute)});
  model.init_weights(1, 0.02f);
  ZeroOptimizer opt(model, nullptr, ZeroConfig{}, part, nullptr, OptimizerSpec{});

  const Tensor tok = random_tokens(o.B, o.T, o.V, 1, dev);
  const Tensor tgt = random_tokens(o.B, o.T, o.V, 2, dev);
  const int64_t rows = int64_t(o.B) * o.T;
  // The trainer's step block: [grad sum of squares, overflow flag, loss | the update's step scalars].
  Tensor block = Tensor::zeros({3 + AdamWSlot::Count}, DType::F32, dev);
  Tensor stats = block.view(0, {3}), scalars = block.view(3, {AdamWSlot::Count});
  const double scale = prec == Precision::FP16 ? o.loss_scale : 1.0;
  StepHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.1f;
  // The host's step scalars, written before every step (pinned on CUDA: a
  // captured step copies them from that fixed buffer).
  float host_terms[kStepHostSlots];
  float* terms = host_terms;
#ifdef DS_WITH_CUDA
  std::unique_ptr<void, void (*)(void*)> pinned(dev.is_cuda() ? cuda::alloc_pinned(sizeof host_terms) : nullptr,
                                                cuda::free_pinned);
  if (pinned) terms = static_cast<float*>(pinned.get());
#endif
  Tensor terms_dst = scalars.view(AdamWSlot::Lr, {kStepHostSlots});

  float loss = NAN;
  // The step up to its read, the update gated on the device included: with
  // --cuda-graph captured once after the warm-up and replayed (as the
  // trainer's --cuda-graph; docs/cuda.md).
  auto region = [&] {
#ifdef DS_WITH_CUDA
    if (dev.is_cuda()) cuda::copy_pinned_async(terms_dst.raw(), terms, sizeof host_terms);
#endif
    if (dev.is_cpu()) std::memcpy(terms_dst.raw(), terms, sizeof host_terms);
    opt.zero_grads();
    stats.zero_();
    model.set_loss_sink(stats.view(2, {1}));
    opt.begin_last_micro_batch();  // one micro-batch per step (a no-op without overlap_comm)
    model.forward_backward(tok, tgt, static_cast<float>(scale / rows), DropoutKey{});
    opt.reduce_gradients_into(stats.view(0, {1}));
    if (prec == Precision::FP16) opt.grads_nonfinite_into(stats.view(1, {1}));
    model.set_loss_sink(Tensor());
    ops::step_gate({.scalars = scalars, .stats = stats, .loss_scale = scale, .max_norm = 1.0f,
                    .rule = prec == Precision::FP16 ? SkipRule::Overflow : SkipRule::NonFinite});
    opt.step_gated(h, scalars);
  };
#ifdef DS_WITH_CUDA
  std::unique_ptr<cuda::StepGraph> graph;
#endif
  auto step = [&] {
    step_host_slots(opt.optimizer().next_terms(h), static_cast<float>(scale), terms);  // the previous read waited for the copy from here
#ifdef DS_WITH_CUDA
    if (graph) {
      if (!graph->ready()) {
        graph->begin_capture();
        region();
        graph->end_capture();
      }
      graph->replay();
    } else {
      region();
    }
#else
    region();
#endif
    const Tensor host = block.to(Device::cpu());  // the step's one read: statistics and the device's gate
    const float* v = host.data<float>();
    loss = v[2];
    if (v[3 + AdamWSlot::Skip] == 0.f) opt.optimizer().count_step();
  };
  const float first_loss = [&] { step(); return loss; }();
  for (int s = 1; s < o.warmup; ++s) step();
#ifdef DS_WITH_CUDA
  if (o.cuda_graph) {
    graph = std::make_unique<cuda::StepGraph>();
    step();  // the capture (untimed)
  }
#endif
  synchronize(dev);
#ifdef DS_WITH_CUDA
  if (dev.is_cuda()) cuda::reset_max_allocated_bytes();
#endif
  const int64_t syncs0 = host_sync_count();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < o.steps; ++s) step();
  const int64_t syncs = host_sync_count() - syncs0;  // before the closing synchronisation
  synchronize(dev);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / o.steps;

  int64_t n_matmul = layout.total;
  if (const ParamSpec* p = layout.try_find("embed.wpe")) n_matmul -= p->numel;
  const double fpt = flops_per_token(m, n_matmul), tps = rows / (ms / 1000.0);
  std::string gpu = "cpu";
  double peak = 0, max_gb = -1;
#ifdef DS_WITH_CUDA
  if (dev.is_cuda()) {
    gpu = cuda::device_name();
    peak = prec == Precision::FP32 ? 0 : cuda::peak_bf16_tflops();
    max_gb = cuda::max_allocated_bytes() / 1e9;
  }
#endif
  const double tflops = fpt * tps / 1e12;
  std::printf(
      "{\"impl\": \"dstrain\", \"device\": \"%s\", \"gpu\": \"%s\", \"family\": \"%s\", \"dtype\": \"%s\", "
      "\"recompute\": \"%s\", \"attention\": \"%s\", \"params\": %lld, \"L\": %d, \"C\": %d, \"NH\": %d, "
      "\"V\": %d, \"B\": %d, \"T\": %d, \"steps\": %d, \"ms_per_step\": %.2f, \"tokens_per_s\": %.1f, "
      "\"flops_per_token\": %.6g, \"flops_formula\": \"6*N_matmul + 6*L*C*T\", \"tflops\": %.4g, "
      "\"peak_tflops_nominal\": %.1f, \"mfu_nominal\": %.4f, \"host_syncs_per_step\": %.2f, "
      "\"max_alloc_gb\": %.2f, \"cuda_graph\": %s, \"loss_first\": %.4f, \"loss_last\": %.4f}\n",
      o.device.c_str(), gpu.c_str(), o.family.c_str(), o.dtype.c_str(), o.recompute.c_str(),
      o.device == "cuda" ? o.attention.c_str() : "n/a", static_cast<long long>(layout.total), o.L, o.C, o.NH, o.V,
      o.B, o.T, o.steps, ms, tps, fpt, tflops, peak, peak > 0 ? tflops / peak : 0.0,
      static_cast<double>(syncs) / o.steps, max_gb, o.cuda_graph ? "true" : "false", first_loss, loss);
  DS_USER_CHECK(std::isfinite(loss), "the loss is not finite after {} steps ({}): the benchmark's step is broken",
                o.warmup + o.steps, loss);
  return 0;
}

// The GEMM ceiling the CPU step is judged against: matmul_forward (the op the
// model's linear layers run) on an N x N x N problem in bf16 and fp32, on the
// same threads, best of 3 after one warm-up. One JSON line.
int gemm_peak(int64_t n) {
  auto rate = [n](DType dt) {
    auto make = [&](const Shape& shape) {
      Tensor f = Tensor::empty(shape, DType::F32);
      for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = static_cast<float>(normal_at(3, 0, i) * 0.05);
      if (dt == DType::F32) return f;
      Tensor t = Tensor::empty(shape, dt);
      ops::cast({.out = t, .inp = f});
      return t;
    };
    const MatmulArgs a{.out = Tensor::empty({n, n}, dt), .inp = make({n, n}), .weight = make({n, n}), .bias = Tensor()};
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      ops::matmul_forward(a);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, s);
    }
    return 2.0 * n * n * n / best / 1e12;
  };
  const double bf16 = rate(DType::BF16), fp32 = rate(DType::F32);
  std::printf("{\"impl\": \"dstrain\", \"gemm\": \"matmul_forward %lldx%lldx%lld\", \"bf16_tflops\": %.4f, "
              "\"fp32_tflops\": %.4f, \"bf16_matmuls\": \"%s\"}\n",
              static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n), bf16, fp32,
              ops::cpu_lowp_description());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dstrain training-step benchmark (CPU or one GPU)"};
  Options o;
  const auto pos = CLI::Range(1, std::numeric_limits<int>::max());
  app.add_option("--layers", o.L)->check(pos);
  app.add_option("--hidden", o.C)->check(pos);
  app.add_option("--heads", o.NH)->check(pos);
  app.add_option("--vocab", o.V)->check(pos);
  app.add_option("--seq", o.T)->check(pos);
  app.add_option("--batch", o.B)->check(pos);
  app.add_option("--steps", o.steps, "timed steps")->check(pos);
  app.add_option("--warmup", o.warmup, "untimed steps first (at least 1)")->check(pos);
  app.add_option("--family", o.family)->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--device", o.device)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", o.dtype, "compute dtype (bf16/fp16: f32 master weights and gradients)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--recompute", o.recompute, "activation recomputation (Megatron's granularity)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  app.add_option("--attention-backend", o.attention)->check(CLI::IsMember({"flash", "flash2", "plain", "cudnn"}));
  app.add_option("--loss-scale", o.loss_scale, "fp16: static loss scale")->check(CLI::PositiveNumber);
  app.add_flag("--cuda-graph", o.cuda_graph, "capture the step up to its read once and replay it (CUDA only)");
  int64_t peak_n = 0;
  app.add_option("--gemm-peak", peak_n, "instead of a step: the CPU's bf16 and fp32 matmul_forward rate at N^3")
      ->check(CLI::Range(int64_t{64}, int64_t{16384}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (peak_n > 0) return gemm_peak(peak_n);
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
}
