// The autotuner's pure parts: the autotuning section (DeepSpeed's defaults,
// strict keys), the search space (default first, global batch held, offload
// only with ZeRO >= 1, SP only with TP > 1), experiment configs and arguments,
// the non-negative cost-model fit, and the tuners' order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "launcher/autotune/autotune_config.h"
#include "launcher/autotune/search_space.h"
#include "launcher/autotune/tuner.h"
#include "lib/core/error.h"

using namespace ds::launch::autotune;
using nlohmann::json;

namespace {

json with_section(json section) { return json{{"train_batch_size", 16}, {"autotuning", std::move(section)}}; }

std::string error_of(const json& j) {
  try {
    parse_autotune_config(j);
  } catch (const ds::UserError& e) {
    return e.what();
  }
  return "";
}

ModelFacts tiny_facts(int world) {
  ModelFacts f;
  f.world = world;
  f.n_params = 100000;
  f.num_layers = 4;
  f.hidden = 32;
  f.heads = 4;
  f.seq = 32;
  f.flops_per_token = 6e5;
  f.mbs = 1;
  return f;
}

}  // namespace

TEST_CASE("autotuning section: DeepSpeed's defaults and strict keys") {
  AutotuneConfig c = parse_autotune_config(with_section({{"enabled", true}}));
  CHECK(c.fast);
  CHECK(c.metric == Metric::Throughput);
  CHECK(c.start_profile_step == 3);
  CHECK(c.end_profile_step == 5);
  CHECK(c.tuner == TunerType::Grid);
  CHECK(c.tuner_early_stopping == 5);
  CHECK(c.tuner_num_trials == 50);
  CHECK(c.max_micro_batch == 1024);
  CHECK(c.num_tuning_micro_batch_sizes == 3);
  CHECK(c.results_dir == "autotuning_results");
  CHECK(c.exps_dir == "autotuning_exps");
  CHECK(c.overwrite);
  CHECK(c.mp_size == 1);
  c = parse_autotune_config(with_section({{"enabled", true}, {"metric", "latency"}, {"tuner_type", "model_based"},
                                          {"arg_mappings", {{"train_micro_batch_size_per_gpu", "--micro-batch-size"}}},
                                          {"tuning_space", {{"recompute_granularity", {"none", "full"}}}}}));
  CHECK(c.metric == Metric::Latency);
  CHECK(c.tuner == TunerType::ModelBased);
  CHECK(c.arg_mappings.at("train_micro_batch_size_per_gpu") == "--micro-batch-size");
  CHECK(c.space.recompute == std::vector<std::string>{"", "full"});
  CHECK_THAT(error_of(with_section({{"enabled", true}, {"tuner_typo", 1}})),
             Catch::Contains("'autotuning.tuner_typo'"));
  CHECK_THAT(error_of(with_section({{"enabled", true}, {"metric", "speed"}})), Catch::Contains("autotuning.metric"));
  CHECK_THAT(error_of(with_section({{"enabled", false}})), Catch::Contains("autotuning.enabled"));
  CHECK_THAT(error_of(with_section({{"enabled", true}, {"start_profile_step", 5}, {"end_profile_step", 5}})),
             Catch::Contains("end_profile_step"));
  CHECK_THAT(error_of(with_section({{"enabled", true}, {"tuning_space", {{"zero_stage", {4}}}}})),
             Catch::Contains("zero_stage"));
  CHECK_THAT(error_of(json{{"train_batch_size", 16}}), Catch::Contains("'autotuning' section"));
}

TEST_CASE("search space: the default first, the global batch held, valid combinations only") {
  AutotuneConfig c = parse_autotune_config(with_section({{"enabled", true}, {"fast", false}}));
  ModelFacts f = tiny_facts(4);
  BatchRule b{true, 32, 1};
  std::vector<Point> space = make_space(c, f, b, 0);
  REQUIRE(space.size() > 20);
  CHECK(space[0].mbs == 1);
  CHECK(space[0].gas == 8);  // the user's config: micro 1 x gas 8 x DP 4
  std::set<std::string> names;
  for (const Point& p : space) {
    CHECK(names.insert(p.name()).second);
    CHECK(p.tbs == 32);
    CHECK(int64_t{p.mbs} * p.gas * p.dp(4) == 32);
    CHECK(4 % (p.tp * p.pp) == 0);
    CHECK((!p.offload || p.zero_stage >= 1));
    CHECK((!p.sp || p.tp > 1));
    CHECK((p.vp == 1 || (p.pp > 1 && (f.num_layers / p.pp) % p.vp == 0)));
  }
  auto has = [&](auto pred) { return std::any_of(space.begin(), space.end(), pred); };
  CHECK(has([](const Point& p) { return p.tp == 4; }));
  CHECK(has([](const Point& p) { return p.pp == 2 && p.vp == 2; }));
  CHECK(has([](const Point& p) { return p.recompute == "full" && p.sp && p.offload; }));
  // Free global batch: micro x gas x DP within the bounds.
  c = parse_autotune_config(with_section({{"enabled", true}, {"max_train_batch_size", 16}}));
  space = make_space(c, f, BatchRule{false, 0, 2}, 64);
  for (const Point& p : space) {
    CHECK(p.gas == 2);
    CHECK(p.tbs == int64_t{p.mbs} * 2 * 4);
    CHECK(p.tbs <= 16);
  }
}

// A tuning space whose every combination is invalid leaves only the default:
// the report says so and why (the session then stops with one line).
TEST_CASE("search space: every candidate dropped is reported with the reasons") {
  AutotuneConfig c = parse_autotune_config(with_section(
      {{"enabled", true}, {"tuning_space", {{"micro_batch_size", {3, 5}}, {"zero_stage", {0}}}}}));
  SpaceReport r;
  std::vector<Point> space = make_space(c, tiny_facts(4), BatchRule{true, 32, 1}, 0, &r);
  CHECK(space.size() == 1);  // the default only
  CHECK(r.candidates == 0);
  CHECK_THAT(r.dropped_text(), Catch::Contains("micro batch x data parallel does not divide train_batch_size 32"));
  SpaceReport ok;
  make_space(parse_autotune_config(with_section({{"enabled", true}})), tiny_facts(4), BatchRule{true, 32, 1}, 0, &ok);
  CHECK(ok.candidates > 0);
}

TEST_CASE("experiment config and arguments") {
  Point p;
  p.zero_stage = 2;
  p.offload = true;
  p.mbs = 4;
  p.gas = 2;
  p.tbs = 16;
  p.pp = 2;
  p.vp = 2;
  p.recompute = "full";
  json user = {{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", "auto"},
               {"zero_optimization", {{"stage", 0}, {"reduce_bucket_size", 5e8}}}, {"autotuning", {{"enabled", true}}}};
  json e = experiment_config(user, p, 8);
  CHECK_FALSE(e.contains("autotuning"));
  CHECK(e["train_micro_batch_size_per_gpu"] == 4);
  CHECK(e["gradient_accumulation_steps"] == 2);
  CHECK(e["zero_optimization"]["stage"] == 2);
  CHECK(e["zero_optimization"]["reduce_bucket_size"] == 5e8);
  CHECK(e["zero_optimization"]["offload_optimizer"]["device"] == "cpu");
  CHECK(e["parallel"]["pipeline_model_parallel_size"] == 2);
  CHECK(e["parallel"]["num_layers_per_virtual_pipeline_stage"] == 2);  // 8 layers / pp 2 / 2 chunks
  CHECK(e["parallel"]["recompute_granularity"] == "full");
  std::vector<std::string> args = {"--config=ds.json", "--micro-batch-size", "1", "--sequence-parallel",
                                   "--zero-stage=1", "--lr", "1e-3", "--per_gpu", "7"};
  std::vector<std::string> out = experiment_args(args, "exp/ds.json", p, {{"train_micro_batch_size_per_gpu", "--per_gpu"}});
  CHECK(out == std::vector<std::string>{"--config=exp/ds.json", "--lr", "1e-3", "--per_gpu", "4"});
  CHECK(config_arg({"--deepspeed_config", "a.json"}) == "a.json");
  CHECK_THROWS_AS(experiment_args({"--lr", "1"}, "x", p, {}), ds::UserError);
  CHECK_THROWS_AS(experiment_args({"--config", "a"}, "x", p, {{"no_such_key", "--x"}}), ds::UserError);
}

TEST_CASE("cost-model fit: non-negative least squares recovers the weights") {
  std::vector<std::vector<double>> A;
  std::vector<double> y;
  const std::vector<double> w = {2e-9, 0, 5e-7, 1e-3};
  for (int i = 0; i < 12; ++i) {
    std::vector<double> x = {1e8 * (1 + i % 5), 1e6 * (i % 3), 1e3 * (1 + (i * 7) % 4), 1.0};
    A.push_back(x);
    y.push_back(w[0] * x[0] + w[1] * x[1] + w[2] * x[2] + w[3] * x[3]);
  }
  const std::vector<double> got = fit_nonnegative(A, y);
  REQUIRE(got.size() == 4);
  for (size_t j = 0; j < 4; ++j) {
    CHECK(got[j] >= 0);
    CHECK(got[j] == Approx(w[j]).margin(1e-6 * (w[j] > 0 ? w[j] * 1e6 : 1e-9)).epsilon(1e-3));
  }
  // A negative trend is clamped at zero, not fitted with a negative weight.
  const std::vector<double> clamp = fit_nonnegative({{1, 1}, {2, 1}, {3, 1}}, {3, 2, 1});
  CHECK(clamp[0] == 0);
}

TEST_CASE("tuners: grid in order, random a permutation, model-based follows the fit") {
  AutotuneConfig c = parse_autotune_config(with_section({{"enabled", true}, {"fast", false}}));
  ModelFacts f = tiny_facts(2);
  std::vector<Point> space = make_space(c, f, BatchRule{true, 16, 1}, 0);
  Tuner grid(TunerType::Grid, space, f, Metric::Throughput, 1);
  for (int i = 0; i < static_cast<int>(space.size()); ++i) CHECK(grid.next() == i);
  CHECK(grid.next() == -1);
  Tuner rnd(TunerType::Random, space, f, Metric::Throughput, 7);
  std::vector<int> seen;
  for (int i; (i = rnd.next()) >= 0;) seen.push_back(i);
  CHECK(seen.size() == space.size());
  CHECK(seen[0] == 0);  // the default first
  CHECK(std::set<int>(seen.begin(), seen.end()).size() == space.size());
  std::vector<int> in_order(seen.size());
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = static_cast<int>(i);
  CHECK(seen != in_order);
  // Step time = compute FLOPs / 1e9 + 0.01 s per micro-step: the model should
  // propose the point that this cost model says is fastest once it has data.
  auto truth = [&](const Point& p) {
    std::vector<double> x = cost_features(p, f);
    return x[0] / 1e9 + 0.01 * x[4];
  };
  Tuner mb(TunerType::ModelBased, space, f, Metric::Throughput, 3);
  std::set<int> tried;
  for (int k = 0; k < 6; ++k) {
    int i = mb.next();
    REQUIRE(i >= 0);
    tried.insert(i);
    mb.report(i, truth(space[i]));
  }
  int best = -1;
  for (int i = 0; i < static_cast<int>(space.size()); ++i)
    if (!tried.count(i) && (best < 0 || double(space[i].tbs) / truth(space[i]) > double(space[best].tbs) / truth(space[best])))
      best = i;
  REQUIRE(best >= 0);
  const int proposed = mb.next();
  REQUIRE(proposed >= 0);
  CHECK(truth(space[proposed]) == Approx(truth(space[best])).epsilon(0.05));
}
