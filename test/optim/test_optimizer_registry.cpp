// The optimizer interface and registry (lib/optim/optimizer.h): DeepSpeed's
// optimizer.type spellings map to one class, its named state covers the owned
// range, the update of a range in parts gives the bits of the whole, and an
// unknown type is one error naming the supported ones.
#include <catch2/catch.hpp>
#include <cstring>

#include "lib/core/error.h"
#include "lib/optim/adamw.h"
#include "test/model/tiny_model.h"
#include "test/ops_harness/op_test_util.h"

using namespace ds;
using namespace ds::test;
using Catch::Matchers::Contains;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("the registry makes DeepSpeed's Adam and AdamW, case-insensitive, and names what it supports") {
  const ModelLayout layout = build_layout(tiny_model(false));
  for (const char* type : {"Adam", "AdamW", "adamw", "ADAM"}) {
    INFO(type);
    std::unique_ptr<Optimizer> o = make_optimizer(type, layout, Device::cpu(), 10, 110);
    CHECK(std::string(o->type()) == "AdamW");
    REQUIRE(o->state_specs().size() == 2);
    CHECK(o->state_specs()[0].name == "exp_avg");
    CHECK(o->state_specs()[1].name == "exp_avg_sq");
    CHECK(o->state("exp_avg").numel() == 100);
    CHECK(o->has_state("exp_avg_sq"));
    CHECK_FALSE(o->has_state("momentum"));
    CHECK(o->state_bytes() == 2 * 4 * 100);
    CHECK(o->has_gated_step());
  }
  CHECK(canonical_optimizer_type("adam") == "Adam");
  CHECK(canonical_optimizer_type("lamb") == "Lamb");
  CHECK(canonical_optimizer_type("onebitadam") == "OneBitAdam");
  CHECK(optimizer_types_text() == "Adam, AdamW, SGD, Adagrad, Lion, Lamb, OneBitAdam, ZeroOneAdam and OneBitLamb");
  CHECK(canonical_optimizer_type("zerooneadam") == "ZeroOneAdam");
  CHECK(canonical_optimizer_type("ONEBITLAMB") == "OneBitLamb");
  CHECK_THROWS_WITH(make_optimizer("Muon", layout, Device::cpu(), 0, 10),
                    Contains("optimizer.type 'Muon' is not supported (dstrain implements Adam, AdamW, SGD, "
                             "Adagrad, Lion, Lamb, OneBitAdam, ZeroOneAdam and OneBitLamb)"));
  CHECK_THROWS_AS(make_optimizer("Adam", layout, Device::cpu(), 0, 10)->state("momentum"), Error);
}

TEST_CASE("the other optimizers: their names, state and what they support") {
  const ModelLayout layout = build_layout(tiny_model(false));
  struct Want {
    OptimizerSpec spec;
    const char* type;
    std::vector<std::string> states;
    bool parts;
  };
  const Want wants[] = {
      {{.type = "Adam", .adam_w_mode = false}, "Adam", {"exp_avg", "exp_avg_sq"}, true},
      {{.type = "AdamW", .bias_correction = false}, "AdamW", {"exp_avg", "exp_avg_sq"}, true},
      {{.type = "SGD"}, "SGD", {}, true},
      {{.type = "SGD", .momentum = 0.9f}, "SGD", {"momentum_buffer"}, true},
      {{.type = "Adagrad"}, "Adagrad", {"sum"}, true},
      {{.type = "Lion"}, "Lion", {"exp_avg"}, true},
      {{.type = "Lamb"}, "Lamb", {"exp_avg", "exp_avg_sq"}, false},
  };
  for (const Want& w : wants) {
    INFO(w.type);
    std::unique_ptr<Optimizer> o = make_optimizer(w.spec, layout, Device::cpu(), 10, 110);
    CHECK(std::string(o->type()) == w.type);
    REQUIRE(o->state_specs().size() == w.states.size());
    for (size_t i = 0; i < w.states.size(); ++i) CHECK(o->state_specs()[i].name == w.states[i]);
    CHECK(o->state_bytes() == int64_t(4 * 100 * w.states.size()));
    CHECK(optimizer_state_count(w.spec) == int(w.states.size()));
    CHECK_FALSE(o->has_gated_step());
    const Tensor p = randn({100}, 1), g = randn({100}, 2);
    CHECK(o->step_part(0, 50, {.params = p.view(0, {50}), .grads = g.view(0, {50}), .params_lowp = Tensor()},
                       StepHyper{}, 1.f) == w.parts);
  }
}

TEST_CASE("an element-wise optimizer updates its range in parts with the bits of one step") {
  const ModelLayout layout = build_layout(tiny_model(false));  // weights that decay and biases that do not
  const int64_t begin = 7, end = layout.total - 5, n = end - begin;
  for (const OptimizerSpec spec : {OptimizerSpec{.type = "AdamW"}, OptimizerSpec{.type = "Adam", .adam_w_mode = false},
                                   OptimizerSpec{.type = "SGD", .momentum = 0.9f, .nesterov = true},
                                   OptimizerSpec{.type = "Adagrad", .lr_decay = 0.1f}, OptimizerSpec{.type = "Lion"}}) {
  INFO(spec.type);
  std::unique_ptr<Optimizer> whole = make_optimizer(spec, layout, Device::cpu(), begin, end);
  std::unique_ptr<Optimizer> parts = make_optimizer(spec, layout, Device::cpu(), begin, end);
  Tensor p_whole = randn({n}, 3), p_parts = p_whole.clone();
  StepHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  for (int step = 1; step <= 3; ++step) {
    const Tensor g = randn({n}, 20 + step, 0.5);
    whole->step({.params = p_whole, .grads = g, .params_lowp = Tensor()}, h, 0.75f);
    parts->count_step();
    for (int64_t lo = 0; lo < n; lo += 37) {  // parts that cut parameters anywhere
      const int64_t hi = std::min(n, lo + 37);
      REQUIRE(parts->step_part(lo, hi, {.params = p_parts.view(lo, {hi - lo}), .grads = g.view(lo, {hi - lo}),
                                        .params_lowp = Tensor()},
                               h, 0.75f));
    }
    CHECK(same_bits(p_whole, p_parts));
    for (const OptimizerStateSpec& s : whole->state_specs())
      CHECK(same_bits(whole->state(s.name), parts->state(s.name)));
    CHECK(whole->step_count() == parts->step_count());
  }
  }
}

// Per-tensor learning rates (ParamSpec::lr_scale, LoRA): AdamW updates a
// tensor at lr x its scale, leaves a frozen one (0) and its moments exactly
// as they were, gives the same bits whole or in parts, and has no
// device-gated step then; the other optimizers refuse such a layout.
TEST_CASE("AdamW with per-tensor learning-rate scales; frozen tensors stay as they are") {
  ModelLayout layout = build_layout(tiny_model(false));
  ModelLayout unscaled = layout;
  const ParamSpec& frozen = layout.find("layers.0.attn.qkv.weight");
  const ParamSpec& fast = layout.find("layers.1.mlp.fc.weight");
  layout.params[static_cast<size_t>(&frozen - layout.params.data())].lr_scale = 0.f;
  layout.params[static_cast<size_t>(&fast - layout.params.data())].lr_scale = 2.5f;
  const int64_t n = layout.total;
  std::unique_ptr<Optimizer> scaled = make_optimizer("AdamW", layout, Device::cpu(), 0, n);
  std::unique_ptr<Optimizer> parts = make_optimizer("AdamW", layout, Device::cpu(), 0, n);
  std::unique_ptr<Optimizer> base = make_optimizer("AdamW", unscaled, Device::cpu(), 0, n);
  std::unique_ptr<Optimizer> fast_ref = make_optimizer("AdamW", unscaled, Device::cpu(), 0, n);
  CHECK_FALSE(scaled->has_gated_step());
  CHECK(base->has_gated_step());
  const Tensor p0 = randn({n}, 3);
  Tensor p = p0.clone(), pp = p0.clone(), pb = p0.clone(), pf = p0.clone();
  StepHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  StepHyper hf = h;
  hf.lr = 2.5f * h.lr;
  for (int step = 1; step <= 3; ++step) {
    const Tensor g = randn({n}, 30 + step, 0.5);
    scaled->step({.params = p, .grads = g, .params_lowp = Tensor()}, h, 1.f);
    parts->count_step();
    for (int64_t lo = 0; lo < n; lo += 101) {
      const int64_t hi = std::min(n, lo + 101);
      REQUIRE(parts->step_part(lo, hi, {.params = pp.view(lo, {hi - lo}), .grads = g.view(lo, {hi - lo}),
                                        .params_lowp = Tensor()}, h, 1.f));
    }
    base->step({.params = pb, .grads = g, .params_lowp = Tensor()}, h, 1.f);
    fast_ref->step({.params = pf, .grads = g, .params_lowp = Tensor()}, hf, 1.f);
  }
  CHECK(same_bits(p, pp));
  auto view = [](const Tensor& t, const ParamSpec& s) { return t.view(s.offset, {s.numel}); };
  CHECK(same_bits(view(p, frozen), view(p0, frozen)));                            // untouched
  CHECK(same_bits(view(scaled->state("exp_avg"), frozen), view(Tensor::zeros({n}, DType::F32), frozen)));
  CHECK(same_bits(view(p, fast), view(pf, fast)));                                // at 2.5 x lr
  const ParamSpec& other = layout.find("layers.1.attn.proj.weight");
  CHECK(same_bits(view(p, other), view(pb, other)));                              // at lr
  CHECK_FALSE(same_bits(view(p, fast), view(pb, fast)));
  CHECK_THROWS_WITH(make_optimizer("Lamb", layout, Device::cpu(), 0, n),
                    Contains("per-tensor learning rates (LoRA) run with AdamW only"));
}
