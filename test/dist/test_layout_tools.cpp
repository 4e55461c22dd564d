// Every tool on checkpoints written by every layout (ParallelLayout): a
// DeepSpeed-Ulysses SP2 run and a TP2 + sequence parallel + PP2 run (real
// dstrain processes over Gloo) save at step 4 of 8; then
//  - dsgen --load generates from each checkpoint (one process);
//  - dsconvert rewrites each for one process, and for another multi-rank
//    layout (Ulysses 1 x DP 2; TP 2 x Ulysses 2), and exports it to Hugging Face;
//  - a single process resumes each checkpoint directly and from dsconvert's
//    one-process output, both on the saving run's curve (steps 5-8,
//    relative 1e-5), as the DP 2 rewrite of the Ulysses checkpoint does;
//  - --estimate-memory of the Ulysses job names DP 1 and Ulysses 2 and
//    sizes activations with T/2 positions per rank.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

struct Layout {
  std::string name;
  int world = 1;
  std::vector<std::string> args;
};

const Layout kUlysses{"lt_ulysses2", 2, {"--ds-sequence-parallel-size", "2"}};
const Layout kTpSpPp{"lt_tp2_sp_pp2", 4, {"--sequence-parallel", "--pipeline-model-parallel-size", "2"}};

std::vector<std::string> model_args(const Layout& l, int tp) {
  SmallModel m;
  m.iters = 8;
  m.tp = tp;
  std::vector<std::string> a = small_model_args(m);
  a.insert(a.end(), l.args.begin(), l.args.end());
  return a;
}

std::vector<double> train(const std::string& name, int world, int tp, const Layout& l,
                          const std::vector<std::string>& extra) {
  std::vector<std::string> a = model_args(l, tp);
  a.insert(a.end(), extra.begin(), extra.end());
  std::vector<double> losses;
  const std::string err = run_with_config(name, world, 2, 1, a, &losses, nullptr);
  INFO(name << ": " << err);
  REQUIRE(err.empty());
  return losses;
}

// The layout's run of 8 steps, saving at 4 and 8; `latest` reset to step 4.
// Returns the 8 losses; *ck gets the checkpoint directory.
std::vector<double> saved_run(const Layout& l, int tp, std::string* ck) {
  *ck = dist_data().dir + "/" + l.name + "_ck";
  fs::remove_all(*ck);
  std::vector<double> losses = train(l.name, l.world, tp, l, {"--save", *ck, "--save-interval", "4"});
  REQUIRE(losses.size() == 8);
  std::ofstream(*ck + "/latest", std::ios::trunc) << "global_step4\n";
  return losses;
}

// A single process resuming `ck` (the layout's flags reset to one process) continues `ref` from step 5.
void resume_single(const Layout& l, const std::string& name, const std::string& ck, const std::vector<double>& ref) {
  SmallModel m;
  m.iters = 8;
  std::vector<std::string> a = small_model_args(m);
  a.insert(a.end(), {"--load", ck});
  std::vector<double> losses;
  const std::string err = run_with_config(name, 1, 2, 1, a, &losses, nullptr);
  INFO(l.name << " -> " << name << ": " << err);
  REQUIRE(err.empty());
  REQUIRE(losses.size() == 4);
  require_same_curve(ref, losses, 4);
}

// Runs every tool on the layout's checkpoint; returns the saving run's losses.
std::vector<double> check_tools(const Layout& l, int tp, const std::vector<std::string>& other_layout) {
  std::string ck;
  const std::vector<double> ref = saved_run(l, tp, &ck);
  const DistData& d = dist_data();
  const std::string dir = d.dir;
  std::string out;
  {
    INFO("dsgen --load " << l.name);
    const int rc = run_tool("dsgen", "--load " + ck + " --vocab-file " + d.vocab + " --merge-file " + d.merges +
                                         " --prompt 'To be' --max-new-tokens 4 --greedy", &out);
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("To be") != std::string::npos);
  }
  resume_single(l, l.name + "_direct", ck, ref);
  const std::string one = dir + "/" + l.name + "_one";
  fs::remove_all(one);
  {
    const int rc = run_tool("dsconvert", "--load " + ck + " --save " + one +
                                             " --target-tp 1 --target-pp 1 --target-dp 1"
                                             " --target-ds-sequence-parallel-size 1", &out);
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("TP=1 PP=1 DP=1") != std::string::npos);
  }
  resume_single(l, l.name + "_converted", one, ref);
  const std::string other = dir + "/" + l.name + "_other";
  fs::remove_all(other);
  std::string flags;
  for (const std::string& f : other_layout) flags += " " + f;
  const int rc = run_tool("dsconvert", "--load " + ck + " --save " + other + flags, &out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::string hf = dir + "/" + l.name + "_hf";
  fs::remove_all(hf);
  REQUIRE(run_tool("dsconvert", "--load " + ck + " --export-hf " + hf, &out) == 0);
  CHECK(fs::exists(hf + "/model.safetensors"));
  return ref;
}

}  // namespace

TEST_CASE("a Ulysses SP2 checkpoint: dsgen, dsconvert to every layout, --load as one process and as DP 2") {
  const std::vector<double> ref =
      check_tools(kUlysses, 1, {"--target-tp", "2", "--target-dp", "1"});  // TP 2 x Ulysses 2 (the saved size)
  std::string out;
  const std::string ck = dist_data().dir + "/lt_ulysses2_ck", dp2 = dist_data().dir + "/lt_ulysses2_dp2";
  fs::remove_all(dp2);
  const int rc = run_tool("dsconvert", "--load " + ck + " --save " + dp2 +
                                           " --target-tp 1 --target-dp 2 --target-ds-sequence-parallel-size 1", &out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(fs::exists(dp2 + "/global_step4/optim_rank00001_of_00002.safetensors"));
  // DP 2 from the rewrite continues the Ulysses run's curve.
  SmallModel m;
  m.iters = 8;
  std::vector<std::string> a = small_model_args(m);
  a.insert(a.end(), {"--load", dp2});
  std::vector<double> losses;
  const std::string err = run_with_config("lt_ulysses2_to_dp2", 2, 2, 1, a, &losses, nullptr);
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(losses.size() == 4);
  require_same_curve(ref, losses, 4);
}

TEST_CASE("a TP2 + SP + PP2 checkpoint: dsgen, dsconvert to every layout, --load as one process") {
  check_tools(kTpSpPp, 2, {"--target-tp", "1", "--target-pp", "2", "--target-dp", "2"});
}

TEST_CASE("--estimate-memory of a Ulysses job: DP 1, ZeRO over Ulysses x DP, T/U positions per rank") {
  std::vector<std::string> a = model_args(kUlysses, 1);
  a.push_back("--estimate-memory");
  std::string log;
  const std::string err = run_with_config("lt_estimate", 2, 2, 1, a, nullptr, &log);
  INFO(err << log);
  REQUIRE(err.empty());
  CHECK(log.find("TP=1 PP=1 DP=1 Ulysses=2 (ZeRO partitions over Ulysses x DP = 2 ranks)") != std::string::npos);
  CHECK(log.find("micro batch 2 x seq 16 of 32") != std::string::npos);
}

// --init-from a Hugging Face export (the weights a one-process run trained
// for 4 steps, exported as LLaMA with grouped-query attention): each rank
// reads only the HF tensors it needs, and every layout starts from the same
// weights, so TP2 with sequence parallelism, PP2 and ZeRO-3 DP2 reproduce
// the one-process curve from them (relative 1e-5).
TEST_CASE("--init-from a Hugging Face export: TP2 + SP, PP2 and ZeRO-3 DP2 start where one process does") {
  const std::string hf = dist_data().dir + "/lt_init_hf";
  fs::remove_all(hf);
  auto args = [](int tp, int iters, std::vector<std::string> extra) {
    SmallModel m;
    m.iters = iters;
    m.tp = tp;
    m.llama = true;
    std::vector<std::string> a = small_model_args(m);
    a.insert(a.end(), {"--num-key-value-heads", "2"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  REQUIRE(run_with_config("lt_init_export", 1, 2, 0, args(1, 4, {"--export-hf", hf}), nullptr, nullptr).empty());
  auto run = [&](const std::string& name, int world, int zero, int tp, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--init-from", hf});
    std::vector<double> losses;
    const std::string err = run_with_config(name, world, 2, zero, args(tp, 8, extra), &losses, nullptr);
    INFO(name << ": " << err);
    REQUIRE(err.empty());
    REQUIRE(losses.size() == 8);
    return losses;
  };
  const std::vector<double> single = run("lt_init_single", 1, 0, 1, {});
  SmallModel fresh;
  fresh.iters = 8;
  fresh.llama = true;
  std::vector<std::string> fa = small_model_args(fresh);
  fa.insert(fa.end(), {"--num-key-value-heads", "2"});
  std::vector<double> scratch;
  REQUIRE(run_with_config("lt_init_scratch", 1, 2, 0, fa, &scratch, nullptr).empty());
  REQUIRE(single.front() < scratch.front());  // it starts from the trained weights
  INFO("TP2 + SP");
  require_same_curve(single, run("lt_init_tp2_sp", 2, 1, 2, {"--sequence-parallel"}));
  INFO("PP2");
  require_same_curve(single, run("lt_init_pp2", 2, 0, 1, {"--pipeline-model-parallel-size", "2"}));
  INFO("ZeRO-3 DP2");
  require_same_curve(single, run("lt_init_z3_dp2", 2, 3, 1, {}));
}
