// Mixture of Experts in real dstrain processes (docs/moe.md): Megatron-
// DeepSpeed's MoE flags on the small model, every layer an MoE layer of 4
// experts. DP2 with ZeRO-1, 2 and 3, TP2 and PP2 reproduce the single-process
// curve (relative 1e-5), lm loss and moe loss, with tokens dropped at
// capacity: the gate sees one micro-batch's tokens, so every layout runs the
// same micro-batches (2 samples each). Top-1 keeps DeepSpeed's random token
// selection on: its draws are keyed by the micro-batch's first sample, so the
// layouts draw the same. A run saved and resumed is the uninterrupted curve;
// bad flag combinations are one line naming the flags. Expert parallelism
// (EP2, EP4; with TP2 and PP2) reproduces the same curve, and its
// checkpoints load into other expert-parallel sizes. So does DeepSpeed-Ulysses
// (each of its ranks runs the MoE on the whole sequence), with and without
// expert parallelism.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 8;

struct Run {
  std::vector<double> lm, moe;  // per iteration: lm loss (CSV), moe loss (log line)
  std::string log;
};

std::vector<std::string> moe_args(int tp, std::vector<std::string> extra, int pp = 1, bool llama = false) {
  std::vector<std::string> a = small_model_args({.layers = 2, .tp = tp, .pp = pp, .iters = kIters, .llama = llama});
  a.insert(a.end(), {"--num-experts", "4", "--expert-interval", "1", "--moe-loss-coeff", "0.05"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

Run run(const std::string& name, int world, int zero_stage, int tp, const std::vector<std::string>& extra,
        int pp = 1, bool llama = false) {
  Run r;
  const std::string err = run_with_config(name, world, 2, zero_stage, moe_args(tp, extra, pp, llama), &r.lm, &r.log);
  INFO(err);
  REQUIRE(err.empty());
  const std::regex moe(R"(\| moe loss: ([-+0-9.Ee]+) \|)");
  for (std::sregex_iterator it(r.log.begin(), r.log.end(), moe), end; it != end; ++it)
    r.moe.push_back(std::stod((*it)[1]));
  REQUIRE(r.lm.size() == kIters);
  REQUIRE(r.moe.size() == kIters);
  return r;
}

void same_run(const Run& ref, const Run& got) {
  require_same_curve(ref.lm, got.lm);
  INFO("moe loss");
  require_same_curve(ref.moe, got.moe);
}

std::string fail(int world, int tp, const std::vector<std::string>& extra) {
  std::string log;
  const std::string err = run_with_config("moe_bad", world, 2, 0, moe_args(tp, extra), nullptr, &log);
  REQUIRE(!err.empty());
  return err;
}

}  // namespace

TEST_CASE("MoE top-2 with dropped tokens: DP2 ZeRO-1/2/3, TP2 (with SP) and PP2 reproduce the single-process curve") {
  const std::vector<std::string> top2 = {"--topk", "2", "--disable-moe-top2-2nd-expert-sampling"};
  const Run single = run("moe_top2_single", 1, 0, 1, top2);
  for (double l : single.lm) REQUIRE(std::isfinite(l));
  REQUIRE(single.lm.back() < single.lm.front());  // it trains
  for (double m : single.moe) REQUIRE(m > 0.f);    // loss_coeff x the layers' l_aux, which is positive
  // Full recomputation re-runs each layer's forward before its backward: the
  // same curve, and each l_aux counted once.
  std::vector<std::string> rc = top2;
  rc.insert(rc.end(), {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  same_run(single, run("moe_top2_recompute", 1, 0, 1, rc));
  for (int stage : {1, 2}) {
    INFO("DP2 ZeRO-" << stage);
    same_run(single, run("moe_top2_dp2_z" + std::to_string(stage), 2, stage, 1, top2));
  }
  INFO("TP2");
  same_run(single, run("moe_top2_tp2", 2, 0, 2, top2));
  // Sequence parallelism: each tp rank gathers the sequence, so the gate
  // sees the same tokens; with full recomputation too.
  std::vector<std::string> sp = top2;
  sp.push_back("--sequence-parallel");
  INFO("TP2 with --sequence-parallel");
  same_run(single, run("moe_top2_tp2_sp", 2, 0, 2, sp));
  sp.insert(sp.end(), {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  INFO("TP2 with --sequence-parallel and full recomputation");
  same_run(single, run("moe_top2_tp2_sp_rc", 2, 1, 2, sp));
  // Beyond DeepSpeed and Megatron-DeepSpeed, which refuse these with MoE.
  INFO("DP2 ZeRO-3");
  same_run(single, run("moe_top2_dp2_z3", 2, 3, 1, top2));
  INFO("PP2 (1F1B; each stage adds its layers' l_aux)");
  same_run(single, run("moe_top2_pp2", 2, 0, 1, top2, 2));
}

TEST_CASE("MoE top-1 with random token selection and dropless top-2: DP2 equals one process; resume is bit-exact") {
  const Run single = run("moe_top1_single", 1, 0, 1, {"--moe-train-capacity-factor", "0.5", "--moe-min-capacity", "0"});
  REQUIRE(single.lm.back() < single.lm.front());
  same_run(single, run("moe_top1_dp2", 2, 1, 1, {"--moe-train-capacity-factor", "0.5", "--moe-min-capacity", "0"}));
  // Noisy gate policy Jitter (the DeepSpeed config knob, here in model.moe):
  // keyed by the micro-batch too, so DP2 still equals one process.
  const std::vector<std::string> jit = {"--moe-train-capacity-factor", "0.5", "--moe-min-capacity", "0",
                                        "--noisy-gate-policy", "Jitter"};
  const Run j1 = run("moe_jitter_single", 1, 0, 1, jit);
  REQUIRE(j1.lm[1] != single.lm[1]);  // the jitter changes what is trained
  same_run(j1, run("moe_jitter_dp2", 2, 2, 1, jit));
  const std::vector<std::string> dropless = {"--topk", "2", "--disable-moe-token-dropping"};
  const Run d1 = run("moe_dropless_single", 1, 0, 1, dropless);
  same_run(d1, run("moe_dropless_dp2", 2, 2, 1, dropless));
  // Resume: the first half saved, the second loaded, against the whole run.
  const std::string ck = dist_data().dir + "/ckpt_moe";
  fs::remove_all(ck);
  std::vector<std::string> first = dropless;
  first.insert(first.end(), {"--save", ck, "--save-interval", "4", "--exit-interval", "4"});
  std::vector<double> lm;
  std::string log;
  REQUIRE(run_with_config("moe_first", 2, 2, 2, moe_args(1, first), &lm, &log).empty());
  REQUIRE(lm.size() == 4);
  std::vector<std::string> second = dropless;
  second.insert(second.end(), {"--load", ck});
  REQUIRE(run_with_config("moe_second", 2, 2, 2, moe_args(1, second), &lm, &log).empty());
  REQUIRE(lm.size() == kIters - 4);
  const Run whole = run("moe_whole", 2, 2, 1, dropless);
  for (size_t i = 0; i < lm.size(); ++i) REQUIRE(lm[i] == whole.lm[i + 4]);  // bit-exact
}

// Expert parallelism: the experts of each layer split over EP data-parallel
// ranks, tokens exchanged by all-to-all, expert gradients summed over the
// expert-data-parallel ranks. Every layout runs micro-batches of 2 samples
// (the gate sees the same tokens), so all reproduce the single-process curve.
TEST_CASE("Expert parallelism: EP2 and EP4, with TP2 (and SP), PP2 and ZeRO 0-3, reproduce the single-process curve") {
  const std::vector<std::string> top2 = {"--topk", "2", "--disable-moe-top2-2nd-expert-sampling"};
  auto ep = [&](const char* n) {
    std::vector<std::string> a = top2;
    a.insert(a.end(), {"--moe-expert-parallel-size", n});
    return a;
  };
  const Run single = run("ep_single", 1, 0, 1, top2);
  {
    INFO("DP2 EP2");
    same_run(single, run("ep_dp2_ep2", 2, 0, 1, ep("2")));
  }
  {
    INFO("DP2 EP2 with --profile: the same curve, and the step's all-to-alls are timed");
    std::vector<std::string> a = ep("2");
    a.insert(a.end(), {"--profile", "--profile-dir", dist_data().dir + "/ep_profile"});
    std::vector<double> lm;
    std::string log;
    const std::string err = run_with_config("ep_dp2_ep2_profile", 2, 2, 0, moe_args(1, a), &lm, &log);
    INFO(err);
    REQUIRE(err.empty());
    require_same_curve(single.lm, lm);
    // 2 micro-batches (8 samples, 2 per micro-batch, 2 ranks) x 2 MoE layers x one
    // all-to-all each way in the forward and in the backward
    const std::regex line(R"(profile: iteration \d+: (\d+) expert all-to-alls took [0-9.]+ ms of the step)");
    std::smatch m;
    REQUIRE(std::regex_search(log, m, line));
    CHECK(std::stoi(m[1]) == 16);
  }
  {
    INFO("DP4 EP2 (two expert-data-parallel ranks per expert)");
    same_run(single, run("ep_dp4_ep2", 4, 0, 1, ep("2")));
  }
  {
    INFO("DP4 EP4 (one expert per rank)");
    same_run(single, run("ep_dp4_ep4", 4, 0, 1, ep("4")));
  }
  {
    INFO("TP2 DP2 EP2");
    same_run(single, run("ep_tp2_ep2", 4, 0, 2, ep("2")));
  }
  {
    INFO("TP2 with --sequence-parallel, DP2 EP2");
    std::vector<std::string> a = ep("2");
    a.push_back("--sequence-parallel");
    same_run(single, run("ep_tp2_sp_ep2", 4, 0, 2, a));
  }
  {
    INFO("PP2 DP2 EP2");
    same_run(single, run("ep_pp2_ep2", 4, 0, 1, ep("2"), 2));
  }
  // ZeRO 1-3 partition the dense weights over all data-parallel ranks and
  // the experts over the expert-data-parallel ones (DP4 EP2: two; DP2 EP2:
  // one, so the experts are not partitioned).
  for (int stage : {1, 2, 3}) {
    INFO("DP4 EP2 ZeRO-" << stage);
    same_run(single, run("ep_dp4_ep2_z" + std::to_string(stage), 4, stage, 1, ep("2")));
  }
  {
    INFO("DP2 EP2 ZeRO-2");
    same_run(single, run("ep_dp2_ep2_z2", 2, 2, 1, ep("2")));
  }
  {
    INFO("TP2 DP2 EP2 ZeRO-1");
    same_run(single, run("ep_tp2_ep2_z1", 4, 1, 2, ep("2")));
  }
  {
    INFO("PP2 DP2 EP2 ZeRO-2 (the tied embedding's gradient deferred)");
    same_run(single, run("ep_pp2_ep2_z2", 4, 2, 1, ep("2"), 2));
  }
  {
    INFO("PP2 DP2 EP2 ZeRO-1 (a stage's dense weights one range, not the whole stage)");
    same_run(single, run("ep_pp2_ep2_z1", 4, 1, 1, ep("2"), 2));
  }
  {
    INFO("TP2 DP2 EP2 ZeRO-2");
    same_run(single, run("ep_tp2_ep2_z2", 4, 2, 2, ep("2")));
  }
  // Dropless: the expert-parallel ranks agree on the largest load.
  const std::vector<std::string> dropless = {"--topk", "2", "--disable-moe-token-dropping"};
  std::vector<std::string> dropless_ep = dropless;
  dropless_ep.insert(dropless_ep.end(), {"--moe-expert-parallel-size", "2"});
  const Run d1 = run("ep_dropless_single", 1, 0, 1, dropless);
  same_run(d1, run("ep_dropless_dp2_ep2", 2, 0, 1, dropless_ep));
}

// A checkpoint written with EP2 holds the full model and one optimizer file
// per expert-parallel rank (per rank with ZeRO 1-3); it resumes at EP2, and
// loads (reshaped) at EP1 and EP4 and other ZeRO stages, each continuing the
// uninterrupted curve.
TEST_CASE("Expert-parallel checkpoints resume and load into other expert-parallel sizes") {
  const std::vector<std::string> top2 = {"--topk", "2", "--disable-moe-top2-2nd-expert-sampling"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = top2;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const Run whole = run("epck_whole", 2, 0, 1, with({"--moe-expert-parallel-size", "2"}));
  const std::string ck = dist_data().dir + "/ckpt_moe_ep";
  fs::remove_all(ck);
  std::vector<double> lm;
  std::string log;
  REQUIRE(run_with_config("epck_first", 2, 2, 0,
                          moe_args(1, with({"--moe-expert-parallel-size", "2", "--save", ck, "--save-interval", "4",
                                            "--exit-interval", "4"})),
                          &lm, &log)
              .empty());
  REQUIRE(lm.size() == 4);
  REQUIRE(fs::exists(ck + "/global_step4/optim_pp00_tp00_ep01_rank00000_of_00001.safetensors"));
  struct Target {
    const char* name;
    int world;
    const char* ep;
  };
  for (const Target& t : {Target{"epck_ep2", 2, "2"}, Target{"epck_ep1", 2, "1"}, Target{"epck_ep4", 4, "4"}}) {
    INFO(t.name);
    const auto args = moe_args(1, with({"--moe-expert-parallel-size", t.ep, "--load", ck}));
    REQUIRE(run_with_config(t.name, t.world, 2, 0, args, &lm, &log).empty());
    REQUIRE(lm.size() == kIters - 4);
    require_same_curve(whole.lm, lm, 4);
  }
  // ZeRO-2 over the expert-data-parallel ranks (DP4 EP2: two per expert-
  // parallel rank): one optimizer shard per rank, named by both; it resumes
  // as saved and loads into other EP sizes and ZeRO stages.
  const std::string ck2 = dist_data().dir + "/ckpt_moe_ep_z2";
  fs::remove_all(ck2);
  const auto first = moe_args(1, with({"--moe-expert-parallel-size", "2", "--save", ck2, "--save-interval", "4",
                                       "--exit-interval", "4"}));
  REQUIRE(run_with_config("epck_z2_first", 4, 2, 2, first, &lm, &log).empty());
  REQUIRE(lm.size() == 4);
  for (const char* f : {"optim_pp00_tp00_ep00_rank00000_of_00002", "optim_pp00_tp00_ep00_rank00001_of_00002",
                        "optim_pp00_tp00_ep01_rank00000_of_00002", "optim_pp00_tp00_ep01_rank00001_of_00002"})
    CHECK(fs::exists(ck2 + "/global_step4/" + f + ".safetensors"));
  struct StageTarget {
    const char* name;
    int world, zero;
    const char* ep;
  };
  for (const StageTarget& t : {StageTarget{"epck_z2_same", 4, 2, "2"}, StageTarget{"epck_z2_ep1_z1", 2, 1, "1"},
                               StageTarget{"epck_z2_ep4_z3", 4, 3, "4"}, StageTarget{"epck_z2_ep2_z0", 2, 0, "2"},
                               StageTarget{"epck_z2_ep2_z1", 4, 1, "2"}}) {
    INFO(t.name);
    const auto args = moe_args(1, with({"--moe-expert-parallel-size", t.ep, "--load", ck2}));
    REQUIRE(run_with_config(t.name, t.world, 2, t.zero, args, &lm, &log).empty());
    REQUIRE(lm.size() == kIters - 4);
    require_same_curve(whole.lm, lm, 4);
  }
  // ZeRO-1 at DP4 EP2 partitions as DeepSpeed: the dense weights' state over
  // all four data-parallel ranks, the experts' over the two that hold the
  // same experts. Each rank's file lists its pieces per group; the dense
  // pieces of all four files tile the dense weights. It resumes as saved and
  // loads into other EP sizes and stages.
  const std::string ck1 = dist_data().dir + "/ckpt_moe_ep_z1";
  fs::remove_all(ck1);
  const auto first1 = moe_args(1, with({"--moe-expert-parallel-size", "2", "--save", ck1, "--save-interval", "4",
                                        "--exit-interval", "4"}));
  REQUIRE(run_with_config("epck_z1_first", 4, 2, 1, first1, &lm, &log).empty());
  REQUIRE(lm.size() == 4);
  CHECK_THAT(log, Catch::Contains("the dense weights' state partitioned over the 4 data-parallel ranks, the "
                                  "experts' over the 2 expert-data-parallel ranks"));
  // Per file: the elements of its dense and expert state (the tensors' shapes).
  auto state_elems = [&](const std::string& f, const char* group) {
    std::ifstream in(ck1 + "/global_step4/" + f + ".safetensors", std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    CHECK_THAT(header, Catch::Contains("\"groups\":\"dense,experts\"") &&
                           Catch::Contains("\"shared_groups\":\"dense\""));
    std::smatch m;
    const std::regex shape("\"" + std::string(group) + R"(/exp_avg":\{"dtype":"F32","shape":\[(\d+)\])");
    REQUIRE(std::regex_search(header, m, shape));
    return std::stoll(m[1]);
  };
  int64_t dense = 0, experts0 = 0;
  std::vector<int64_t> dense_of;
  for (const char* f : {"optim_pp00_tp00_ep00_rank00000_of_00002", "optim_pp00_tp00_ep00_rank00001_of_00002",
                        "optim_pp00_tp00_ep01_rank00000_of_00002", "optim_pp00_tp00_ep01_rank00001_of_00002"}) {
    dense_of.push_back(state_elems(f, "dense"));
    dense += dense_of.back();
  }
  experts0 = state_elems("optim_pp00_tp00_ep00_rank00000_of_00002", "experts") +
             state_elems("optim_pp00_tp00_ep00_rank00001_of_00002", "experts");
  // Rank 0 holds a quarter of the dense state (a 256-byte-aligned shard) and
  // half of its expert-parallel rank's experts.
  const int64_t dense_shard = (dense + 4 * 64 - 1) / (4 * 64) * 64, expert_shard = (experts0 + 2 * 64 - 1) / 128 * 64;
  CHECK(dense_of[0] == std::min(dense, dense_shard));
  CHECK(state_elems("optim_pp00_tp00_ep00_rank00000_of_00002", "experts") == std::min(experts0, expert_shard));
  // The start-up line's Adam bytes are rank 0's: 8 per element of both.
  const std::regex adam(R"(Adam m, v (\d+)\))");
  std::smatch am;
  REQUIRE(std::regex_search(log, am, adam));
  CHECK(std::stoll(am[1]) == 8 * (dense_of[0] + std::min(experts0, expert_shard)));
  for (const StageTarget& t : {StageTarget{"epck_z1_same", 4, 1, "2"}, StageTarget{"epck_z1_ep1_z1", 2, 1, "1"},
                               StageTarget{"epck_z1_ep4_z2", 4, 2, "4"}, StageTarget{"epck_z1_ep2_z0", 2, 0, "2"}}) {
    INFO(t.name);
    const auto args = moe_args(1, with({"--moe-expert-parallel-size", t.ep, "--load", ck1}));
    REQUIRE(run_with_config(t.name, t.world, 2, t.zero, args, &lm, &log).empty());
    REQUIRE(lm.size() == kIters - 4);
    require_same_curve(whole.lm, lm, 4);
  }
}

// PR-MoE (--mlp-type residual) with a different expert count per MoE layer,
// as Megatron-DeepSpeed's PR-MoE scripts: DP2 ZeRO-2, TP2 and TP2 + SP give the
// single-process curve.
TEST_CASE("PR-MoE with per-layer expert counts: DP2 ZeRO-2, TP2, TP2 with SP and DP4 EP2 ZeRO-1/3 reproduce the single-process curve") {
  const std::vector<std::string> pr = {"--mlp-type", "residual", "--num-experts", "2", "4", "--topk", "1",
                                       "--moe-min-capacity", "0"};
  const Run single = run("prmoe_single", 1, 0, 1, pr);
  REQUIRE(single.lm.back() < single.lm.front());
  same_run(single, run("prmoe_dp2_z2", 2, 2, 1, pr));
  same_run(single, run("prmoe_tp2", 2, 0, 2, pr));
  std::vector<std::string> sp = pr;
  sp.push_back("--sequence-parallel");
  {
    INFO("TP2 with --sequence-parallel");
    same_run(single, run("prmoe_tp2_sp", 2, 0, 2, sp));
  }
  // Expert parallelism: a PR-MoE layer's dense weights (router, residual MLP,
  // coefficient) lie on both sides of its experts, so a unit's dense pieces
  // are not one flat range: ZeRO-3 gathers them through a packed buffer.
  std::vector<std::string> ep = pr;
  ep.insert(ep.end(), {"--moe-expert-parallel-size", "2"});
  for (int stage : {1, 3}) {
    INFO("DP4 EP2 ZeRO-" << stage);
    same_run(single, run("prmoe_dp4_ep2_z" + std::to_string(stage), 4, stage, 1, ep));
  }
}

// DeepSpeed-Ulysses: every rank of the group runs the MoE on the whole
// sequence and keeps its positions, so the gate sees what one process sees:
// U2 (ZeRO 0 and 2, top-1 with RTS and dropping, PR-MoE top-2), and U2 x
// TP2 with sequence parallelism, give the single-process curve.
TEST_CASE("MoE with DeepSpeed-Ulysses reproduces the single-process curve") {
  const std::vector<std::string> u2 = {"--ds-sequence-parallel-size", "2"};
  const Run single = run("moe_u_single", 1, 0, 1, {});
  for (int stage : {0, 2}) {
    INFO("U2 ZeRO-" << stage);
    same_run(single, run("moe_u2_z" + std::to_string(stage), 2, stage, 1, u2));
  }
  INFO("U2 x TP2 with sequence parallelism");
  std::vector<std::string> tp_sp = u2;
  tp_sp.push_back("--sequence-parallel");
  same_run(single, run("moe_u2_tp2_sp", 4, 0, 2, tp_sp));
  const std::vector<std::string> pr = {"--mlp-type", "residual", "--topk", "2",
                                       "--disable-moe-top2-2nd-expert-sampling"};
  std::vector<std::string> pr_u2 = pr;
  pr_u2.insert(pr_u2.end(), u2.begin(), u2.end());
  INFO("PR-MoE top-2, U2 ZeRO-1");
  same_run(run("moe_u_pr_single", 1, 0, 1, pr), run("moe_u2_pr", 2, 1, 1, pr_u2));
}

// Expert parallelism with DeepSpeed-Ulysses: the expert-parallel groups are
// data-parallel ranks at the same sequence position (each runs the MoE on its
// samples' whole sequences), the experts' gradients reduce and partition over
// the Ulysses ranks and the expert-data-parallel ones together. U2 x DP2 EP2
// with ZeRO 0-3 and dropless routing give the single-process curve; a
// checkpoint saved so resumes and loads into layouts without Ulysses.
TEST_CASE("Expert parallelism with DeepSpeed-Ulysses reproduces the single-process curve; its checkpoints reshape") {
  const std::vector<std::string> top2 = {"--topk", "2", "--disable-moe-top2-2nd-expert-sampling"};
  auto with = [](std::vector<std::string> a, std::vector<std::string> extra) {
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::vector<std::string> u2ep2 = {"--ds-sequence-parallel-size", "2", "--moe-expert-parallel-size", "2"};
  const Run single = run("uep_single", 1, 0, 1, top2);
  for (int stage : {0, 1, 2, 3}) {
    INFO("U2 x DP2 EP2 ZeRO-" << stage);
    const Run r = run("uep_u2_ep2_z" + std::to_string(stage), 4, stage, 1, with(top2, u2ep2));
    same_run(single, r);
    CHECK_THAT(r.log, Catch::Contains("expert gradients reduce over 2 expert-data-parallel ranks"));
  }
  {
    INFO("U2 x TP2 with --sequence-parallel x DP2 EP2, experts split over tp, ZeRO-1 (8 ranks)");
    same_run(single, run("uep_u2_tp2_sp_ep2", 8, 1, 2,
                         with(top2, with(u2ep2, {"--sequence-parallel", "--enable-expert-tensor-parallelism"}))));
  }
  const std::vector<std::string> dropless = {"--topk", "2", "--disable-moe-token-dropping"};
  INFO("dropless, U2 x DP2 EP2 ZeRO-1 (the expert-parallel ranks agree on the largest load)");
  same_run(run("uep_dropless_single", 1, 0, 1, dropless), run("uep_dropless", 4, 1, 1, with(dropless, u2ep2)));
  // Saved at iteration 4 with ZeRO-2: per expert-parallel rank, one optimizer
  // file per rank of its expert-data-parallel group (two Ulysses ranks).
  const std::string ck = dist_data().dir + "/ckpt_moe_uep";
  fs::remove_all(ck);
  std::vector<double> lm;
  std::string log;
  REQUIRE(run_with_config("uep_first", 4, 2, 2,
                          moe_args(1, with(top2, with(u2ep2, {"--save", ck, "--save-interval", "4",
                                                              "--exit-interval", "4"}))),
                          &lm, &log)
              .empty());
  REQUIRE(lm.size() == 4);
  for (const char* f : {"optim_pp00_tp00_ep00_rank00000_of_00002", "optim_pp00_tp00_ep00_rank00001_of_00002",
                        "optim_pp00_tp00_ep01_rank00000_of_00002", "optim_pp00_tp00_ep01_rank00001_of_00002"})
    CHECK(fs::exists(ck + "/global_step4/" + f + ".safetensors"));
  struct Target {
    const char* name;
    int world, zero;
    std::vector<std::string> extra;
  };
  for (const Target& t : {Target{"uep_same", 4, 2, u2ep2},
                          Target{"uep_dp2_ep2_z2", 2, 2, {"--moe-expert-parallel-size", "2"}},
                          Target{"uep_u2_ep1_z1", 2, 1, {"--ds-sequence-parallel-size", "2"}},
                          Target{"uep_single_z0", 1, 0, {}}}) {
    INFO(t.name);
    REQUIRE(run_with_config(t.name, t.world, 2, t.zero, moe_args(1, with(top2, with(t.extra, {"--load", ck}))), &lm,
                            &log)
                .empty());
    REQUIRE(lm.size() == kIters - 4);
    require_same_curve(single.lm, lm, 4);
  }
}

TEST_CASE("Expert tensor parallelism: TP2 (with SP, EP2, PR-MoE, SwiGLU) reproduces the single-process curve; "
          "its checkpoints load into other layouts") {
  const std::vector<std::string> top2 = {"--topk", "2", "--disable-moe-top2-2nd-expert-sampling"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = top2;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::string etp = "--enable-expert-tensor-parallelism";
  const Run single = run("etp_single", 1, 0, 1, top2);
  {
    INFO("TP2, experts split over tp: the same curve, and a rank holds half of each expert");
    auto held = [&](const std::string& name, const std::vector<std::string>& extra) {
      std::vector<double> lm;
      std::string log;
      REQUIRE(run_with_config(name, 2, 2, 0, moe_args(2, with(extra)), &lm, &log).empty());
      require_same_curve(single.lm, lm);
      std::smatch m;
      const std::regex line(R"(tensor parallel: 2 ranks, this rank holds (\d+) of the model's (\d+) parameters)");
      REQUIRE(std::regex_search(log, m, line));
      return std::make_pair(std::stoll(m[1]), log);
    };
    const auto [replicated, log_rep] = held("etp_tp2_replicated", {});
    const auto [split, log_split] = held("etp_tp2", {etp});
    CHECK(split < replicated);
    CHECK_THAT(log_split, Catch::Contains("expert tensor parallel: each expert's fc and proj split over the 2 tp "
                                          "ranks"));
    CHECK_THAT(log_rep, !Catch::Contains("expert tensor parallel"));
  }
  {
    INFO("TP2 with --sequence-parallel, ZeRO-1");
    same_run(single, run("etp_tp2_sp", 2, 1, 2, with({etp, "--sequence-parallel"})));
  }
  {
    INFO("TP2 DP2 EP2, ZeRO-2");
    same_run(single, run("etp_tp2_ep2", 4, 2, 2, with({etp, "--moe-expert-parallel-size", "2"})));
  }
  {
    INFO("PR-MoE (the dense branch replicated), TP2");
    const std::vector<std::string> pr = {"--mlp-type", "residual", "--topk", "1"};
    std::vector<std::string> pr_etp = pr;
    pr_etp.push_back(etp);
    same_run(run("etp_pr_single", 1, 0, 1, pr), run("etp_pr_tp2", 2, 0, 2, pr_etp));
  }
  {
    INFO("SwiGLU experts ([gate | up] rows, each split), TP2 DP2 EP2");
    same_run(run("etp_llama_single", 1, 0, 1, top2, 1, true),
             run("etp_llama_tp2_ep2", 4, 0, 2, with({etp, "--moe-expert-parallel-size", "2"}), 1, true));
  }
  // Saved with the experts split over tp and ep; loaded into one process, and
  // into TP2 with replicated experts.
  const std::string ck = dist_data().dir + "/ckpt_moe_etp";
  fs::remove_all(ck);
  std::vector<double> lm;
  std::string log;
  REQUIRE(run_with_config("etp_ck_first", 4, 2, 1,
                          moe_args(2, with({etp, "--moe-expert-parallel-size", "2", "--save", ck, "--save-interval",
                                            "4", "--exit-interval", "4"})),
                          &lm, &log)
              .empty());
  REQUIRE(lm.size() == 4);
  require_same_curve(single.lm, lm);
  struct Target {
    const char* name;
    int world, tp;
    std::vector<std::string> extra;
  };
  for (const Target& t : {Target{"etp_ck_single", 1, 1, {}}, Target{"etp_ck_tp2_replicated", 2, 2, {}},
                          Target{"etp_ck_tp2_ep2", 4, 2, {etp, "--moe-expert-parallel-size", "2"}}}) {
    INFO(t.name);
    std::vector<std::string> extra = t.extra;
    extra.insert(extra.end(), {"--load", ck});
    const std::string err = run_with_config(t.name, t.world, 2, 1, moe_args(t.tp, with(extra)), &lm, &log);
    INFO(err);
    REQUIRE(err.empty());
    REQUIRE(lm.size() == kIters - 4);
    require_same_curve(single.lm, lm, 4);
  }
}

TEST_CASE("MoE flags that do not fit are one line naming them") {
  CHECK(fail(1, 1, {"--topk", "5"}).find("model.moe.topk 5 (--topk) must be in [1, 4]") != std::string::npos);
  CHECK(fail(1, 1, {"--num-experts", "4", "2", "2"}).find("model.moe.num_experts (--num-experts) has 3 values") !=
        std::string::npos);
  CHECK(fail(2, 1, {"--moe-expert-parallel-size", "4"}).find("--moe-expert-parallel-size 4 does not divide the "
                                                             "data-parallel size 2") != std::string::npos);
  CHECK(fail(2, 1, {"--moe-expert-parallel-size", "2", "--num-experts", "3"})
            .find("not divisible by the expert-parallel size 2") != std::string::npos);
  // Expert-parallel groups are data-parallel ranks at one sequence position:
  // EP divides DP, not DP x Ulysses.
  CHECK(fail(4, 1, {"--ds-sequence-parallel-size", "2", "--moe-expert-parallel-size", "4"})
            .find("--moe-expert-parallel-size 4 does not divide the data-parallel size 2") != std::string::npos);
}
