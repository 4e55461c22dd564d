// The optimizer update gated on the device (lib/ops/step_scalars.h), on the
// CPU backend: gate_step's clip and skip rule on a table of step statistics
// (worked out by hand), the step_gate op writing exactly its bits into the
// step block, AdamW reading its per-step values from the block giving the
// bits of the by-value call (segments, a bf16 copy, stochastic rounding) and
// changing nothing when the block says skip, and AdamW::step_gated +
// count_step repeating AdamW::step, a skipped step leaving Adam's step count
// where it was. test_cuda_ops compares the CUDA ops with these.
#include <cmath>
#include <cstring>
#include <limits>

#include "lib/optim/adamw.h"
#include "test/model/tiny_model.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A block with every slot set to a marker, so a write to the wrong slot shows.
Tensor marked_block() {
  Tensor s = Tensor::empty({AdamWSlot::Count}, DType::F32);
  for (int i = 0; i < AdamWSlot::Count; ++i) s.data<float>()[i] = 100.f + static_cast<float>(i);
  return s;
}

}  // namespace

TEST_CASE("gate_step: the clip coefficient and the skip rule") {
  struct Case {
    const char* what;
    float sumsq, overflow, loss;
    double loss_scale;
    float max_norm;
    SkipRule rule;
    bool skip;
    float grad_scale;
  };
  const float clip2 = static_cast<float>(1.0 / (2.0 + 1e-6));  // norm 2, max_norm 1
  const Case cases[] = {
      {"norm below the threshold", 0.25f, 0, 3.f, 1.0, 1.f, SkipRule::NonFinite, false, 1.f},
      {"norm above the threshold", 4.f, 0, 3.f, 1.0, 1.f, SkipRule::NonFinite, false, clip2},
      {"clipping off", 4.f, 0, 3.f, 1.0, 0.f, SkipRule::NonFinite, false, 1.f},
      {"infinite norm", kInf, 0, 3.f, 1.0, 1.f, SkipRule::NonFinite, true, 1.f},
      {"NaN norm", kNaN, 0, 3.f, 1.0, 1.f, SkipRule::NonFinite, true, 1.f},
      {"NaN loss", 0.25f, 0, kNaN, 1.0, 1.f, SkipRule::NonFinite, true, 1.f},
      {"infinite loss", 0.25f, 0, kInf, 1.0, 1.f, SkipRule::NonFinite, true, 1.f},
      // fp16: the overflow flag decides for the gradients; the loss still counts.
      {"fp16 overflow", 4.f * 1024 * 1024, 1.f, 3.f, 1024.0, 1.f, SkipRule::Overflow, true,
       static_cast<float>(clip2 / 1024.0)},
      {"fp16 in range, clipped", 4.f * 1024 * 1024, 0, 3.f, 1024.0, 1.f, SkipRule::Overflow, false,
       static_cast<float>(clip2 / 1024.0)},
      {"fp16 in range, not clipped", 0.25f * 1024 * 1024, 0, 3.f, 1024.0, 1.f, SkipRule::Overflow, false,
       1.f / 1024.f},
      {"fp16 infinite norm without the flag", kInf, 0, 3.f, 1024.0, 1.f, SkipRule::Overflow, false, 1.f / 1024.f},
      {"fp16 NaN loss", 0.25f, 0, kNaN, 1024.0, 1.f, SkipRule::Overflow, true, 1.f / 1024.f},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const StepGate g = gate_step(c.sumsq, c.overflow, c.loss, c.loss_scale, c.max_norm, c.rule);
    CHECK(g.skip == c.skip);
    CHECK(same_bits(g.grad_scale, c.grad_scale));
    if (std::isfinite(c.sumsq)) CHECK(g.norm == std::sqrt(static_cast<double>(c.sumsq)) / c.loss_scale);
    // The op writes the same two slots and nothing else.
    Tensor stats = Tensor::empty({3}, DType::F32);
    stats.data<float>()[0] = c.sumsq;
    stats.data<float>()[1] = c.overflow;
    stats.data<float>()[2] = c.loss;
    Tensor block = marked_block();
    ops::step_gate({.scalars = block, .stats = stats, .loss_scale = c.loss_scale, .max_norm = c.max_norm,
                    .rule = c.rule});
    const float* s = block.data<float>();
    CHECK(same_bits(s[AdamWSlot::GradScale], c.grad_scale));
    CHECK(s[AdamWSlot::Skip] == (c.skip ? 1.f : 0.f));
    for (int i : {int(AdamWSlot::Lr), int(AdamWSlot::WeightDecay), int(AdamWSlot::StepSize),
                  int(AdamWSlot::InvSqrtBc2), int(AdamWSlot::LossScale)})
      CHECK(s[i] == 100.f + static_cast<float>(i));
    // scale_in_block: the loss scale is the block's slot (a captured fp16
    // step), the by-value one is ignored; same bits.
    Tensor in_block = marked_block();
    in_block.data<float>()[AdamWSlot::LossScale] = static_cast<float>(c.loss_scale);
    ops::step_gate({.scalars = in_block, .stats = stats, .loss_scale = 3.0, .scale_in_block = true,
                    .max_norm = c.max_norm, .rule = c.rule});
    CHECK(same_bits(in_block.data<float>()[AdamWSlot::GradScale], c.grad_scale));
    CHECK(in_block.data<float>()[AdamWSlot::Skip] == (c.skip ? 1.f : 0.f));
    CHECK(in_block.data<float>()[AdamWSlot::LossScale] == static_cast<float>(c.loss_scale));
  }
}

TEST_CASE("step_gate refuses a block or statistics of the wrong size, naming the field") {
  Tensor stats = Tensor::zeros({3}, DType::F32);
  CHECK_THROWS_WITH(ops::step_gate({.scalars = Tensor::zeros({4}, DType::F32), .stats = stats}),
                    Catch::Contains("'scalars'"));
  CHECK_THROWS_WITH(ops::step_gate({.scalars = marked_block(), .stats = Tensor::zeros({2}, DType::F32)}),
                    Catch::Contains("'stats'"));
}

TEST_CASE("adamw: the per-step values from the block give the by-value bits; skip changes nothing") {
  const int64_t n = 2 * 4096 + 45;
  Tensor seg = Tensor::empty({3, 3}, DType::I64);
  const int64_t rows[3][3] = {{0, 100, 0}, {100, 5000, 1}, {5003, n, 1}};  // a gap [5000, 5003)
  std::memcpy(seg.data<int64_t>(), rows, sizeof(rows));
  for (uint64_t sr : {uint64_t{0}, uint64_t{77}}) {
    INFO("sr_seed " << sr);
    AdamWArgs a;
    a.param = randn({n}, 140);
    a.grad = randn({n}, 141);
    a.m = randn({n}, 142, 0.01);
    a.v = Tensor::zeros({n}, DType::F32);
    a.param_lowp = Tensor::zeros({n}, DType::BF16);
    a.segments = seg;
    a.lr = 3e-3f, a.beta2 = 0.95f, a.weight_decay = 0.1f, a.grad_scale = 0.37f, a.step = 5, a.sr_seed = sr;
    AdamWArgs b = a;
    b.param = a.param.clone(), b.m = a.m.clone(), b.v = a.v.clone(), b.param_lowp = a.param_lowp.clone();
    b.lr = b.weight_decay = b.grad_scale = 0.f;  // ignored with a block
    b.step = 1;
    b.scalars = Tensor::empty({AdamWSlot::Count}, DType::F32);
    float* s = b.scalars.data<float>();
    step_host_slots(adamw_terms(a.lr, a.weight_decay, a.beta1, a.beta2, a.step), 1.f, s);
    s[AdamWSlot::GradScale] = a.grad_scale;
    s[AdamWSlot::Skip] = 1.f;
    ops::adamw_step(b);  // skipped: nothing moves
    CHECK(bit_equal(b.param, a.param));
    CHECK(bit_equal(b.m, a.m));
    CHECK(bit_equal(b.v, a.v));
    CHECK(bit_equal(b.param_lowp, a.param_lowp));
    s[AdamWSlot::Skip] = 0.f;
    ops::adamw_step(a);
    ops::adamw_step(b);
    CHECK(bit_equal(b.param, a.param));
    CHECK(bit_equal(b.m, a.m));
    CHECK(bit_equal(b.v, a.v));
    CHECK(bit_equal(b.param_lowp, a.param_lowp));
    CHECK_FALSE(bit_equal(b.m, randn({n}, 142, 0.01)));  // the call did update
  }
}

TEST_CASE("AdamW::step_gated + count_step repeat AdamW::step; a skipped step keeps the step count") {
  const ModelLayout layout = build_layout(tiny_model(false));  // weights that decay and biases that do not
  const int64_t n = layout.total;
  AdamW host(layout, Device::cpu(), 0, n), gated(layout, Device::cpu(), 0, n);
  Tensor p_host = randn({n}, 150), p_gated = p_host.clone();
  StepHyper h;
  h.lr = 1e-2f, h.weight_decay = 0.1f;
  Tensor block = Tensor::zeros({AdamWSlot::Count}, DType::F32);
  Tensor stats = Tensor::empty({3}, DType::F32);
  // Steps 1-5; step 3's statistics are non-finite: the gate skips it and the
  // host's optimizer is not called, as the trainer does after its read.
  for (int it = 1; it <= 5; ++it) {
    INFO("iteration " << it);
    const Tensor g = randn({n}, 160 + it, 0.5);
    stats.data<float>()[0] = it == 3 ? kNaN : static_cast<float>(it);  // sum of squares
    stats.data<float>()[1] = 0.f;
    stats.data<float>()[2] = 2.5f;  // loss
    h.lr = 1e-2f / static_cast<float>(it);  // a schedule
    step_host_slots(gated.next_terms(h), 1.f, block.data<float>());
    ops::step_gate({.scalars = block, .stats = stats, .max_norm = 1.5f});
    gated.step_gated({.params = p_gated, .grads = g, .params_lowp = Tensor()}, h, block);
    const StepGate gate = gate_step(stats.data<float>()[0], 0.f, 2.5f, 1.0, 1.5f, SkipRule::NonFinite);
    CHECK(gate.skip == (it == 3));
    CHECK(block.data<float>()[AdamWSlot::Skip] == (gate.skip ? 1.f : 0.f));
    if (!gate.skip) {
      host.step({.params = p_host, .grads = g, .params_lowp = Tensor()}, h, gate.grad_scale);
      gated.count_step();
    }
    CHECK(gated.step_count() == host.step_count());
    CHECK(bit_equal(p_gated, p_host));
    CHECK(bit_equal(gated.m(), host.m()));
    CHECK(bit_equal(gated.v(), host.v()));
  }
  CHECK(host.step_count() == 4);
}
