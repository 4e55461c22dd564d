// The 1-bit optimizers (lib/optim/onebit_adam.h, zero_one_adam.h,
// onebit_lamb.h) on W real ranks against a simulation of all W ranks in this
// process, written from DeepSpeed's update rules (runtime/fp16/onebit/
// adam.py, zoadam.py, lamb.py) with the exchange's reference (onebit_ref.h).
// Every rank's gradient is a function of (rank, step, index); the learning
// rate changes every step. The 1-bit Adams run twice: with a compression unit
// per tensor and per parameter group (fp16's, as DeepSpeed's fp16 wrapper). Each step a rank all-reduces its gradients (the
// mean, as the trainer leaves them) unless the optimizer says they stay
// local, and the simulation's engine switch must say the same. After every
// step the rank's weights equal its simulated ones.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#include "lib/optim/optimizer.h"
#include "test/comm/onebit_ref.h"

namespace ds::test {
namespace {

constexpr int kSteps = 16;
constexpr float kGradScale = 0.5f, kWd = 0.1f, kB1 = 0.9f, kB2 = 0.99f, kEps = 1e-8f;

float lr_at(int t) { return 1e-2f * (1.f + 0.1f * static_cast<float>(t % 3)); }

float grad_at(int rank, int t, int64_t i) {
  return static_cast<float>(0.5 * std::sin(0.1 * static_cast<double>(i) + t) +
                            0.3 * std::cos(0.37 * static_cast<double>(i) * (rank + 1) + 0.7 * t));
}

// Four tensors, two that decay and two that do not, sizes that need padding.
ModelLayout small_layout() {
  ModelLayout l;
  int64_t off = 0;
  const std::pair<int64_t, bool> sizes[] = {{300, true}, {37, false}, {1000, true}, {8, false}};
  for (size_t k = 0; k < std::size(sizes); ++k) {
    ParamSpec p;
    p.name = std::string(1, static_cast<char>('a' + k));
    p.numel = sizes[k].first;
    p.shape = {p.numel};
    p.full_shape = p.shape;
    p.offset = off;
    p.decay = sizes[k].second;
    off += p.numel;
    l.params.push_back(p);
  }
  l.total = off;
  return l;
}

struct RankState {
  std::vector<float> p, m, v, w, acc, m_old;
};

float norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(std::sqrt(s));
}

// All W ranks of one optimizer, DeepSpeed's rules.
struct Sim {
  OptimizerSpec spec;
  OptimizerKind kind;
  const ModelLayout& l;
  int W;
  std::vector<RankState> r;
  std::vector<std::vector<size_t>> units;  // the compression units: tensors, or the groups (decay, no decay)
  std::vector<OneBitSim> per_unit;         // the exchange's errors of each unit
  OneBitSim whole;                    // 1-bit Lamb: the whole momentum as one tensor
  bool frozen = false, allreduce_next = true;
  // 0/1 Adam's counters; 1-bit Lamb's per-tensor values.
  int64_t var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;
  double lrs = 0;
  std::vector<double> coeff_freeze, last_factor, scaling;

  Sim(const OptimizerSpec& s, const ModelLayout& layout, int w, const std::vector<float>& p0)
      : spec(s), kind(*optimizer_kind(s)), l(layout), W(w), whole(w, layout.total) {
    const size_t n = static_cast<size_t>(l.total);
    r.assign(W, RankState{p0, std::vector<float>(n, 0.f), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f),
                          std::vector<float>(n, 0.f), {}});
    if (spec.compress_param_groups) {
      for (bool decay : {true, false}) {
        units.emplace_back();
        for (size_t k = 0; k < l.params.size(); ++k)
          if (l.params[k].decay == decay) units.back().push_back(k);
      }
    } else {
      for (size_t k = 0; k < l.params.size(); ++k) units.push_back({k});
    }
    for (const auto& u : units) {
      int64_t n = 0;
      for (size_t k : u) n += l.params[k].numel;
      per_unit.emplace_back(W, n);
    }
    coeff_freeze.assign(l.params.size(), 0.0);
    last_factor.assign(l.params.size(), 1.0);
  }

  // Each unit of buffer `pick` (its tensors one after the other) replaced by
  // its compressed mean over the ranks.
  void exchange(std::vector<float> RankState::*pick) {
    if (W == 1) return;
    for (size_t u = 0; u < units.size(); ++u) {
      std::vector<std::vector<float>> x(W);
      for (int q = 0; q < W; ++q)
        for (size_t k : units[u]) {
          const auto from = (r[q].*pick).begin() + l.params[k].offset;
          x[q].insert(x[q].end(), from, from + l.params[k].numel);
        }
      const std::vector<float> out = per_unit[u].reduce(x);
      for (int q = 0; q < W; ++q) {
        auto at = out.begin();
        for (size_t k : units[u]) {
          std::copy(at, at + l.params[k].numel, (r[q].*pick).begin() + l.params[k].offset);
          at += l.params[k].numel;
        }
      }
    }
  }
  void exchange_whole() {
    if (W == 1) return;
    std::vector<std::vector<float>> x(W);
    for (int q = 0; q < W; ++q) x[q] = r[q].m;
    const std::vector<float> out = whole.reduce(x);
    for (int q = 0; q < W; ++q) r[q].m = out;
  }
  void reset_errors() {
    for (OneBitSim& s : per_unit) s.reset();
    whole.reset();
  }

  // One step; g[q]: rank q's gradients as the optimizer gets them.
  void step(int t, const std::vector<std::vector<float>>& g) {
    const float lr = lr_at(t);
    if (t == 1) {  // the initialising call
      if (kind == OptimizerKind::OneBitLamb) exchange_whole();
      else if (kind == OptimizerKind::OneBitAdam) exchange(&RankState::m);
      reset_errors();
      return;
    }
    if (kind == OptimizerKind::OneBitAdam) return adam(t, lr, g);
    if (kind == OptimizerKind::ZeroOneAdam) return zero_one(t, lr, g);
    return lamb(t, lr, g);
  }

  void adam(int t, float lr, const std::vector<std::vector<float>>& g) {
    for (int q = 0; q < W; ++q)
      for (int64_t i = 0; i < l.total; ++i) {
        const float gi = g[q][i] * kGradScale;
        r[q].m[i] = r[q].m[i] * kB1 + (1.f - kB1) * gi;
        if (!frozen) r[q].v[i] = r[q].v[i] * kB2 + (1.f - kB2) * gi * gi;
      }
    if (frozen) exchange(&RankState::m);
    for (int q = 0; q < W; ++q) update(r[q], lr, nullptr);
    if (!frozen && t >= spec.freeze_step) frozen = true;
    allreduce_next = !frozen;
  }

  // p += -lr (m / (sqrt(v) + eps) + wd p); acc (0/1 Adam's local steps) too.
  void update(RankState& s, float lr, std::vector<float>* acc) {
    for (const ParamSpec& ps : l.params)
      for (int64_t i = ps.offset; i < ps.offset + ps.numel; ++i) {
        float u = s.m[i] / (std::sqrt(s.v[i]) + kEps);
        if (ps.decay) u += kWd * s.p[i];
        s.p[i] += -lr * u;
        if (acc) (*acc)[i] += -lr * u;
      }
  }

  void zero_one(int t, float lr, const std::vector<std::vector<float>>& g) {
    if (!frozen) {
      if (t % var_interval == 0) {
        for (int q = 0; q < W; ++q)
          for (int64_t i = 0; i < l.total; ++i) {
            const float gi = g[q][i] * kGradScale;
            r[q].v[i] = r[q].v[i] * kB2 + (1.f - kB2) * gi * gi;
            r[q].m[i] = r[q].m[i] * kB1 + (1.f - kB1) * gi;
          }
      } else if (W > 1) {
        for (int q = 0; q < W; ++q)
          for (int64_t i = 0; i < l.total; ++i) r[q].acc[i] = g[q][i] * kGradScale;
        exchange(&RankState::acc);
        for (int q = 0; q < W; ++q)
          for (int64_t i = 0; i < l.total; ++i) r[q].m[i] = r[q].m[i] * kB1 + (1.f - kB1) * r[q].acc[i];
      }
      for (int q = 0; q < W; ++q) update(r[q], lr, nullptr);
      if (t % var_interval == 0 && ++var_counter == spec.var_update_scaler) {
        var_counter = 0;
        var_interval *= 2;
      }
      allreduce_next = (t + 1) % var_interval == 0;
      if (t > spec.var_freeze_step) {
        frozen = true;
        allreduce_next = false;
        reset_errors();
        for (RankState& s : r) std::fill(s.acc.begin(), s.acc.end(), 0.f);
      }
      return;
    }
    lrs += lr;
    for (int q = 0; q < W; ++q) {
      for (int64_t i = 0; i < l.total; ++i) r[q].m[i] = r[q].m[i] * kB1 + (1.f - kB1) * (g[q][i] * kGradScale);
      update(r[q], lr, &r[q].acc);
    }
    if (t % local_interval == 0) {
      for (RankState& s : r)
        for (int64_t i = 0; i < l.total; ++i) {
          s.p[i] -= s.acc[i];
          s.acc[i] *= std::sqrt(s.v[i]) + kEps;
        }
      exchange(&RankState::acc);
      for (RankState& s : r)
        for (int64_t i = 0; i < l.total; ++i) {
          s.m[i] = -(s.acc[i] / static_cast<float>(lrs));
          s.p[i] += s.acc[i] / (std::sqrt(s.v[i]) + kEps);
          s.acc[i] = 0.f;
        }
      lrs = 0;
    }
    if (++local_counter == spec.local_step_scaler) {
      local_counter = 0;
      local_interval = std::min(spec.local_step_clipper, local_interval * 2);
    }
  }

  void lamb(int t, float lr, const std::vector<std::vector<float>>& g) {
    if (!frozen) {
      for (int q = 0; q < W; ++q) {
        RankState& s = r[q];
        for (int64_t i = 0; i < l.total; ++i) {
          const float gi = g[q][i] * kGradScale;
          s.m[i] = s.m[i] * kB1 + (1.f - kB1) * gi;
          s.v[i] = s.v[i] * kB2 + (1.f - kB2) * gi * gi;
        }
        if (t == spec.freeze_step) s.w = s.v;
        for (size_t k = 0; k < l.params.size(); ++k) {
          const ParamSpec& ps = l.params[k];
          std::vector<float> u(ps.numel);
          for (int64_t i = 0; i < ps.numel; ++i) {
            const int64_t e = ps.offset + i;
            u[i] = s.m[e] / (std::sqrt(s.v[e]) + kEps) + (ps.decay ? kWd * s.p[e] : 0.f);
          }
          const float wn = norm(s.p.data() + ps.offset, ps.numel), un = norm(u.data(), ps.numel);
          double c = 1.0;
          if (wn != 0 && un != 0) c = std::clamp(static_cast<double>(wn / un), double{spec.min_coeff}, double{spec.max_coeff});
          if (c != 1.0 && q == 0) coeff_freeze[k] = spec.coeff_beta * coeff_freeze[k] + (1 - spec.coeff_beta) * c;
          for (int64_t i = 0; i < ps.numel; ++i) s.p[ps.offset + i] += static_cast<float>(-lr * c) * u[i];
        }
      }
      if (t >= spec.freeze_step) frozen = true;
      allreduce_next = !frozen;
      return;
    }
    for (RankState& s : r) s.m_old = s.m;
    if (scaling.empty()) {  // from rank 0's momentum (every rank's is the same here)
      std::vector<double> rms;
      double sum = 0;
      for (const ParamSpec& ps : l.params) {
        rms.push_back(norm(r[0].m.data() + ps.offset, ps.numel) / std::sqrt(static_cast<double>(ps.numel)));
        sum += rms.back();
      }
      for (double x : rms) scaling.push_back(sum / static_cast<double>(rms.size()) / x);
    }
    for (int q = 0; q < W; ++q)
      for (size_t k = 0; k < l.params.size(); ++k)
        for (int64_t e = l.params[k].offset; e < l.params[k].offset + l.params[k].numel; ++e)
          r[q].m[e] = (r[q].m[e] * kB1 + (1.f - kB1) * (g[q][e] * kGradScale)) * static_cast<float>(scaling[k]);
    exchange_whole();
    std::vector<double> new_factor(l.params.size());
    for (int q = 0; q < W; ++q) {
      RankState& s = r[q];
      for (size_t k = 0; k < l.params.size(); ++k) {
        const ParamSpec& ps = l.params[k];
        std::vector<float> u0(ps.numel), u(ps.numel);
        float fmax = 0.f;
        for (int64_t i = 0; i < ps.numel; ++i) {
          const int64_t e = ps.offset + i;
          s.m[e] /= static_cast<float>(scaling[k]);
          const float rec = (s.m[e] - s.m_old[e] * kB1) / (1.f - kB1);
          s.w[e] = s.w[e] * kB2 + (1.f - kB2) * rec * rec;
          const float denom = std::sqrt(s.v[e]) + kEps;
          u0[i] = s.m[e] / denom;
          u[i] = ps.decay ? u0[i] + kWd * s.p[e] : u0[i];
          fmax = std::max(fmax, denom / (std::sqrt(s.w[e]) + kEps));
        }
        double f = fmax;
        if (ps.decay) {
          const double q2 = std::min(1.0, static_cast<double>(norm(u0.data(), ps.numel) / norm(u.data(), ps.numel)));
          f = f * q2 + (1.0 - q2);
        }
        f = std::clamp(f, double{spec.factor_min}, double{spec.factor_max});
        f = std::clamp(f, last_factor[k] * (1.0 - spec.factor_threshold), last_factor[k] * (1.0 + spec.factor_threshold));
        new_factor[k] = f;
        for (int64_t i = 0; i < ps.numel; ++i) s.p[ps.offset + i] += static_cast<float>(-lr * coeff_freeze[k] * f) * u[i];
      }
    }
    last_factor = new_factor;
    allreduce_next = false;
  }
};

#define OCHECK(cond, ...)                                                                            \
  do {                                                                                               \
    if (!(cond))                                                                                     \
      throw std::logic_error(fmt::format("{}:{} check failed: {}: ", __FILE__, __LINE__, #cond) +   \
                             fmt::format(__VA_ARGS__));                                              \
  } while (0)

void run_one(Communicator& world, const OptimizerSpec& spec) {
  const int W = world.size(), me = world.rank();
  const ModelLayout layout = small_layout();
  const int64_t n = layout.total;
  std::vector<float> p0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p0[i] = 0.1f * static_cast<float>(std::cos(0.05 * static_cast<double>(i)));
  Sim sim(spec, layout, W, p0);
  std::unique_ptr<Optimizer> opt = make_optimizer(spec, layout, Device::cpu(), 0, n);
  opt->set_data_parallel(&world);
  Tensor p = Tensor::empty({n}, DType::F32), g = Tensor::empty({n}, DType::F32);
  std::copy(p0.begin(), p0.end(), p.data<float>());
  int local_steps = 0;
  for (int t = 1; t <= kSteps; ++t) {
    const bool local = opt->gradients_stay_local();
    OCHECK(local == !sim.allreduce_next, "{} step {}: gradients local {} where DeepSpeed's engine says {}", spec.type, t,
           local, !sim.allreduce_next);
    local_steps += local;
    // Each rank's share, as the trainer's loss weight makes it: the rank's
    // own mean, divided by W when the gradients are all-reduced (summed).
    std::vector<std::vector<float>> grads(W, std::vector<float>(static_cast<size_t>(n)));
    const float share = local ? 1.f : 1.f / static_cast<float>(W);
    for (int q = 0; q < W; ++q)
      for (int64_t i = 0; i < n; ++i) grads[q][i] = grad_at(q, t, i) * share;
    if (!local) {
      std::vector<float> sum = grads[0];
      for (int q = 1; q < W; ++q)
        for (int64_t i = 0; i < n; ++i) sum[i] += grads[q][i];
      for (auto& x : grads) x = sum;
    }
    for (int64_t i = 0; i < n; ++i) g.data<float>()[i] = grad_at(me, t, i) * share;
    if (!local && W > 1) world.all_reduce(g);
    const StepHyper h{.lr = lr_at(t), .beta1 = kB1, .beta2 = kB2, .eps = kEps, .weight_decay = kWd};
    opt->step({.params = p, .grads = g, .params_lowp = Tensor(), .states = {}}, h, kGradScale);
    sim.step(t, grads);
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      err = std::max(err, static_cast<double>(std::fabs(p.data<float>()[i] - sim.r[me].p[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(sim.r[me].p[i])));
    }
    OCHECK(err <= 1e-5 * scale, "{} step {} rank {}: weights {} away from the simulation (scale {})", spec.type, t, me,
           err, scale);
    if (t == kSteps) {
      float moved = 0.f;
      for (int64_t i = 0; i < n; ++i) moved = std::max(moved, std::fabs(p.data<float>()[i] - p0[i]));
      OCHECK(moved > 1e-3f, "{}: the weights did not move ({})", spec.type, moved);
    }
  }
  OCHECK(W == 1 || local_steps >= 4, "{}: only {} steps with local gradients", spec.type, local_steps);
}

}  // namespace

int onebit_optimizers_scenario() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  run_one(*world, OptimizerSpec{.type = "OneBitAdam", .freeze_step = 4});
  // Small intervals, so that 16 steps see the variance interval double
  // twice, a local-step phase and its interval double up to the clipper.
  run_one(*world, OptimizerSpec{.type = "ZeroOneAdam", .var_freeze_step = 8, .var_update_scaler = 2,
                                .local_step_scaler = 2, .local_step_clipper = 4});
  run_one(*world, OptimizerSpec{.type = "OneBitLamb", .max_coeff = 2.f, .min_coeff = 0.05f, .freeze_step = 5});
  // fp16's units: each parameter group's tensors (decay, no decay) as one.
  run_one(*world, OptimizerSpec{.type = "OneBitAdam", .freeze_step = 4, .compress_param_groups = true});
  run_one(*world, OptimizerSpec{.type = "ZeroOneAdam", .var_freeze_step = 8, .var_update_scaler = 2,
                                .local_step_scaler = 2, .local_step_clipper = 4, .compress_param_groups = true});
  return 0;
}

}  // namespace ds::test
