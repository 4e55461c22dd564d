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

struct Run {
  std::string name;
  int world = 1;
  bool nvme = false, bf16 = false;
  std::vector<std::string> extra;
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
         "\"stage3_param_persistence_threshold\": 100, \"sub_group_size\": 3000"
      << (r.nvme ? ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + (out / "swap").string() +
                       "\", \"pipeline_read\": true, \"pipeline_write\": true, \"buffer_count\": 6}"
                 : std::string())
      << "}" << (r.bf16 ? ", \"bf16\": {\"enabled\": true}" : "")
      << ", \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" << out.string() << "\", \"job_name\": \"j\"}}";
  SmallModel m;
  m.iters = kIters;
  std::vector<std::string> args = {"--config", (out / "cfg.json").string()};
  for (const std::string& a : small_model_args(m)) args.push_back(a);
  args.insert(args.end(), r.extra.begin(), r.extra.end());
  std::string log;
  DstrainJob job{r.world, args};
  job.rank0_output = &log;
  const std::string err = run_dstrain(job);
  INFO(err);
  REQUIRE(err.empty());
  if (r.nvme) {
    CHECK(log.find("offload_optimizer.device = nvme") != std::string::npos);
    CHECK(log.find("reads ahead of the update, writes behind the update") != std::string::npos);
  }
  CHECK(fs::is_empty(out / "swap"));  // unlinked at creation: nothing left behind
  return numbers((out / "j" / "train.csv").string());
}

}  // namespace

TEST_CASE("optimizer state on NVMe: ZeRO-3 DP=1 and DP=2 train and save bit for bit as in memory") {
  const std::string why = ds::aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  for (int world : {1, 2}) {
    for (bool bf16 : {false, true}) {
      const std::string tag = "dp" + std::to_string(world) + (bf16 ? "_bf16" : "_fp32");
      INFO(tag);
      const std::vector<std::string> save = {"--save", "", "--save-interval", std::to_string(kIters)};
      Run mem{"mem_" + tag, world, false, bf16, save}, nv{"nvme_" + tag, world, true, bf16, save};
      const fs::path mem_ck = fs::path(dist_data().dir) / mem.name / "ck", nv_ck = fs::path(dist_data().dir) / nv.name / "ck";
      mem.extra[1] = mem_ck.string();
      nv.extra[1] = nv_ck.string();
      const std::string a = run(mem), b = run(nv);
      REQUIRE(std::count(a.begin(), a.end(), '\n') == kIters + 1);
      CHECK(a == b);
      const fs::path step = "global_step" + std::to_string(kIters);
      int compared = 0;
      for (const auto& e : fs::directory_iterator(mem_ck / step)) {
        const std::string name = e.path().filename().string();
        if (name == "state.json") continue;
        INFO(name);
        CHECK(slurp(e.path()) == slurp(nv_ck / step / name));
        ++compared;
      }
      CHECK(compared >= 2 + world);  // the model, the optimizer shards, the tokenizer files
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
  CHECK(rows(run({"resume_nv_mem", 1, false, false, {"--load", ck_nv}})) == rows(run({"resume_mem_mem1", 1, false, false, {"--load", ck_mem}})));
}
