// Tensor parallelism: the loss curve of a single process equals that of TP2
// (GPT-2 family), TP2 (LLaMA family: SwiGLU, RoPE, RMSNorm, untied, no bias),
// TP4 and DP2 x TP2 with ZeRO-1 and ZeRO-3 at the same global batch (relative 1e-5, fp32,
// 20 steps); a TP2 checkpoint resumes on the same curve with TP2 and with TP1
// (reshaped on load); an HF export from TP2 is byte-identical to the
// single-process one. Grouped-query attention (LLaMA family, 2 or 1 kv heads
// for 4 query heads): TP2, TP4 (kv heads replicated over the ranks of a
// query group), DP2xTP2, PP2 and TP4 + SP on the single-process curve; a TP4
// checkpoint resumes with TP1 and TP2; TP4's HF export equals the single one.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 20;

struct Run {
  std::string name;
  int world = 1, tp = 1, zero_stage = 0, micro = 2;
  bool llama = false;
  int iters = kIters;
  std::vector<std::string> extra;
};

// Runs the job; returns "" on success, else the failure output. Losses of
// rank 0 go to `losses` (when the run succeeds).
std::string try_run(const Run& r, std::vector<double>* losses) {
  SmallModel m;
  m.tp = r.tp;
  m.iters = r.iters;
  m.llama = r.llama;
  std::vector<std::string> args = small_model_args(m);
  args.insert(args.end(), r.extra.begin(), r.extra.end());
  return run_with_config(r.name, r.world, r.micro, r.zero_stage, args, losses, nullptr);
}

std::vector<double> run(const Run& r) {
  std::vector<double> l;
  std::string err = try_run(r, &l);
  INFO(r.name << ": " << err);
  REQUIRE(err.empty());
  return l;
}

const std::vector<double>& single_gpt2() {
  static std::vector<double> l = run({"tp_single_gpt2"});
  return l;
}

}  // namespace

TEST_CASE("TP2, TP4 and DP2xTP2 (ZeRO-1, ZeRO-3) match a single process (GPT-2 family)") {
  REQUIRE(single_gpt2().size() == kIters);
  REQUIRE(single_gpt2().back() < single_gpt2().front() - 0.5);  // the model learns
  SECTION("TP2") { require_same_curve(single_gpt2(), run({"tp2_gpt2", 2, 2})); }
  SECTION("TP4") { require_same_curve(single_gpt2(), run({"tp4_gpt2", 4, 4})); }
  SECTION("DP2xTP2 ZeRO-1") { require_same_curve(single_gpt2(), run({"dp2tp2_z1", 4, 2, 1, 2})); }
  SECTION("DP2xTP2 ZeRO-3") { require_same_curve(single_gpt2(), run({"dp2tp2_z3", 4, 2, 3, 2})); }
}

TEST_CASE("TP2 matches a single process (LLaMA family: SwiGLU, RoPE, RMSNorm, untied, no bias)") {
  Run single{"tp_single_llama"};
  single.llama = true;
  Run tp2{"tp2_llama", 2, 2};
  tp2.llama = true;
  std::vector<double> ref = run(single);
  REQUIRE(ref.size() == kIters);
  require_same_curve(ref, run(tp2));
}

TEST_CASE("a TP2 checkpoint resumes with TP2 and with TP1 on the same curve") {
  const std::string ck = dist_data().dir + "/ckpt_tp2";
  fs::remove_all(ck);
  Run a{"tp2_resume_a", 2, 2, 1};
  a.extra = {"--save", ck, "--save-interval", "10", "--exit-interval", "10"};
  std::vector<double> first = run(a);
  REQUIRE(first.size() == 10);
  require_same_curve(single_gpt2(), first);
  REQUIRE(fs::exists(ck + "/global_step10/model.safetensors"));
  REQUIRE(fs::exists(ck + "/global_step10/optim_tp01_rank00000_of_00001.safetensors"));
  Run b{"tp2_resume_b", 2, 2, 1};
  b.extra = {"--load", ck};
  std::vector<double> second = run(b);
  REQUIRE(second.size() == 10);
  require_same_curve(single_gpt2(), second, 10);
  Run c{"tp1_resume", 1, 1, 1};  // reshaped on load (lib/ckpt/reshape.h; more in test_reshape.cpp)
  c.extra = {"--load", ck};
  require_same_curve(single_gpt2(), run(c), 10);
}

TEST_CASE("an HF export from TP2 equals the single-process export") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const std::string tag = llama ? "llama" : "gpt2";
    const std::string out1 = dist_data().dir + "/hf_single_" + tag, out2 = dist_data().dir + "/hf_tp2_" + tag;
    Run s{"hf_single_" + tag};
    s.llama = llama;
    s.iters = 0;
    s.extra = {"--export-hf", out1};
    Run t{"hf_tp2_" + tag, 2, 2};
    t.llama = llama;
    t.iters = 0;
    t.extra = {"--export-hf", out2};
    REQUIRE(try_run(s, nullptr).empty());
    REQUIRE(try_run(t, nullptr).empty());
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

namespace {

// LLaMA family with grouped-query attention: `kv` key/value heads for the 4
// query heads.
Run gqa_run(const std::string& name, int world, int tp, int zero_stage, const std::string& kv,
            std::vector<std::string> extra = {}) {
  Run r{name, world, tp, zero_stage};
  r.llama = true;
  r.extra = {"--num-key-value-heads", kv};
  r.extra.insert(r.extra.end(), extra.begin(), extra.end());
  return r;
}

}  // namespace

TEST_CASE("grouped-query attention: TP with kv heads split or replicated matches a single process") {
  SECTION("2 kv heads: TP2 splits them, TP4 replicates each over 2 ranks, DP2xTP2 ZeRO-1, PP2") {
    const std::vector<double> ref = run(gqa_run("gqa2_single", 1, 1, 0, "2"));
    REQUIRE(ref.size() == kIters);
    REQUIRE(ref.back() < ref.front() - 0.5);
    require_same_curve(ref, run(gqa_run("gqa2_tp2", 2, 2, 0, "2")));
    require_same_curve(ref, run(gqa_run("gqa2_tp4", 4, 4, 0, "2")));
    require_same_curve(ref, run(gqa_run("gqa2_dp2tp2_z1", 4, 2, 1, "2")));
    require_same_curve(ref, run(gqa_run("gqa2_pp2", 2, 1, 0, "2", {"--pipeline-model-parallel-size", "2"})));
  }
  SECTION("1 kv head (multi-query): TP2 and TP4 with sequence parallelism replicate it") {
    const std::vector<double> ref = run(gqa_run("gqa1_single", 1, 1, 0, "1"));
    REQUIRE(ref.size() == kIters);
    require_same_curve(ref, run(gqa_run("gqa1_tp2", 2, 2, 0, "1")));
    require_same_curve(ref, run(gqa_run("gqa1_tp4_sp", 4, 4, 0, "1", {"--sequence-parallel"})));
  }
}

TEST_CASE("grouped-query attention: a TP4 checkpoint (replicated kv heads) resumes with TP1 and TP2") {
  const std::string ck = dist_data().dir + "/ckpt_gqa_tp4";
  fs::remove_all(ck);
  const std::vector<double> ref = run(gqa_run("gqa_ck_single", 1, 1, 1, "2"));
  std::vector<double> first = run(gqa_run("gqa_ck_tp4", 4, 4, 1, "2", {"--save", ck, "--save-interval", "10",
                                                                        "--exit-interval", "10"}));
  REQUIRE(first.size() == 10);
  require_same_curve(ref, first);
  require_same_curve(ref, run(gqa_run("gqa_ck_tp1", 1, 1, 1, "2", {"--load", ck})), 10);
  require_same_curve(ref, run(gqa_run("gqa_ck_tp2", 2, 2, 1, "2", {"--load", ck})), 10);
}

TEST_CASE("grouped-query attention: an HF export from TP4 equals the single-process export") {
  // Assembled from Megatron's block flags, no --model-family: exports as LLaMA.
  const std::vector<std::string> blocks = {"--position-embedding-type", "rope", "--normalization", "rmsnorm",
                                           "--swiglu", "--untie-embeddings-and-output-weights",
                                           "--disable-bias-linear", "--ffn-hidden-size", "64",
                                           "--num-key-value-heads", "2"};
  const std::string out1 = dist_data().dir + "/hf_gqa_single", out4 = dist_data().dir + "/hf_gqa_tp4";
  Run s{"hf_gqa_single", 1, 1}, t{"hf_gqa_tp4", 4, 4};
  s.iters = t.iters = 0;
  s.extra = t.extra = blocks;
  s.extra.insert(s.extra.end(), {"--export-hf", out1});
  t.extra.insert(t.extra.end(), {"--export-hf", out4});
  REQUIRE(try_run(s, nullptr).empty());
  REQUIRE(try_run(t, nullptr).empty());
  for (const char* f : {"model.safetensors", "config.json"}) {
    INFO(f);
    CHECK(read_bytes(fs::path(out1) / f) == read_bytes(fs::path(out4) / f));
  }
  std::ifstream cj(fs::path(out1) / "config.json");
  const std::string config((std::istreambuf_iterator<char>(cj)), std::istreambuf_iterator<char>());
  CHECK(config.find("\"LlamaForCausalLM\"") != std::string::npos);
  CHECK(config.find("\"num_key_value_heads\": 2") != std::string::npos);
  // A block no Hugging Face architecture holds: one line naming it, no output.
  const std::string out_bad = dist_data().dir + "/hf_gqa_layernorm";
  Run bad{"hf_gqa_layernorm", 1, 1};
  bad.iters = 0;
  bad.extra = {"--position-embedding-type", "rope", "--swiglu", "--disable-bias-linear", "--export-hf", out_bad};
  const std::string err = try_run(bad, nullptr);
  CHECK(err.find("LayerNorm with RoPE does not map onto Hugging Face LlamaForCausalLM") != std::string::npos);
  CHECK(!fs::exists(out_bad));
}
