// Pipeline parallelism (1F1B): the loss curve of a single process equals that
// of PP2 (GPT-2 family, tied embeddings), PP2 (LLaMA family, untied), PP4,
// PP2 interleaved (2 chunks per stage, also with DP2 and ZeRO-2),
// TP2 x PP2, PP2 x DP2 with ZeRO-2 and TP2 x PP2 x DP2 with ZeRO-1 at the same
// global batch (relative 1e-5, fp32, 20 steps, grad accumulation >= PP); a PP2
// checkpoint resumes on the same curve with PP2 and with PP1; an HF export
// from PP2 (and TP2 x PP2) is byte-identical to the single-process one.
// ZB-H1 (--enable-zbh1-pipeline): with exact semantics its weights after 20
// steps are bit-identical to 1F1B's (PP4, 8 micro-batches); the default
// variation, also with TP2 x PP2 + sequence parallelism and recomputation,
// and with DP2 + ZeRO-1, gives the single-process curve.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 20;

struct Run {
  std::string name;
  int world = 1, tp = 1, pp = 1, zero_stage = 0, layers = 2;
  bool llama = false;
  int iters = kIters;
  std::vector<std::string> extra;
  int micro = 2;  // per rank, of a global batch of 8
};

// Runs the job; returns "" on success, else the failure output. Losses of
// rank 0 go to `losses` (when the run succeeds).
std::string try_run(const Run& r, std::vector<double>* losses) {
  SmallModel m;
  m.layers = r.layers;
  m.tp = r.tp;
  m.pp = r.pp;
  m.iters = r.iters;
  m.llama = r.llama;
  std::vector<std::string> args = small_model_args(m);
  args.insert(args.end(), r.extra.begin(), r.extra.end());
  std::string log;
  std::string err = run_with_config(r.name, r.world, r.micro, r.zero_stage, args, nullptr, &log);
  // The job really ran as a pipeline (rank 0 is stage 0 and logs the schedule).
  auto has = [&](const char* flag) { return std::find(r.extra.begin(), r.extra.end(), flag) != r.extra.end(); };
  const std::string banner = "pipeline parallel: " + std::to_string(r.pp) + " stages (" +
                             (has("--num-layers-per-virtual-pipeline-stage") ? "interleaved 1F1B, 2 model chunks per stage)"
                              : has("--enable-zbh1-exact-semantics")         ? "ZB-H1, exact semantics)"
                              : has("--enable-zbh1-pipeline")                ? "ZB-H1)"
                                                                             : "1F1B)");
  if (err.empty() && r.pp > 1 && log.find(banner) == std::string::npos) err = "no '" + banner + "' in:\n" + log;
  if (err.empty() && losses) *losses = read_losses(dist_data().dir + "/csv/" + r.name + "/train.csv");
  return err;
}

std::vector<double> run(const Run& r) {
  std::vector<double> l;
  std::string err = try_run(r, &l);
  INFO(r.name << ": " << err);
  REQUIRE(err.empty());
  return l;
}

const std::vector<double>& single(bool llama, int layers) {
  static std::map<std::pair<bool, int>, std::vector<double>> cache;
  auto key = std::make_pair(llama, layers);
  if (!cache.count(key)) {
    Run r{"pp_single_" + std::string(llama ? "llama" : "gpt2") + "_L" + std::to_string(layers)};
    r.llama = llama;
    r.layers = layers;
    cache[key] = run(r);
  }
  return cache[key];
}

}  // namespace

TEST_CASE("PP2, PP4, TP2xPP2 and PP2xDP2 (ZeRO-2) match a single process (GPT-2 family, tied)") {
  const auto& ref = single(false, 2);
  REQUIRE(ref.size() == kIters);
  REQUIRE(ref.back() < ref.front() - 0.5);  // the model learns
  SECTION("PP2") { require_same_curve(ref, run({"pp2_gpt2", 2, 1, 2})); }
  SECTION("TP2xPP2") { require_same_curve(ref, run({"tp2pp2_gpt2", 4, 2, 2})); }
  SECTION("PP2xDP2 ZeRO-2") { require_same_curve(ref, run({"pp2dp2_z2", 4, 1, 2, 2})); }
  SECTION("PP4 (4 layers)") { require_same_curve(single(false, 4), run({"pp4_gpt2", 4, 1, 4, 0, 4})); }
  SECTION("TP2xPP2xDP2 ZeRO-1") { require_same_curve(ref, run({"tp2pp2dp2_z1", 8, 2, 2, 1})); }
  SECTION("PP2 interleaved (4 layers, 2 chunks per stage)") {
    Run r{"pp2_interleaved", 2, 1, 2, 0, 4};
    r.extra = {"--num-layers-per-virtual-pipeline-stage", "1"};
    require_same_curve(single(false, 4), run(r));
  }
  SECTION("PP2xDP2 interleaved with ZeRO-2 (4 layers)") {
    Run r{"pp2dp2_interleaved_z2", 4, 1, 2, 2, 4};
    r.extra = {"--num-layers-per-virtual-pipeline-stage", "1"};
    require_same_curve(single(false, 4), run(r));
  }
}

TEST_CASE("PP2 matches a single process (LLaMA family: untied, SwiGLU, RoPE, RMSNorm)") {
  const auto& ref = single(true, 2);
  REQUIRE(ref.size() == kIters);
  Run pp2{"pp2_llama", 2, 1, 2};
  pp2.llama = true;
  require_same_curve(ref, run(pp2));
  Run z2{"pp2dp2_z2_llama", 4, 1, 2, 2};
  z2.llama = true;
  require_same_curve(ref, run(z2));
}

TEST_CASE("a PP2 checkpoint resumes with PP2 and with PP1 on the same curve") {
  const std::string ck = dist_data().dir + "/ckpt_pp2";
  fs::remove_all(ck);
  Run a{"pp2_resume_a", 2, 1, 2, 1};
  a.extra = {"--save", ck, "--save-interval", "10", "--exit-interval", "10"};
  std::vector<double> first = run(a);
  REQUIRE(first.size() == 10);
  require_same_curve(single(false, 2), first);
  REQUIRE(fs::exists(ck + "/global_step10/model.safetensors"));
  REQUIRE(fs::exists(ck + "/global_step10/optim_pp01_tp00_rank00000_of_00001.safetensors"));
  Run b{"pp2_resume_b", 2, 1, 2, 1};
  b.extra = {"--load", ck};
  std::vector<double> second = run(b);
  REQUIRE(second.size() == 10);
  require_same_curve(single(false, 2), second, 10);
  Run c{"pp1_resume_reshaped", 1, 1, 1, 1};  // reshaped on load (lib/ckpt/reshape.h)
  c.extra = {"--load", ck};
  std::vector<double> third = run(c);
  REQUIRE(third.size() == 10);
  require_same_curve(single(false, 2), third, 10);
}

TEST_CASE("an HF export from PP2 equals the single-process export") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const std::string tag = llama ? "llama" : "gpt2";
    const fs::path out1 = dist_data().dir + "/pp_hf_single_" + tag, out2 = dist_data().dir + "/pp_hf_pp2_" + tag;
    Run s{"pp_hf_single_" + tag};
    s.llama = llama;
    s.iters = 0;
    s.extra = {"--export-hf", out1.string()};
    Run t{"pp_hf_tp2pp2_" + tag, 4, 2, 2};
    t.llama = llama;
    t.iters = 0;
    t.extra = {"--export-hf", out2.string()};
    std::string err = try_run(s, nullptr);
    INFO(err);
    REQUIRE(err.empty());
    err = try_run(t, nullptr);
    REQUIRE(err.empty());
    int files = 0;
    for (const auto& e : fs::directory_iterator(out1)) {
      INFO(e.path().filename().string());
      REQUIRE(fs::exists(out2 / e.path().filename()));
      CHECK(read_bytes(e.path()) == read_bytes(out2 / e.path().filename()));
      ++files;
    }
    REQUIRE(files > 0);
  }
}

TEST_CASE("ZB-H1 equals 1F1B: bit for bit with exact semantics, on the curve by default") {
  // 8 micro-batches through 4 stages: every section of the schedule runs
  // (input passes that wait, whole backwards, the cooldown's weight passes).
  const std::string dir = dist_data().dir;
  auto pp4 = [&](const std::string& name, std::vector<std::string> flags) {
    Run r{name, 4, 1, 4, 0, 4};
    r.micro = 1;
    r.extra = {"--save", dir + "/" + name, "--save-interval", "1000"};
    r.extra.insert(r.extra.end(), flags.begin(), flags.end());
    return run(r);
  };
  const std::vector<double> base = pp4("zb_base_1f1b", {});
  const std::vector<double> exact = pp4("zb_exact", {"--enable-zbh1-pipeline", "--enable-zbh1-exact-semantics"});
  const std::vector<double> variation = pp4("zb_default", {"--enable-zbh1-pipeline"});
  REQUIRE(exact == base);
  const std::string step = "/global_step" + std::to_string(kIters) + "/model.safetensors";
  REQUIRE(fs::exists(dir + "/zb_base_1f1b" + step));
  CHECK(read_bytes(dir + "/zb_exact" + step) == read_bytes(dir + "/zb_base_1f1b" + step));
  require_same_curve(single(false, 4), base);
  require_same_curve(single(false, 4), variation);
}

TEST_CASE("ZB-H1 with TP2 x PP2, sequence parallelism and recomputation, and with PP2 x DP2 ZeRO-1") {
  Run tp{"zb_tp2pp2_sp", 4, 2, 2};
  tp.micro = 1;
  tp.extra = {"--enable-zbh1-pipeline", "--sequence-parallel", "--checkpoint-activations"};
  require_same_curve(single(false, 2), run(tp));
  Run dp{"zb_pp2dp2_z1_llama", 4, 1, 2, 1};
  dp.llama = true;
  dp.micro = 1;
  dp.extra = {"--enable-zbh1-pipeline"};
  require_same_curve(single(true, 2), run(dp));
}

TEST_CASE("ZB-H1 refusals name the flags") {
  auto refused = [](const std::string& name, int world, int pp, int zero, std::vector<std::string> flags) {
    Run r{name, world, 1, pp, zero, 4};
    r.iters = 1;
    r.extra = std::move(flags);
    return try_run(r, nullptr);
  };
  CHECK_THAT(refused("zb_bad_exact", 2, 2, 0, {"--enable-zbh1-exact-semantics"}),
             Catch::Matchers::Contains("--enable-zbh1-exact-semantics (parallel.zbh1_exact_semantics) requires "
                                       "--enable-zbh1-pipeline"));
  CHECK_THAT(refused("zb_bad_vp", 2, 2, 0,
                     {"--enable-zbh1-pipeline", "--num-layers-per-virtual-pipeline-stage", "1"}),
             Catch::Matchers::Contains("--enable-zbh1-pipeline cannot be combined with "
                                       "--num-layers-per-virtual-pipeline-stage 1"));
  CHECK_THAT(refused("zb_bad_z2", 4, 2, 2, {"--enable-zbh1-pipeline"}),
             Catch::Matchers::Contains("--enable-zbh1-pipeline with zero_optimization.stage 2"));
}
