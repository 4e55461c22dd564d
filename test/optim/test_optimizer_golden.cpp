// Golden trajectories of the optimizers besides the fused AdamW: 12 steps on
// random weights and gradients over a model layout (weights that decay and
// biases and norms that do not), with a learning rate that changes every step
// and a gradient scale, against an independent reference in double written
// from the published update rules: torch.optim.Adam (L2), FusedAdam without
// bias correction, torch.optim.SGD (momentum, dampening, nesterov),
// torch.optim.Adagrad (lr_decay, initial_accumulator_value), DeepSpeed's
// FusedLion and FusedLamb (per-tensor trust ratio), OnebitAdam on one rank. Lamb over two ZeRO shards
// (two threads summing their per-tensor norms) equals Lamb over the whole range.
#include <barrier>
#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>
#include <thread>

#include "lib/optim/lamb.h"
#include "test/model/tiny_model.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

constexpr int kSteps = 12;
constexpr float kGradScale = 0.5f, kWd = 0.1f;

float lr_at(int t) { return 1e-2f * (1.f + 0.1f * static_cast<float>(t % 4)); }  // t: 1-based

// The reference state of one parameter tensor.
struct RefTensor {
  std::vector<double> p, m, v;
  double wd;
};

struct Reference {
  OptimizerSpec spec;
  OptimizerKind kind;
  double b1, b2, eps;
  std::vector<RefTensor> tensors;  // layout order

  void step(int t, const std::vector<std::vector<double>>& grads) {
    const double lr = lr_at(t);
    for (size_t k = 0; k < tensors.size(); ++k) {
      RefTensor& r = tensors[k];
      const size_t n = r.p.size();
      if (kind == OptimizerKind::Lamb) {
        double wn = 0, un = 0;
        std::vector<double> u(n);
        for (size_t i = 0; i < n; ++i) {
          const double g = grads[k][i] * kGradScale;
          r.m[i] = b1 * r.m[i] + (1 - b1) * g;
          r.v[i] = b2 * r.v[i] + (1 - b2) * g * g;
          const double denom = spec.eps_inside_sqrt ? std::sqrt(r.v[i] + eps) : std::sqrt(r.v[i]) + eps;
          u[i] = r.m[i] / denom + r.wd * r.p[i];
          wn += r.p[i] * r.p[i];
          un += u[i] * u[i];
        }
        wn = std::sqrt(wn), un = std::sqrt(un);
        const double c = wn == 0 || un == 0 ? 1.0 : std::clamp(wn / un, double(spec.min_coeff), double(spec.max_coeff));
        const double step = spec.bias_correction ? lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) : lr;
        for (size_t i = 0; i < n; ++i) r.p[i] -= step * c * u[i];
        continue;
      }
      for (size_t i = 0; i < n; ++i) {
        double g = grads[k][i] * kGradScale;
        double& p = r.p[i];
        switch (kind) {
          case OptimizerKind::AdamL2:
          case OptimizerKind::AdamW: {
            if (kind == OptimizerKind::AdamL2) g += r.wd * p;
            else p *= 1 - lr * r.wd;
            r.m[i] = b1 * r.m[i] + (1 - b1) * g;
            r.v[i] = b2 * r.v[i] + (1 - b2) * g * g;
            const double bc1 = spec.bias_correction ? 1 - std::pow(b1, t) : 1;
            const double bc2 = spec.bias_correction ? 1 - std::pow(b2, t) : 1;
            p -= lr * (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + eps);
            break;
          }
          case OptimizerKind::SGD: {
            g += r.wd * p;
            if (spec.momentum != 0) {
              r.m[i] = t == 1 ? g : spec.momentum * r.m[i] + (1 - spec.dampening) * g;
              g = spec.nesterov ? g + spec.momentum * r.m[i] : r.m[i];
            }
            p -= lr * g;
            break;
          }
          case OptimizerKind::Adagrad: {
            g += r.wd * p;
            r.m[i] += g * g;
            const double clr = lr / (1 + (t - 1) * double(spec.lr_decay));
            p -= clr * g / (std::sqrt(r.m[i]) + eps);
            break;
          }
          case OptimizerKind::OneBitAdam: {
            // DeepSpeed's OnebitAdam on one rank: the first call only
            // initialises; then Adam without bias correction, the decay
            // added to the update; the variance is frozen after the step
            // that reaches freeze_step, the first update step (2) at the
            // earliest (with one rank the momentum is not compressed).
            if (t == 1) break;
            r.m[i] = b1 * r.m[i] + (1 - b1) * g;
            if (t <= std::max<int64_t>(2, spec.freeze_step)) r.v[i] = b2 * r.v[i] + (1 - b2) * g * g;
            p -= lr * (r.m[i] / (std::sqrt(r.v[i]) + eps) + r.wd * p);
            break;
          }
          case OptimizerKind::Lion: {
            const double c = b1 * r.m[i] + (1 - b1) * g;
            p = p * (1 - lr * r.wd) + (c > 0 ? -lr : lr);
            r.m[i] = b2 * r.m[i] + (1 - b2) * g;
            break;
          }
          default: FAIL("no reference");
        }
      }
    }
  }
};

struct Case {
  OptimizerSpec spec;
  float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
};

// max |a - ref| / max |ref| over the whole buffer.
double rel_error(const Tensor& a, const std::vector<RefTensor>& ref, const ModelLayout& layout) {
  double err = 0, scale = 0;
  for (size_t k = 0; k < ref.size(); ++k)
    for (size_t i = 0; i < ref[k].p.size(); ++i) {
      err = std::max(err, std::fabs(a.data<float>()[layout.params[k].offset + i] - ref[k].p[i]));
      scale = std::max(scale, std::fabs(ref[k].p[i]));
    }
  return err / scale;
}

void run_case(const Case& c) {
  const ModelLayout layout = build_layout(tiny_model(false));
  const int64_t n = layout.total;
  Tensor p = randn({n}, 11, 0.5);
  Reference ref{c.spec, *optimizer_kind(c.spec), c.b1, c.b2, c.eps, {}};
  for (const ParamSpec& ps : layout.params) {
    RefTensor r;
    for (int64_t i = 0; i < ps.numel; ++i) r.p.push_back(p.data<float>()[ps.offset + i]);
    r.m.assign(r.p.size(), ref.kind == OptimizerKind::Adagrad ? c.spec.initial_accumulator_value : 0.0);
    r.v.assign(r.p.size(), 0.0);
    r.wd = ps.decay ? kWd : 0.0;
    ref.tensors.push_back(std::move(r));
  }
  std::unique_ptr<Optimizer> o = make_optimizer(c.spec, layout, Device::cpu(), 0, n);
  StepHyper h{.lr = 0, .beta1 = c.b1, .beta2 = c.b2, .eps = c.eps, .weight_decay = kWd};
  for (int t = 1; t <= kSteps; ++t) {
    const Tensor g = randn({n}, 100 + t);
    std::vector<std::vector<double>> grads;
    for (const ParamSpec& ps : layout.params)
      grads.emplace_back(g.data<float>() + ps.offset, g.data<float>() + ps.offset + ps.numel);
    h.lr = lr_at(t);
    o->step({.params = p, .grads = g, .params_lowp = Tensor()}, h, kGradScale);
    ref.step(t, grads);
    INFO("step " << t);
    CHECK(rel_error(p, ref.tensors, layout) < 2e-5);
  }
}

}  // namespace

TEST_CASE("Adam with L2 weight decay (adam_w_mode false) follows torch.optim.Adam") {
  run_case({{.type = "Adam", .adam_w_mode = false}, 0.9f, 0.95f, 1e-6f});
}

TEST_CASE("AdamW without bias correction follows FusedAdam") {
  run_case({{.type = "AdamW", .bias_correction = false}, 0.8f, 0.99f});
}

TEST_CASE("SGD follows torch.optim.SGD: plain, momentum with dampening, nesterov") {
  run_case({{.type = "SGD"}});
  run_case({{.type = "SGD", .momentum = 0.9f, .dampening = 0.1f}});
  run_case({{.type = "SGD", .momentum = 0.8f, .nesterov = true}});
}

TEST_CASE("Adagrad follows torch.optim.Adagrad: lr_decay, initial_accumulator_value") {
  run_case({{.type = "Adagrad"}, 0.9f, 0.999f, 1e-10f});
  run_case({{.type = "Adagrad", .lr_decay = 0.05f, .initial_accumulator_value = 0.1f}, 0.9f, 0.999f, 1e-10f});
}

TEST_CASE("Lion follows DeepSpeed's FusedLion") {
  run_case({{.type = "Lion"}, 0.9f, 0.99f});
}

TEST_CASE("Lamb follows DeepSpeed's FusedLamb: per-tensor trust ratio, clamped, with and without bias correction") {
  run_case({{.type = "Lamb"}});
  run_case({{.type = "Lamb", .bias_correction = false, .max_coeff = 2.f, .min_coeff = 0.5f, .eps_inside_sqrt = true}});
}

TEST_CASE("OneBitAdam on one rank follows DeepSpeed's OnebitAdam: initialising step, warm-up, frozen variance") {
  run_case({{.type = "OneBitAdam", .freeze_step = 5}});
  run_case({{.type = "onebitadam", .freeze_step = 1}});
}

TEST_CASE("Lamb over two ZeRO shards sums each tensor's norms across them: the whole range's trajectory") {
  const ModelLayout layout = build_layout(tiny_model(false));
  const int64_t n = layout.total, cut = n / 2 + 7;  // cuts a tensor in two
  const OptimizerSpec spec{.type = "Lamb", .max_coeff = 3.f, .min_coeff = 0.05f};
  Tensor whole_p = randn({n}, 5, 0.5), shard_p = whole_p.clone();
  std::unique_ptr<Optimizer> whole = make_optimizer(spec, layout, Device::cpu(), 0, n);
  std::unique_ptr<Optimizer> shard[2] = {make_optimizer(spec, layout, Device::cpu(), 0, cut),
                                         make_optimizer(spec, layout, Device::cpu(), cut, n)};
  // Two "ranks" on two threads: the shard sum adds both buffers.
  std::mutex mu;
  std::barrier sync(2);
  std::vector<float> acc;
  for (auto& s : shard)
    s->set_shard_sum([&](const Tensor& t) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (acc.empty()) acc.assign(t.numel(), 0.f);
        for (int64_t i = 0; i < t.numel(); ++i) acc[i] += t.data<float>()[i];
      }
      sync.arrive_and_wait();
      std::copy(acc.begin(), acc.end(), t.data<float>());
      sync.arrive_and_wait();
      {
        std::lock_guard<std::mutex> lock(mu);
        acc.clear();
      }
      sync.arrive_and_wait();
    });
  StepHyper h{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = kWd};
  for (int t = 1; t <= kSteps; ++t) {
    const Tensor g = randn({n}, 300 + t);
    whole->step({.params = whole_p, .grads = g, .params_lowp = Tensor()}, h, 1.f);
    std::thread other([&] {
      shard[1]->step({.params = shard_p.view(cut, {n - cut}), .grads = g.view(cut, {n - cut}), .params_lowp = Tensor()},
                     h, 1.f);
    });
    shard[0]->step({.params = shard_p.view(0, {cut}), .grads = g.view(0, {cut}), .params_lowp = Tensor()}, h, 1.f);
    other.join();
    double err = 0;
    for (int64_t i = 0; i < n; ++i)
      err = std::max(err, double(std::fabs(whole_p.data<float>()[i] - shard_p.data<float>()[i])));
    INFO("step " << t);
    CHECK(err < 1e-6);
    const auto& cw = static_cast<Lamb&>(*whole).last_coeffs();
    const auto& c0 = static_cast<Lamb&>(*shard[0]).last_coeffs();
    const auto& c1 = static_cast<Lamb&>(*shard[1]).last_coeffs();
    for (size_t k = 0; k < layout.params.size(); ++k) {
      const ParamSpec& ps = layout.params[k];
      if (ps.offset < cut) CHECK(c0[k] == Approx(cw[k]).epsilon(1e-6));
      if (ps.offset + ps.numel > cut) CHECK(c1[k] == Approx(cw[k]).epsilon(1e-6));
    }
  }
  // A shard with an empty range still joins the sum.
  std::unique_ptr<Optimizer> empty = make_optimizer(spec, layout, Device::cpu(), n, n);
  int calls = 0;
  empty->set_shard_sum([&](const Tensor&) { ++calls; });
  empty->step_empty_range();
  CHECK(calls == 1);
  CHECK(empty->step_count() == 1);
}
