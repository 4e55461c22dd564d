// Dropout across parallel layouts (fp32, CPU): with strong hidden and
// attention dropout the single-process curve differs from the dropout-free
// one, and DP2 (ZeRO-1, ZeRO-3), TP2 + sequence parallel, PP2 interleaved and
// recomputation (full, selective) reproduce it to 1e-5, because every rank
// draws its masks from global sample, position and head indices. Every other
// equivalence test of test/dist runs with the default dropout 0.1 too.
// Validation never drops: the validation loss of a dropout run equals that of
// the same weights evaluated with dropout 0.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <sstream>

#include "test/dist/curve_check.h"
#include "test/dist/dist_util.h"

using namespace ds::test;

namespace {

constexpr int kIters = 10;
const std::vector<std::string> kStrong = {"--hidden-dropout", "0.3", "--attention-dropout", "0.3"};

struct Run {
  std::string name;
  int world = 1, tp = 1, pp = 1, zero_stage = -1, layers = 2;
  bool llama = false;
  std::vector<std::string> extra = kStrong;
};

std::vector<double> run(const Run& r) {
  SmallModel m;
  m.layers = r.layers;
  m.tp = r.tp;
  m.pp = r.pp;
  m.iters = kIters;
  m.llama = r.llama;
  std::vector<std::string> args = small_model_args(m);
  args.insert(args.end(), r.extra.begin(), r.extra.end());
  std::vector<double> losses;
  const std::string err = run_with_config(r.name, r.world, 2, r.zero_stage, args, &losses, nullptr);
  INFO(r.name << ": " << err);
  REQUIRE(err.empty());
  REQUIRE(losses.size() == static_cast<size_t>(kIters));
  return losses;
}

// Largest relative difference between two curves.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return d;
}

// The validation loss rank 0 logged last (CSV monitor).
double last_valid_loss(const std::string& name) {
  std::ifstream f(dist_data().dir + "/csv/" + name + "/valid.csv");
  REQUIRE(f.good());
  std::string line, last;
  std::getline(f, line);  // header
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  REQUIRE(!last.empty());
  std::stringstream ss(last);
  std::string iter, loss;
  std::getline(ss, iter, ',');
  std::getline(ss, loss, ',');
  return std::stod(loss);
}

}  // namespace

TEST_CASE("dropout: DP2 (ZeRO-1, ZeRO-3), TP2 + SP, PP2 interleaved and recomputation reproduce the single-process "
          "curve") {
  static const std::vector<double> ref = run({"drop_single"});
  static const std::vector<double> no_dropout = [] {
    Run off{"drop_off"};
    off.extra = {"--hidden-dropout", "0", "--attention-dropout", "0"};
    return run(off);
  }();
  INFO("with vs without dropout: " << max_rel_diff(ref, no_dropout));
  CHECK(max_rel_diff(ref, no_dropout) > 1e-3);  // dropout really changes the curve
  SECTION("DP2 ZeRO-1") { require_same_curve(ref, run({"drop_dp2_z1", 2, 1, 1, 1})); }
  SECTION("DP2 ZeRO-3") { require_same_curve(ref, run({"drop_dp2_z3", 2, 1, 1, 3})); }
  SECTION("TP2 + sequence parallel") {
    Run r{"drop_tp2_sp", 2, 2};
    r.extra.push_back("--sequence-parallel");
    require_same_curve(ref, run(r));
  }
  SECTION("recompute full, recompute selective (TP2)") {
    Run full{"drop_recompute_full"};
    full.extra.insert(full.extra.end(), {"--recompute-granularity", "full", "--recompute-method", "uniform"});
    require_same_curve(ref, run(full));
    Run sel{"drop_recompute_sel_tp2", 2, 2};
    sel.extra.insert(sel.extra.end(), {"--recompute-granularity", "selective"});
    require_same_curve(ref, run(sel));
  }
}

TEST_CASE("dropout: PP2 interleaved and TP2 + SP (LLaMA family) reproduce the single-process curve") {
  Run single4{"drop_single_L4"};
  single4.layers = 4;
  Run inter{"drop_pp2_interleaved", 2, 1, 2, -1, 4};
  inter.extra.insert(inter.extra.end(), {"--num-layers-per-virtual-pipeline-stage", "1"});
  require_same_curve(run(single4), run(inter));
  Run llama{"drop_single_llama"};
  llama.llama = true;
  Run llama_sp{"drop_tp2_sp_llama", 2, 2};
  llama_sp.llama = true;
  llama_sp.extra.push_back("--sequence-parallel");
  require_same_curve(run(llama), run(llama_sp));
}

TEST_CASE("dropout: validation runs without dropout") {
  const std::string ck = dist_data().dir + "/drop_eval_ckpt";
  Run train{"drop_eval_train"};
  train.extra.insert(train.extra.end(), {"--save", ck, "--save-interval", "1000"});
  run(train);
  const double with_dropout = last_valid_loss("drop_eval_train");
  // The same weights evaluated by a dropout-0 model (nothing left to train).
  Run eval{"drop_eval_nodrop"};
  eval.extra = {"--hidden-dropout", "0", "--attention-dropout", "0", "--load", ck};
  SmallModel m;
  m.iters = kIters;
  std::vector<std::string> args = small_model_args(m);
  args.insert(args.end(), eval.extra.begin(), eval.extra.end());
  const std::string err = run_with_config(eval.name, 1, 2, -1, args, nullptr, nullptr);
  INFO(err);
  REQUIRE(err.empty());
  CHECK(last_valid_loss("drop_eval_nodrop") == with_dropout);
}
