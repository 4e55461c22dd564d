// DeepSpeed's other optimizers (Adam with L2 decay, SGD, Adagrad, Lion, Lamb, and the
// 1-bit family: OneBitAdam, ZeroOneAdam, OneBitLamb)
// in real dstrain processes: DP2 with ZeRO-1 and ZeRO-2 and TP2 reproduce the
// single-process loss curve (relative 1e-5; Lamb's per-tensor norms summed
// over the ZeRO shards), a run saved and resumed is the uninterrupted curve,
// and resuming with another optimizer (Lamb's checkpoint under Adam: the same
// state names) is refused with one line. Lamb under TP2 computes each rank's
// trust ratios on its own slices (DeepSpeed and Megatron's semantics): a
// different curve by design, checked to train. Under expert parallelism
// each sharding group has its own optimizer: Lamb and Adagrad give the curve
// of one group there.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 8;

struct Opt {
  const char* name;
  const char* json;          // the optimizer section
  const char* more = "";     // more top-level keys (", \"scheduler\": ...")
};
const Opt kOpts[] = {
    {"adam_l2", R"({"type": "Adam", "params": {"lr": 3e-3, "weight_decay": 0.1, "adam_w_mode": false}})"},
    {"sgd", R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}})"},
    {"adagrad", R"({"type": "Adagrad", "params": {"lr": 0.01, "lr_decay": 0.01, "weight_decay": 0.01}})"},
    {"lion", R"({"type": "Lion", "params": {"lr": 3e-4, "weight_decay": 0.1}})"},
    {"lamb", R"({"type": "Lamb", "params": {"lr": 3e-3, "weight_decay": 0.1, "max_coeff": 5.0}})"},
};

// One run of `opt` (config written here), rank 0's CSV losses; "" or the failure in `err`.
std::vector<double> run(const std::string& name, const Opt& opt, int world, int zero_stage, int tp,
                        std::vector<std::string> extra, std::string* err_out = nullptr, int pp = 1) {
  const DistData& d = dist_data();
  const std::string cfg = d.dir + "/" + name + ".json";
  {
    std::ofstream f(cfg);
    f << "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": " << 8 / (world / tp / pp) / 2
      << ", \"optimizer\": " << opt.json << opt.more << ", \"zero_optimization\": {\"stage\": " << zero_stage
      << ", \"reduce_bucket_size\": 5000}, \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" << d.dir
      << "/csv\", \"job_name\": \"" << name << "\"}}";
  }
  std::vector<std::string> args = small_model_args({.layers = 2, .tp = tp, .pp = pp, .iters = kIters});
  if (*opt.more)  // a DeepSpeed scheduler: drop the Megatron schedule's flags
    for (const char* flag : {"--min-lr", "--lr-warmup-iters"})
      for (auto it = args.begin(); it != args.end(); ++it)
        if (*it == flag) {
          args.erase(it, it + 2);
          break;
        }
  args.insert(args.end(), {"--config", cfg});
  args.insert(args.end(), extra.begin(), extra.end());
  std::string log;
  DstrainJob job{world, args};
  job.rank0_output = &log;
  const std::string err = run_dstrain(job);
  if (err_out) {
    *err_out = err;
    return {};
  }
  INFO(err);
  REQUIRE(err.empty());
  return read_losses(d.dir + "/csv/" + name + "/train.csv");
}

}  // namespace

TEST_CASE("each optimizer at DP2 ZeRO-1/2 and TP2 reproduces its single-process curve") {
  for (const Opt& o : kOpts) {
    const std::string n = o.name;
    INFO(n);
    const std::vector<double> single = run(n + "_single", o, 1, 0, 1, {});
    REQUIRE(single.size() == kIters);
    for (double l : single) REQUIRE(std::isfinite(l));
    REQUIRE(single.back() < single.front());  // it trains
    for (int stage : {1, 2}) {
      INFO("DP2 ZeRO-" << stage);
      require_same_curve(single, run(n + "_dp2_z" + std::to_string(stage), o, 2, stage, 1, {}));
    }
    INFO("TP2");
    const std::vector<double> tp2 = run(n + "_tp2", o, 2, 0, 2, {});
    REQUIRE(tp2.size() == kIters);
    if (n != "lamb") {
      require_same_curve(single, tp2);
    } else {  // trust ratios of each rank's slices: its own curve, which trains
      for (double l : tp2) REQUIRE(std::isfinite(l));
      REQUIRE(tp2.back() < tp2.front());
    }
  }
}

TEST_CASE("each optimizer resumes bit-exact, and a checkpoint of another optimizer is refused") {
  for (const Opt& o : kOpts) {
    const std::string n = o.name;
    INFO(n);
    const std::vector<double> single = run(n + "_ref", o, 2, 1, 1, {});
    const std::string ck = dist_data().dir + "/ckpt_opt_" + n;
    fs::remove_all(ck);
    const std::vector<double> first =
        run(n + "_first", o, 2, 1, 1, {"--save", ck, "--save-interval", "4", "--exit-interval", "4"});
    REQUIRE(first.size() == 4);
    const std::vector<double> second = run(n + "_second", o, 2, 1, 1, {"--load", ck});
    REQUIRE(second.size() == kIters - 4);
    for (size_t i = 0; i < second.size(); ++i) REQUIRE(second[i] == single[i + 4]);  // bit-exact
  }
  // Lamb's checkpoint under Adam (the same state names): one line naming both.
  std::string err;
  run("lamb_as_adam", kOpts[0], 2, 1, 1, {"--load", dist_data().dir + "/ckpt_opt_lamb"}, &err);
  CHECK(err.find("was saved by the optimizer Lamb, this run's optimizer is Adam") != std::string::npos);
}

TEST_CASE("OneCycle (cycling Lamb's beta1) and LRRangeTest: DP2 ZeRO-1 equals one process, and resumes bit-exact") {
  const Opt scheds[] = {
      {"onecycle_lamb", R"({"type": "Lamb", "params": {"weight_decay": 0.1}})",
       R"(, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 4e-3,
          "cycle_first_step_size": 3, "cycle_second_step_size": 2, "decay_step_size": 1, "decay_lr_rate": 0.2,
          "decay_mom_rate": 0.01}})"},
      {"rangetest_adamw", R"({"type": "AdamW"})",
       R"(, "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-3,
          "lr_range_test_step_size": 2, "lr_range_test_staircase": true}})"},
  };
  for (const Opt& o : scheds) {
    const std::string n = o.name;
    INFO(n);
    const std::vector<double> single = run(n + "_single", o, 1, 0, 1, {});
    REQUIRE(single.size() == kIters);
    REQUIRE(single.back() < single.front());
    const std::vector<double> dp2 = run(n + "_dp2", o, 2, 1, 1, {});
    require_same_curve(single, dp2);
    const std::string ck = dist_data().dir + "/ckpt_sched_" + n;
    fs::remove_all(ck);
    run(n + "_first", o, 2, 1, 1, {"--save", ck, "--save-interval", "4", "--exit-interval", "4"});
    const std::vector<double> second = run(n + "_second", o, 2, 1, 1, {"--load", ck});
    REQUIRE(second.size() == kIters - 4);
    for (size_t i = 0; i < second.size(); ++i) REQUIRE(second[i] == dp2[i + 4]);
  }
}

TEST_CASE("bf16 and fp16: Lamb and Lion at PP2 give the single-process bf16 curve, SGD and Adagrad train in fp16") {
  for (const Opt* o : {&kOpts[4], &kOpts[3]}) {
    const std::string n = o->name;
    INFO(n);
    const std::vector<double> single = run(n + "_bf16", *o, 1, 0, 1, {"--bf16"});
    REQUIRE(single.size() == kIters);
    REQUIRE(single.back() < single.front());
    require_same_curve(single, run(n + "_bf16_pp2", *o, 2, 0, 1, {"--bf16"}, nullptr, 2));
  }
  for (const Opt* o : {&kOpts[1], &kOpts[2]}) {
    const std::string n = o->name;
    INFO(n);
    const std::vector<double> l = run(n + "_fp16", *o, 2, 2, 1, {"--fp16"});
    REQUIRE(l.size() == kIters);
    for (double x : l) REQUIRE(std::isfinite(x));
    REQUIRE(l.back() < l.front());
  }
}

// Expert parallelism at ZeRO 1-2: the dense weights and the experts are two
// sharding groups, each with an optimizer of its own on its packed layout
// (Lamb's per-tensor norms summed over the group's ranks). DP2 x EP2 gives
// the DP2 curve of one sharding group (the same micro-batches: the routing's
// capacity and l_aux depend on them), which is the single-process one.
TEST_CASE("Lamb and Adagrad with expert parallelism (an optimizer per sharding group) give the one-group curve") {
  const std::vector<std::string> moe = {"--num-experts", "4", "--expert-interval", "1"};
  std::vector<std::string> ep = moe;
  ep.insert(ep.end(), {"--moe-expert-parallel-size", "2"});
  for (const Opt& o : kOpts) {
    const std::string n = o.name;
    if (n != "lamb" && n != "adagrad") continue;
    INFO(n);
    for (int stage : {1, 2}) {
      INFO("DP2 x EP2 ZeRO-" << stage);
      const std::string z = "_z" + std::to_string(stage);
      const std::vector<double> one = run(n + "_moe_dp2" + z, o, 2, stage, 1, moe);
      REQUIRE(one.size() == kIters);
      REQUIRE(one.back() < one.front());
      require_same_curve(one, run(n + "_moe_ep2" + z, o, 2, stage, 1, ep));
    }
  }
}

// DeepSpeed's 1-bit Adam at ZeRO stage 0: during the warm-up the gradients
// are all-reduced, so DP2 is the single-process curve (a freeze_step beyond
// the run); with freeze_step 3 the first four losses are still that curve
// (the initialising step, two warm-up steps, and the loss before the first
// compressed update), then each rank's momentum goes through the 1-bit
// exchange and the run trains on its own curve. A ZeRO stage is refused.
TEST_CASE("OneBitAdam: the warm-up is the single-process curve at DP2, the compressed phase trains") {
  const Opt warm{"onebit_warm",
                 R"({"type": "OneBitAdam", "params": {"lr": 3e-3, "weight_decay": 0.1, "freeze_step": 100}})"};
  const std::vector<double> single = run("onebit_single", warm, 1, 0, 1, {});
  REQUIRE(single.size() == kIters);
  REQUIRE(single.back() < single.front());
  require_same_curve(single, run("onebit_dp2_warm", warm, 2, 0, 1, {}));
  const Opt frozen{"onebit_frozen",
                   R"({"type": "OneBitAdam", "params": {"lr": 3e-3, "weight_decay": 0.1, "freeze_step": 3}})"};
  const std::vector<double> one = run("onebit_single3", frozen, 1, 0, 1, {});
  const std::vector<double> dp2 = run("onebit_dp2_frozen", frozen, 2, 0, 1, {});
  REQUIRE(dp2.size() == kIters);
  for (int i = 0; i < 4; ++i) CHECK(std::abs(dp2[i] - one[i]) <= 1e-5 * std::abs(one[i]));
  bool differs = false;
  for (size_t i = 4; i < dp2.size(); ++i) {
    REQUIRE(std::isfinite(dp2[i]));
    differs = differs || std::abs(dp2[i] - one[i]) > 1e-5 * std::abs(one[i]);
  }
  CHECK(differs);  // the compressed momentum is not the all-reduced one
  // The first compressed step (row 3, the single-process weights) clips by
  // rank 0's local gradient: the mean over its own half of the batch, not
  // that divided by the data-parallel size (DeepSpeed's engine leaves the
  // local gradients unscaled when it skips the all-reduce).
  const std::vector<double> norm_one = read_csv_column(dist_data().dir + "/csv/onebit_single3/train.csv", "grad_norm");
  const std::vector<double> norm_dp2 = read_csv_column(dist_data().dir + "/csv/onebit_dp2_frozen/train.csv", "grad_norm");
  CHECK(std::abs(norm_dp2[2] - norm_one[2]) <= 1e-5 * norm_one[2]);  // warm-up: the all-reduced gradient's
  INFO("local " << norm_dp2[3] << ", whole batch " << norm_one[3]);
  CHECK(norm_dp2[3] > 0.8 * norm_one[3]);
  // Each rank clips by its own local norm, summed over its tensor-parallel
  // ranks (each replicated weight counted once): at DP2 x TP2 rank 0's
  // first one is the DP2 run's rank 0's (the same samples and weights), and
  // the run trains.
  const std::vector<double> tp2 = run("onebit_dp2_tp2", frozen, 4, 0, 2, {});
  REQUIRE(tp2.size() == kIters);
  const std::vector<double> norm_tp2 = read_csv_column(dist_data().dir + "/csv/onebit_dp2_tp2/train.csv", "grad_norm");
  // (rows 0-3 share their weights; row 3 is the first local norm; after it
  // the tensor-parallel slices are compressed as tensors of their own)
  for (int i = 0; i < 4; ++i) CHECK(std::abs(norm_tp2[i] - norm_dp2[i]) <= 1e-5 * norm_dp2[i]);
  CHECK(tp2.back() < tp2.front() - 0.2);
  // fp16: one compression unit per parameter group (DeepSpeed's fp16 wrapper); it trains.
  std::string log16;
  {
    DstrainJob job{2, small_model_args({.layers = 2, .iters = kIters})};
    const std::string cfg = dist_data().dir + "/onebit_fp16.json";
    std::ofstream(cfg) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0},
        "optimizer": {"type": "OneBitAdam", "params": {"lr": 3e-3, "weight_decay": 0.1, "freeze_step": 3}}})";
    job.args.insert(job.args.end(), {"--config", cfg, "--fp16"});
    job.rank0_output = &log16;
    REQUIRE(run_dstrain(job).empty());
  }
  CHECK(log16.find("each parameter group's (fp16, as DeepSpeed's) momentum exchanged in 1-bit form") != std::string::npos);
  CHECK(dp2.back() < dp2.front() - 0.2);
  // Saved in the compressed phase and resumed: the resumed process starts
  // with an initialising step again (as DeepSpeed) and goes on compressing.
  const std::string ck = dist_data().dir + "/onebit_ck";
  fs::remove_all(ck);
  run("onebit_first", frozen, 2, 0, 1, {"--save", ck, "--save-interval", "4", "--exit-interval", "4"});
  const std::vector<double> resumed = run("onebit_resumed", frozen, 2, 0, 1, {"--load", ck});
  REQUIRE(resumed.size() == kIters - 4);
  for (double l : resumed) REQUIRE(std::isfinite(l));
  CHECK(resumed.front() == dp2[4]);  // the loss before the first update after the load: the same weights
  std::string err;
  run("onebit_z1", frozen, 2, 1, 1, {}, &err);
  CHECK(err.find("1bit-Adam is not compatible with ZeRO") != std::string::npos);
}

// 0/1 Adam: with a variance interval that never grows (var_update_scaler
// beyond the run) every step is a variance step on all-reduced gradients, so
// DP2 is the single-process curve. With small intervals the run goes
// through compressed gradients between variance steps and then local steps
// with synchronisations: it trains, and resumes from a checkpoint.
TEST_CASE("ZeroOneAdam: variance steps are the single-process curve at DP2, the local steps train and resume") {
  const Opt dense{"zoadam_dense", R"({"type": "ZeroOneAdam", "params": {"lr": 3e-3, "weight_decay": 0.1,
      "var_freeze_step": 100, "var_update_scaler": 100}})"};
  const std::vector<double> single = run("zoadam_single", dense, 1, 0, 1, {});
  REQUIRE(single.size() == kIters);
  REQUIRE(single.back() < single.front());
  require_same_curve(single, run("zoadam_dp2_dense", dense, 2, 0, 1, {}));
  const Opt local{"zoadam_local", R"({"type": "ZeroOneAdam", "params": {"lr": 3e-3, "weight_decay": 0.1,
      "var_freeze_step": 3, "var_update_scaler": 1, "local_step_scaler": 2, "local_step_clipper": 4}})"};
  const std::vector<double> dp2 = run("zoadam_dp2_local", local, 2, 0, 1, {});
  REQUIRE(dp2.size() == kIters);
  for (double l : dp2) REQUIRE(std::isfinite(l));
  CHECK(dp2.back() < dp2.front() - 0.2);
  const std::string ck = dist_data().dir + "/zoadam_ck";
  fs::remove_all(ck);
  run("zoadam_first", local, 2, 0, 1, {"--save", ck, "--save-interval", "4", "--exit-interval", "4"});
  const std::vector<double> resumed = run("zoadam_resumed", local, 2, 0, 1, {"--load", ck});
  REQUIRE(resumed.size() == kIters - 4);
  CHECK(resumed.front() == dp2[4]);  // rank 0's weights (a synchronisation step: every rank's)
  for (double l : resumed) REQUIRE(std::isfinite(l));
}

// 1-bit Lamb: the warm-up (a freeze_step beyond the run) is the
// single-process curve at DP2; with freeze_step 3 the compression stage
// trains, its checkpoint keeps the per-tensor values (frozen trust ratios,
// factors, momentum scales) and resumes in the compression stage, and a
// load into another tensor-parallel layout is refused with one line.
TEST_CASE("OneBitLamb: the warm-up is the single-process curve at DP2, the compression stage trains and resumes") {
  const Opt warm{"olamb_warm", R"({"type": "OneBitLamb", "params": {"weight_decay": 0.1,
      "freeze_step": 100}})"};
  const std::vector<double> single = run("olamb_single", warm, 1, 0, 1, {"--lr", "3e-2"});
  REQUIRE(single.size() == kIters);
  REQUIRE(single.back() < single.front());
  require_same_curve(single, run("olamb_dp2_warm", warm, 2, 0, 1, {"--lr", "3e-2"}));
  const Opt frozen{"olamb_frozen", R"({"type": "OneBitLamb", "params": {"weight_decay": 0.1,
      "freeze_step": 3}})"};
  const std::vector<double> one = run("olamb_single3", frozen, 1, 0, 1, {"--lr", "3e-2"});
  const std::vector<double> dp2 = run("olamb_dp2_frozen", frozen, 2, 0, 1, {"--lr", "3e-2"});
  REQUIRE(dp2.size() == kIters);
  for (int i = 0; i < 4; ++i) CHECK(std::abs(dp2[i] - one[i]) <= 1e-5 * std::abs(one[i]));
  for (double l : dp2) REQUIRE(std::isfinite(l));
  CHECK(dp2.back() < dp2.front() - 0.1);
  CHECK(std::abs(dp2.back() - one.back()) < 0.02);  // the compression costs little against one process
  const std::string ck = dist_data().dir + "/olamb_ck";
  fs::remove_all(ck);
  run("olamb_first", frozen, 2, 0, 1, {"--lr", "3e-2", "--save", ck, "--save-interval", "4", "--exit-interval", "4"});
  const std::vector<double> resumed = run("olamb_resumed", frozen, 2, 0, 1, {"--lr", "3e-2", "--load", ck});
  REQUIRE(resumed.size() == kIters - 4);
  CHECK(resumed.front() == dp2[4]);
  for (double l : resumed) REQUIRE(std::isfinite(l));
  CHECK(resumed.back() < resumed.front());
  // Saved at the step that reached freeze_step (the frozen ratios kept, the
  // momentum scales not yet computed): the resumed run goes on training on
  // the curve (frozen ratios lost would stop the weights).
  const std::string ck3 = dist_data().dir + "/olamb_ck3";
  fs::remove_all(ck3);
  run("olamb_first3", frozen, 2, 0, 1, {"--lr", "3e-2", "--save", ck3, "--save-interval", "3", "--exit-interval", "3"});
  const std::vector<double> resumed3 = run("olamb_resumed3", frozen, 2, 0, 1, {"--lr", "3e-2", "--load", ck3});
  REQUIRE(resumed3.size() == kIters - 3);
  CHECK(resumed3.front() == dp2[3]);
  CHECK(resumed3.back() < resumed3.front() - 0.03);  // (its first iteration initialises: one update fewer)
  std::string err;
  run("olamb_tp2", frozen, 2, 0, 2, {"--lr", "3e-2", "--load", ck}, &err);
  CHECK(err.find("holds OneBitLamb's per-tensor values of its compression stage, which load into the layout it was "
                 "saved with only (tensor 1, pipeline 1; this job: tensor 2, pipeline 1)") != std::string::npos);
}
