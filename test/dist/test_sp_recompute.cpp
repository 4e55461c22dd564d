// Sequence parallelism and activation recomputation: the loss curve of a
// single process equals that of TP2 + SP (GPT-2 and LLaMA families) and of
// TP2 x PP2 with selective recomputation (relative 1e-5, fp32, 20 steps);
// recomputation on one process is bit-identical to none; the logged bytes of
// saved activations per micro-batch drop with recomputation and with SP.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <regex>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;

namespace {

constexpr int kIters = 20;

struct Run {
  std::string name;
  int world = 1, tp = 1, pp = 1;
  bool llama = false;
  std::vector<std::string> extra;
  int iters = kIters;
};

struct Result {
  std::vector<double> losses;
  long long act_bytes = -1;  // from rank 0's "activations: N bytes" line
};

Result run(const Run& r) {
  SmallModel model;
  model.tp = r.tp;
  model.pp = r.pp;
  model.iters = r.iters;
  model.llama = r.llama;
  std::vector<std::string> args = small_model_args(model);
  args.insert(args.end(), r.extra.begin(), r.extra.end());
  std::string log;
  std::string err = run_with_config(r.name, r.world, 2, -1, args, nullptr, &log);
  INFO(r.name << ": " << err);
  REQUIRE(err.empty());
  Result res;
  if (r.iters > 0) res.losses = read_losses(dist_data().dir + "/csv/" + r.name + "/train.csv");
  std::smatch m;
  INFO(log);
  REQUIRE(std::regex_search(log, m, std::regex("activations: ([0-9]+) bytes saved per micro-batch")));
  res.act_bytes = std::stoll(m[1]);
  return res;
}

// The whole curve, same length as the reference.
void require_full_curve(const std::vector<double>& ref, const std::vector<double>& got) {
  REQUIRE(got.size() == ref.size());
  require_same_curve(ref, got);
}

const Result& single(bool llama) {
  static Result g = run({"sr_single_gpt2"});
  static Result l = run({"sr_single_llama", 1, 1, 1, true});
  return llama ? l : g;
}

}  // namespace

TEST_CASE("recomputation on one process is bit-identical to none and saves fewer activations") {
  const Result& ref = single(false);
  REQUIRE(ref.losses.size() == kIters);
  Result all = run({"sr_full_all", 1, 1, 1, false, {"--recompute-granularity", "full"}});
  Result one = run({"sr_full_one", 1, 1, 1, false,
                    {"--recompute-granularity", "full", "--recompute-num-layers", "1"}});
  Result sel = run({"sr_selective", 1, 1, 1, false, {"--recompute-activations"}});
  CHECK(all.losses == ref.losses);
  CHECK(one.losses == ref.losses);
  CHECK(sel.losses == ref.losses);
  CHECK(all.act_bytes < one.act_bytes);
  CHECK(one.act_bytes < ref.act_bytes);
  CHECK(sel.act_bytes < ref.act_bytes);
  Result sel_llama = run({"sr_selective_llama", 1, 1, 1, true, {"--recompute-granularity", "selective"}});
  CHECK(sel_llama.losses == single(true).losses);
}

TEST_CASE("TP2 x PP2 with selective recomputation matches a single process") {
  Result r = run({"sr_tp2pp2_sel", 4, 2, 2, false, {"--recompute-granularity", "selective"}});
  require_full_curve(single(false).losses, r.losses);
}

TEST_CASE("TP2 + sequence parallel matches a single process and saves fewer activations per rank") {
  Run tp2{"sr_tp2_nosp", 2, 2};
  tp2.iters = 4;  // only the start-up log is read (0 iterations is an error; warmup is 3)
  const long long tp2_bytes = run(tp2).act_bytes;
  Result gpt2 = run({"sr_tp2_sp_gpt2", 2, 2, 1, false, {"--sequence-parallel"}});
  require_full_curve(single(false).losses, gpt2.losses);
  CHECK(gpt2.act_bytes < tp2_bytes);
  Result llama = run({"sr_tp2_sp_llama", 2, 2, 1, true, {"--sequence-parallel"}});
  require_full_curve(single(true).losses, llama.losses);
}

TEST_CASE("TP2 x PP2 + sequence parallel with full recomputation matches a single process") {
  Result r = run({"sr_tp2pp2_sp_full", 4, 2, 2, true, {"--sequence-parallel", "--recompute-granularity", "full"}});
  require_full_curve(single(true).losses, r.losses);
}
