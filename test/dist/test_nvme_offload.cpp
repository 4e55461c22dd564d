// ZeRO-Infinity's optimizer tier: with `offload_optimizer.device: nvme` the
// Adam state lives in a swap file per rank and the step runs sub-group by
// sub-group (sub_group_size smaller than a layer here, reads ahead and
// writes behind). The loss and gradient-norm columns, and every saved file
// but state.json (which records the config), equal the in-memory run bit for
// bit, at ZeRO-3 DP=1 and DP=2, in fp32 and bf16; a checkpoint saved through
// the tier resumes in memory and one saved in memory resumes through the
// tier, on the same curve; the swap files are gone after the run.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/io/aio.h"
#include "test/dist/dist_util.h"
#include "test/skip.h"

using namespace ds::test;
namespace fs = std::filesystem;

namespace {

constexpr int kIters = 6;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The CSV's iteration .. grad_norm columns (not the timings).
std::string numbers(const std::string& csv_file) {
  std::ifstream f(csv_file);
  std::string line, out;
  while (std::getline(f, line)) {
    size_t cut = 0;
    for (int comma = 0; comma < 5 && cut != std::string::npos; ++comma) cut = line.find(',', cut + 1);
    out += line.substr(0, cut) + "\n";
  }
  return out;
}

// Every file of two step directories but state.json is the same; returns how many.
int same_files(const fs::path& a, const fs::path& b) {
  int compared = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    if (name == "state.json") continue;
    INFO(name);
    CHECK(slurp(e.path()) == slurp(b / name));
    ++compared;
  }
  return compared;
}

struct Run {
  std::string name;
  int world = 1;
  bool nvme = false, bf16 = false;
  std::vector<std::string> extra;
  bool params = false;  // offload_param nvme too
  std::string* log = nullptr;  // rank 0's output
  std::vector<std::string> model;  // replaces the small model's shape flags when set
  int64_t sub_group = 3000;         // zero_optimization.sub_group_size
  bool grad_lowp = false;           // data_types.grad_accum_dtype: the compute dtype (bf16)
};

// Runs the job and returns its CSV numbers; its checkpoint (if saved) is DIR/NAME/ck.
std::string run(const Run& r) {
  const DistData& d = dist_data();
  const fs::path out = fs::path(d.dir) / r.name;
  fs::remove_all(out);
  fs::create_directories(out / "swap");
  std::ofstream(out / "cfg.json")
      << "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": " << 4 / r.world
      << ", \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 5000, \"overlap_comm\": true, "
         "\"stage3_param_persistence_threshold\": 100, \"stage3_prefetch_bucket_size\": 4000000, "
         "\"stage3_max_live_parameters\": 8000000, \"sub_group_size\": " << r.sub_group
      << (r.nvme ? ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + (out / "swap").string() +
                       "\", \"pipeline_read\": true, \"pipeline_write\": true, \"buffer_count\": 8}"
                 : std::string())
      << (r.params ? ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + (out / "swap").string() + "\"}"
                   : std::string())
      << "}" << (r.bf16 ? ", \"bf16\": {\"enabled\": true}" : "")
      << (r.grad_lowp ? ", \"data_types\": {\"grad_accum_dtype\": \"bf16\"}" : "")
      << ", \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" << out.string() << "\", \"job_name\": \"j\"}}";
  SmallModel m;
  m.iters = kIters;
  std::vector<std::string> args = {"--config", (out / "cfg.json").string()};
  for (const std::string& a : small_model_args(m)) args.push_back(a);
  args.insert(args.end(), r.model.begin(), r.model.end());  // later flags win
  args.insert(args.end(), r.extra.begin(), r.extra.end());
  std::string own_log;
  std::string& log = r.log ? *r.log : own_log;
  DstrainJob job{r.world, args};
  job.rank0_output = &log;
  const std::string err = run_dstrain(job);
  INFO(err);
  REQUIRE(err.empty());
  if (r.nvme) {
    CHECK(log.find("offload_optimizer.device = nvme") != std::string::npos);
    CHECK(log.find("reads ahead of the update, writes behind the update") != std::string::npos);
    CHECK((log.find("the parameter shard (offload_param nvme") != std::string::npos) == r.params);
    // f32 accumulation and one sharding group: the gradient shard goes to the swap file too
    if (log.find("of the dense group") == std::string::npos)
      CHECK((log.find("and the f32 gradient shard") != std::string::npos) == !r.grad_lowp);
  }
  CHECK(fs::is_empty(out / "swap"));  // unlinked at creation: nothing left behind
  return numbers((out / "j" / "train.csv").string());
}

}  // namespace

TEST_CASE("optimizer state (and parameters) on NVMe: ZeRO-3 DP=1 and DP=2 train and save bit for bit as in memory") {
  const std::string why = ds::aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  for (int world : {1, 2}) {
    for (bool bf16 : {false, true}) {
      const std::string tag = "dp" + std::to_string(world) + (bf16 ? "_bf16" : "_fp32");
      INFO(tag);
      const std::vector<std::string> save = {"--save", "", "--save-interval", std::to_string(kIters)};
      Run mem{"mem_" + tag, world, false, bf16, save}, nv{"nvme_" + tag, world, true, bf16, save},
          nvp{"nvme_params_" + tag, world, true, bf16, save};
      nvp.params = true;
      auto ck_of = [](const Run& r) { return fs::path(dist_data().dir) / r.name / "ck"; };
      mem.extra[1] = ck_of(mem).string();
      nv.extra[1] = ck_of(nv).string();
      nvp.extra[1] = ck_of(nvp).string();
      const std::string a = run(mem);
      REQUIRE(std::count(a.begin(), a.end(), '\n') == kIters + 1);
      for (const Run* r : {&nv, &nvp}) {
        INFO(r->name);
        CHECK(run(*r) == a);
        const fs::path step = "global_step" + std::to_string(kIters);
        // the model, the optimizer shards, the tokenizer files
        CHECK(same_files(ck_of(mem) / step, ck_of(*r) / step) >= 2 + world);
      }
    }
  }
}

TEST_CASE("checkpoints move between the NVMe tier and memory on the same curve") {
  const std::string why = ds::aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const std::string dir = dist_data().dir;
  const std::string ref = run({"ref", 2, false, false, {}});
  // Saved at iteration 3 through the tier (DP=2), resumed in memory at DP=1
  // and through the tier at DP=2; saved in memory, resumed through the tier.
  const std::string ck_nv = dir + "/ck_nv", ck_mem = dir + "/ck_mem";
  fs::remove_all(ck_nv);
  fs::remove_all(ck_mem);
  const std::vector<std::string> save3 = {"--save-interval", "3", "--exit-interval", "3"};
  std::vector<std::string> a = save3, b = save3;
  a.insert(a.end(), {"--save", ck_nv});
  b.insert(b.end(), {"--save", ck_mem});
  run({"first_nv", 2, true, false, a});
  run({"first_mem", 2, false, false, b});
  auto tail = [](const std::string& s) {  // the rows after the header and the first 3 iterations
    size_t at = 0;
    for (int i = 0; i < 4; ++i) at = s.find('\n', at) + 1;
    return s.substr(at);
  };
  auto rows = [](const std::string& s) { return s.substr(s.find('\n') + 1); };  // the resumed run's CSV: 4..6
  const std::string want = tail(ref);
  REQUIRE(std::count(want.begin(), want.end(), '\n') == kIters - 3);
  CHECK(rows(run({"resume_nv_nv", 2, true, false, {"--load", ck_nv}})) == want);
  CHECK(rows(run({"resume_mem_nv", 2, true, false, {"--load", ck_mem}})) == want);
  Run with_params{"resume_nv_nvp", 2, true, false, {"--load", ck_nv}};
  with_params.params = true;
  CHECK(rows(run(with_params)) == want);
  CHECK(rows(run({"resume_nv_mem", 1, false, false, {"--load", ck_nv}})) == rows(run({"resume_mem_mem1", 1, false, false, {"--load", ck_mem}})));
  // The tools read a checkpoint saved through the tier as any other: the
  // saving job's offload (its nvme_path) is not carried into their config.
  std::string out;
  const std::string z1 = dir + "/ck_nv_z1";
  fs::remove_all(z1);
  const int rc = run_tool("dsconvert", "--load " + ck_nv + " --save " + z1 + " --target-tp 1 --target-dp 1 --zero-stage 1", &out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(run_tool("dsgen", "--load " + ck_nv + " --vocab-file " + dist_data().vocab + " --merge-file " +
                                dist_data().merges + " --prompt 'To be' --max-new-tokens 2 --greedy",
                   &out) == 0);
  CHECK(out.find("To be") != std::string::npos);
}

namespace {


}  // namespace

// Expert parallelism: the dense weights are sharded over every data-parallel
// rank, the experts over the expert-data-parallel ones; each sharding group
// has an optimizer and a swap file (and with offload_param its parameter
// shard) of its own. At DP2 x EP2 the experts' group is one rank, at DP4 x
// EP2 two. Checkpoints load into the tiers from the same layout and from
// another expert-parallel size (reshaped).
TEST_CASE("expert parallelism: each sharding group's state in a tier of its own, bit for bit as in memory") {
  const std::string why = ds::aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const std::string dir = dist_data().dir;
  auto moe = [](const std::string& ep, std::vector<std::string> more) {
    std::vector<std::string> a = {"--num-experts", "4", "--expert-interval", "1", "--moe-expert-parallel-size", ep};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const fs::path step = "global_step" + std::to_string(kIters);
  std::string mem4;
  for (int world : {2, 4}) {
    const std::string tag = "ep2_dp" + std::to_string(world);
    INFO(tag);
    auto saving = [&](const std::string& name) {
      return moe("2", {"--save", dir + "/" + name + "/ck", "--save-interval", std::to_string(kIters)});
    };
    std::string log;
    const std::string a = run({"mem_" + tag, world, false, world == 4, saving("mem_" + tag)});
    REQUIRE(std::count(a.begin(), a.end(), '\n') == kIters + 1);
    if (world == 4) mem4 = a;
    Run nv{"nvme_" + tag, world, true, world == 4, saving("nvme_" + tag)},
        nvp{"nvme_params_" + tag, world, true, world == 4, saving("nvme_params_" + tag)};
    nv.log = &log;
    nvp.params = true;
    for (const Run* r : {&nv, &nvp}) {
      INFO(r->name);
      CHECK(run(*r) == a);
      CHECK(same_files(fs::path(dir) / ("mem_" + tag) / "ck" / step, fs::path(dir) / r->name / "ck" / step) >=
            2 + world);
    }
    CHECK(log.find("the optimizer state of the dense group") != std::string::npos);
    CHECK(log.find("the optimizer state of the experts group") != std::string::npos);
  }
  // Saved at iteration 3 at EP1 (one sharding group) and at EP2 through the
  // tiers; resumed at DP4 x EP2 through the tiers: reshaped from EP1, and
  // from the same layout, on the in-memory curve.
  const std::string ck1 = dir + "/ep_ck1", ck2 = dir + "/ep_ck2";
  fs::remove_all(ck1);
  fs::remove_all(ck2);
  run({"first_ep1", 4, false, true, moe("1", {"--save", ck1, "--save-interval", "3", "--exit-interval", "3"})});
  run({"first_ep2", 4, true, true, moe("2", {"--save", ck2, "--save-interval", "3", "--exit-interval", "3"})});
  auto rows = [](const std::string& s) { return s.substr(s.find('\n') + 1); };
  const std::string from_ep1 = rows(run({"resume_ep1_mem", 4, false, true, moe("2", {"--load", ck1})}));
  REQUIRE(std::count(from_ep1.begin(), from_ep1.end(), '\n') == kIters - 3);
  CHECK(rows(run({"resume_ep1_nvme", 4, true, true, moe("2", {"--load", ck1})})) == from_ep1);
  Run with_params{"resume_ep1_nvp", 4, true, true, moe("2", {"--load", ck1})};
  with_params.params = true;
  CHECK(rows(run(with_params)) == from_ep1);
  size_t at = 0;  // the in-memory run's rows after iteration 3
  for (int i = 0; i < 4; ++i) at = mem4.find('\n', at) + 1;
  CHECK(rows(run({"resume_ep2_nvme", 4, true, true, moe("2", {"--load", ck2})})) == mem4.substr(at));
}

namespace {

// The peak RSS dstrain reports for rank 0 (getrusage), and its model-state bytes.
int64_t logged(const std::string& log, const std::string& before) {
  const size_t at = log.find(before);
  REQUIRE(at != std::string::npos);
  return std::stoll(log.substr(at + before.size()));
}

}  // namespace

// Gradients accumulated in bf16 (data_types.grad_accum_dtype): the tier's
// step reads the bf16 gradient shard per sub-group, as the in-memory step
// reads it whole; the same numbers and files, bit for bit.
TEST_CASE("bf16 gradient accumulation with the optimizer state (and parameters) on NVMe equals memory bit for bit") {
  const std::string why = ds::aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const std::vector<std::string> save = {"--save", "", "--save-interval", std::to_string(kIters)};
  Run mem{"mem_dp2_bf16_gacc", 2, false, true, save}, nv{"nvme_dp2_bf16_gacc", 2, true, true, save},
      nvp{"nvme_params_dp2_bf16_gacc", 2, true, true, save};
  nvp.params = true;
  auto ck_of = [](const Run& r) { return fs::path(dist_data().dir) / r.name / "ck"; };
  for (Run* r : {&mem, &nv, &nvp}) {
    r->grad_lowp = true;
    r->extra[1] = ck_of(*r).string();
  }
  std::string log;
  mem.log = &log;
  const std::string a = run(mem);
  REQUIRE(std::count(a.begin(), a.end(), '\n') == kIters + 1);
  CHECK(log.find(" (bf16) + Adam m, v") != std::string::npos);
  Run f32 = mem;  // the bf16 accumulation changes the numbers (the check below could not fail otherwise)
  f32.name = "mem_dp2_bf16_f32acc";
  f32.grad_lowp = false;
  f32.log = nullptr;
  f32.extra = {};
  CHECK(run(f32) != a);
  for (const Run* r : {&nv, &nvp}) {
    INFO(r->name);
    CHECK(run(*r) == a);
    const fs::path step = "global_step" + std::to_string(kIters);
    CHECK(same_files(ck_of(mem) / step, ck_of(*r) / step) >= 4);
  }
}

TEST_CASE("with parameters, gradients and optimizer state on NVMe a rank's peak RSS is below a third of its model "
          "states") {
  const std::string why = ds::aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  // 16 layers of hidden 512: 51M parameters, 16 bytes each of model state
  // in memory (0.81 GB) at ZeRO-3 DP=1; on NVMe all of it goes to the swap
  // file (parameter, gradient and Adam shards), and what stays is the working
  // set (two gathered layers and a layer's gradient), one micro-batch's
  // activations, the sub-group buffer sets and the process itself.
  const std::vector<std::string> shape = {"--num-layers", "16", "--hidden-size", "512", "--num-attention-heads", "8",
                                          "--train-iters", "4", "--micro-batch-size", "1"};
  std::string log_mem, log_nv;
  Run mem{"big_mem", 1, false, false, {}};
  mem.model = shape;
  mem.log = &log_mem;
  Run nv{"big_nvme", 1, true, false, {}};
  nv.model = shape;
  nv.params = true;
  nv.log = &log_nv;
  mem.sub_group = nv.sub_group = 1000000;
  const std::string a = run(mem), b = run(nv);
  CHECK(a == b);  // the same curve, bit for bit
  const int64_t states = logged(log_mem, "model state: ");
  const int64_t rss_mem = logged(log_mem, "peak resident memory of this rank: ");
  const int64_t rss_nv = logged(log_nv, "peak resident memory of this rank: ");
  INFO("model state " << states << " B, peak RSS in memory " << rss_mem << " B, on NVMe " << rss_nv << " B");
  REQUIRE(states > 800000000);
  CHECK(logged(log_nv, "model state: ") == 0);  // nothing of it allocated in memory
  CHECK(rss_mem > states);
  // The model's states do not fit in what this rank used: the fixed rest
  // (libraries, arenas, the working set) is about 0.18 GB here, 0.22 of the
  // states (docs/benchmarks.md has larger models).
  CHECK(rss_nv < states / 3);
  CHECK(rss_mem - rss_nv > states * 2 / 3);
}
