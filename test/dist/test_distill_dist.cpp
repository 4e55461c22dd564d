// Knowledge distillation in real dstrain processes (docs/distillation.md):
// a 3-layer teacher trained and saved, then a 2-layer student trained with
// Megatron-DeepSpeed's --kd flags against it. The KD loss is per row, so DP2
// with ZeRO-1 and ZeRO-3 reproduces the single-process curve (lm loss and kd
// loss, relative 1e-5); --kd-beta-ce 0 is the curve without a teacher, bit
// for bit; a run saved and resumed is the uninterrupted curve; --mos with an
// MoE teacher and an expert-parallel student equals one process; bad inputs
// are one line naming the flag.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <regex>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 8;

struct Run {
  std::vector<double> lm, kd;  // per iteration: lm loss (CSV), kd / mos loss (log line)
};

std::vector<std::string> args(int layers, std::vector<std::string> extra) {
  std::vector<std::string> a = small_model_args({.layers = layers, .iters = kIters});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The teacher of every case, trained once: `moe` adds 4 experts per layer.
const std::string& teacher(bool moe) {
  static std::string dirs[2];
  std::string& dir = dirs[moe];
  if (!dir.empty()) return dir;
  dir = dist_data().dir + (moe ? "/kd_teacher_moe" : "/kd_teacher");
  fs::remove_all(dir);
  std::vector<std::string> extra = {"--save", dir};
  if (moe) extra.insert(extra.end(), {"--num-experts", "4", "--expert-interval", "1"});
  const std::string err = run_with_config(moe ? "kd_teacher_moe" : "kd_teacher", 1, 2, 0, args(3, extra), nullptr,
                                          nullptr);
  INFO(err);
  REQUIRE(err.empty());
  return dir;
}

Run run(const std::string& name, int world, int zero_stage, std::vector<std::string> extra, bool moe = false,
        const char* label = "kd loss") {
  std::vector<std::string> kd = {"--kd", "--kd-beta-ce", "2", "--kd-temp", "2", "--load-teacher", teacher(moe),
                                 "--num-layers-teacher", "3"};
  kd.insert(kd.end(), extra.begin(), extra.end());
  Run r;
  std::string log;
  const std::string err = run_with_config(name, world, 2, zero_stage, args(2, kd), &r.lm, &log);
  INFO(err);
  REQUIRE(err.empty());
  const std::regex re(std::string(R"(\| )") + label + R"(: ([-+0-9.Ee]+) \|)");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) r.kd.push_back(std::stod((*it)[1]));
  return r;
}

void same_run(const Run& ref, const Run& got) {
  require_same_curve(ref.lm, got.lm);
  INFO("kd loss");
  require_same_curve(ref.kd, got.kd);
}

std::string fail(int world, std::vector<std::string> extra) {
  std::string log;
  const std::string err = run_with_config("kd_bad", world, 2, 0, args(2, extra), nullptr, &log);
  REQUIRE(!err.empty());
  return err;
}

}  // namespace

TEST_CASE("KD: DP2 ZeRO-1 and ZeRO-3 reproduce one process; beta 0 is no teacher; resume is bit-exact") {
  const Run single = run("kd_single", 1, 0, {});
  REQUIRE(single.lm.size() == kIters);
  REQUIRE(single.kd.size() == kIters);
  for (double k : single.kd) REQUIRE(k > 0);  // beta * temp^2 * KL, positive for two different models
  REQUIRE(single.kd.back() < single.kd.front());  // the student moves towards the teacher
  const Run dp2_z1 = run("kd_dp2_z1", 2, 1, {});
  INFO("DP2 ZeRO-1");
  same_run(single, dp2_z1);
  INFO("DP2 ZeRO-3");
  same_run(single, run("kd_dp2_z3", 2, 3, {}));
  // Without the KD term's gradient the lm curve is the plain run's, bit for bit.
  const Run beta0 = run("kd_beta0", 1, 0, {"--kd-beta-ce", "0"});
  std::vector<double> plain;
  REQUIRE(run_with_config("kd_plain", 1, 2, 0, args(2, {}), &plain, nullptr).empty());
  REQUIRE(beta0.lm == plain);
  REQUIRE(single.lm != plain);
  // Resume: the first half saved, the second loaded (the teacher loaded again).
  const std::string ck = dist_data().dir + "/ckpt_kd";
  fs::remove_all(ck);
  const Run first = run("kd_first", 2, 1, {"--save", ck, "--save-interval", "4", "--exit-interval", "4"});
  REQUIRE(first.lm.size() == 4);
  const Run second = run("kd_second", 2, 1, {"--load", ck});
  REQUIRE(second.lm.size() == kIters - 4);
  for (size_t i = 0; i < second.lm.size(); ++i) {
    REQUIRE(second.lm[i] == dp2_z1.lm[i + 4]);  // bit-exact
    REQUIRE(second.kd[i] == dp2_z1.kd[i + 4]);
  }
}

TEST_CASE("MoS: an MoE student of an MoE teacher, expert-parallel DP2 equals one process") {
  const std::vector<std::string> mos = {"--mos", "--num-experts", "4", "--expert-interval", "1",
                                        "--num-experts-teacher", "4"};
  const Run single = run("mos_single", 1, 0, mos, true, "mos loss");
  REQUIRE(single.kd.size() == kIters);
  std::vector<std::string> ep = mos;
  ep.insert(ep.end(), {"--moe-expert-parallel-size", "2"});
  same_run(single, run("mos_dp2_ep2", 2, 1, ep, true, "mos loss"));
}

TEST_CASE("KD: bad inputs are one line naming the flag") {
  const std::string t = teacher(false);
  CHECK_THAT(fail(1, {"--kd"}), Catch::Contains("--kd needs --load-teacher"));
  CHECK_THAT(fail(1, {"--kd", "--load-teacher", t, "--num-layers-teacher", "5"}),
             Catch::Contains("--num-layers-teacher 5: the teacher in"));
  CHECK_THAT(fail(1, {"--kd", "--load-teacher", t, "--hidden-size-teacher", "64"}),
             Catch::Contains("--hidden-size-teacher 64"));
  CHECK_THAT(fail(1, {"--kd", "--load-teacher", t, "--num-experts-teacher", "4"}),
             Catch::Contains("--num-experts-teacher 4: the teacher in"));
  CHECK_THAT(fail(1, {"--kd", "--load-teacher", dist_data().dir + "/no_such_teacher"}),
             Catch::Contains("no_such_teacher"));
  CHECK_THAT(fail(2, {"--kd", "--load-teacher", t, "--tensor-model-parallel-size", "2"}),
             Catch::Contains("--kd with --tensor-model-parallel-size 2"));
  CHECK_THAT(fail(1, {"--kd", "--load-teacher", t, "--kd-temp", "0"}), Catch::Contains("--kd-temp"));
}
