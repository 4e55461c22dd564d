// The pure parts of restarts and elastic runs: DeepSpeed's elastic batch
// rules (compute_elastic_config) against results worked out by hand from
// DeepSpeed's algorithm, the `elasticity` section's validation, the choice
// of hosts for an elastic attempt, host failure bookkeeping, what dsrun reads
// from the program's command line and config, and the new flags' errors.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>

#include "launcher/elastic.h"
#include "launcher/options.h"
#include "lib/core/elasticity.h"
#include "lib/core/error.h"

using namespace ds;
using namespace ds::launch;

namespace {

ElasticityConfig elastic(std::vector<int64_t> micro, int64_t max_batch, int64_t min_gpus, int64_t max_gpus,
                         bool prefer_larger = true) {
  ElasticityConfig c;
  c.enabled = true;
  c.micro_batch_sizes = std::move(micro);
  c.max_train_batch_size = max_batch;
  c.min_gpus = min_gpus;
  c.max_gpus = max_gpus;
  c.prefer_larger_batch = prefer_larger;
  return c;
}

ElasticityConfig parse(const std::string& text) {
  JsonSection s(nlohmann::json::parse(text), "elasticity");
  return read_elasticity_section(s);
}

std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string parse_flags(std::vector<std::string> words) {
  words.insert(words.begin(), "dsrun");
  words.push_back("prog");
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  Options o;
  return user_error([&] { parse_options(static_cast<int>(argv.size()), argv.data(), &o); });
}

}  // namespace

// Candidates for micro batches {2,4,6} under 2000: bases 2, 4, 6 and lcm 12
// scaled by the largest highly composite number that fits (840, 360, 240,
// 120) give 1680 and 1440. 1680 = 2 * 840 is divided into micro batches of 2, 4
// or 6 by every divisor of 840 (32 counts); 1440 only by the 30 of 720.
TEST_CASE("elasticity: DeepSpeed's documented example config", "[elastic]") {
  ElasticBatch b = compute_elastic_config(elastic({2, 4, 6}, 2000, 1, 10000));
  CHECK(b.train_batch_size == 1680);
  CHECK(b.valid_sizes == std::vector<int64_t>{1,  2,  3,  4,  5,  6,  7,   8,   10,  12,  14,  15,  20,  21,  24,  28,
                                              30, 35, 40, 42, 56, 60, 70, 84, 105, 120, 140, 168, 210, 280, 420, 840});
  CHECK(b.micro_batch_size == 0);
  // Per size: the largest listed micro batch dividing 1680 / size.
  CHECK(compute_elastic_config(elastic({2, 4, 6}, 2000, 1, 10000), 1).micro_batch_size == 6);  // 1680 % 6
  CHECK(compute_elastic_config(elastic({2, 4, 6}, 2000, 1, 10000), 3).micro_batch_size == 4);  // 560: 4 not 6
  CHECK(compute_elastic_config(elastic({2, 4, 6}, 2000, 1, 10000), 840).micro_batch_size == 2);
  // Fewer counts win nothing back with prefer_larger_batch false: still 1680.
  CHECK(compute_elastic_config(elastic({2, 4, 6}, 2000, 1, 10000, false)).train_batch_size == 1680);
}

// DeepSpeed's own unit-test config (micro 8, 12, 16, 17; max 10000; 32 to
// 1500 GPUs): 9792 = 17 * 576 with 23 valid counts.
TEST_CASE("elasticity: DeepSpeed's 10k test config", "[elastic]") {
  ElasticBatch b = compute_elastic_config(elastic({8, 12, 16, 17}, 10000, 32, 1500));
  CHECK(b.train_batch_size == 9792);
  CHECK(b.valid_sizes == std::vector<int64_t>{32,  34,  36,  48,  51,  64,  68,  72,  96,  102, 136, 144,
                                              153, 192, 204, 272, 288, 306, 408, 576, 612, 816, 1224});
  CHECK(compute_elastic_config(elastic({8, 12, 16, 17}, 10000, 32, 1500), 32).micro_batch_size == 17);
  CHECK(compute_elastic_config(elastic({8, 12, 16, 17}, 10000, 32, 1500), 34).micro_batch_size == 16);
  for (int64_t g : b.valid_sizes) {
    const int64_t mb = compute_elastic_config(elastic({8, 12, 16, 17}, 10000, 32, 1500), g).micro_batch_size;
    CHECK((b.train_batch_size / g) % mb == 0);
  }
}

// Small cases worked by hand. {1,2} under 16 with at most 4 GPUs: bases 1, 2
// and lcm 2 give 12 (1 * 12) and 16 (2 * 8); 12 splits over 1, 2, 3, 4 GPUs,
// 16 only over 1, 2, 4.
TEST_CASE("elasticity: small batches, ties and limits", "[elastic]") {
  ElasticBatch b = compute_elastic_config(elastic({1, 2}, 16, 1, 4));
  CHECK(b.train_batch_size == 12);
  CHECK(b.valid_sizes == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(compute_elastic_config(elastic({1, 2}, 16, 1, 4), 3).micro_batch_size == 2);  // 12/3 = 4
  CHECK(compute_elastic_config(elastic({1, 2}, 16, 1, 4), 4).micro_batch_size == 1);  // 12/4 = 3
  // {1,2,4} under 8: 8 wins (valid 1, 2, 4, 8).
  b = compute_elastic_config(elastic({1, 2, 4}, 8, 1, 8));
  CHECK(b.train_batch_size == 8);
  CHECK(b.valid_sizes == std::vector<int64_t>{1, 2, 4, 8});
  // {3,5} under 100, 2..20 GPUs, smaller preferred: 60 (lcm 15 * 4) with 8 counts.
  b = compute_elastic_config(elastic({3, 5}, 100, 2, 20, false));
  CHECK(b.train_batch_size == 60);
  CHECK(b.valid_sizes == std::vector<int64_t>{2, 3, 4, 5, 6, 10, 12, 20});
  CHECK(compute_elastic_config(elastic({3, 5}, 100, 2, 20, false), 5).micro_batch_size == 3);  // 60/5 = 12
  // A size outside the list is an error naming it and the list.
  CHECK_THAT(user_error([] { compute_elastic_config(elastic({1, 2, 4}, 8, 1, 8), 3); }),
             Catch::Contains("data-parallel size 3 is not one of the valid sizes [1, 2, 4, 8]"));
  CHECK_THAT(user_error([] { compute_elastic_config(elastic({32}, 16, 1, 4)); }),
             Catch::Contains("micro_batch_sizes entry 32 is larger than the largest acceptable batch 16"));
}

// Version 0.2 works in whole nodes: {2,4,6} under 2000 with 8 GPUs per node and
// model parallel 2 (4 replicas per node) runs version 0.1 on 500 per replica-node
// (480 = 120 * 4), times 4: batch 1920. DP 16 (32 GPUs) runs micro 6 (120 / 6).
// 12 GPUs of 8 per node are not whole nodes: the fallback batch is the largest
// multiple of micro * 12 under 100 for {2,4}: 96.
TEST_CASE("elasticity: version 0.2", "[elastic]") {
  ElasticityConfig c = elastic({2, 4, 6}, 2000, 1, 10000);
  c.version = 0.2;
  c.num_gpus_per_node = 8;
  c.model_parallel_size = 2;
  ElasticBatch b = compute_elastic_config(c, 16);
  CHECK(b.train_batch_size == 1920);
  CHECK(b.valid_sizes.front() == 4);
  CHECK(b.valid_sizes.back() == 960);
  CHECK(b.micro_batch_size == 6);
  ElasticityConfig d = elastic({2, 4}, 100, 1, 10000);
  d.version = 0.2;
  d.num_gpus_per_node = 8;
  b = compute_elastic_config(d, 12);
  CHECK(b.train_batch_size == 96);
  CHECK(b.valid_sizes == std::vector<int64_t>{12});
  CHECK(b.micro_batch_size == 4);
}

TEST_CASE("elasticity: the config section is validated key by key", "[elastic]") {
  ElasticityConfig c = parse(R"({"enabled": true, "max_train_batch_size": 16, "micro_batch_sizes": [1, 2],
      "min_gpus": 1, "max_gpus": 4, "min_time": 20, "version": 0.1, "prefer_larger_batch": false,
      "ignore_non_elastic_batch_info": true})");
  CHECK(c.enabled);
  CHECK(c.max_train_batch_size == 16);
  CHECK(c.micro_batch_sizes == std::vector<int64_t>{1, 2});
  CHECK(c.max_gpus == 4);
  CHECK(c.min_time == 20);
  CHECK(!c.prefer_larger_batch);
  CHECK(c.ignore_non_elastic_batch_info);
  CHECK(!parse(R"({"enabled": false})").enabled);  // disabled: defaults, no checks
  CHECK_THAT(user_error([] { parse(R"({"enabled": true, "micro_batch_sizes": [2]})"); }),
             Catch::Contains("'elasticity.max_train_batch_size' is missing"));
  CHECK_THAT(user_error([] { parse(R"({"enabled": true, "max_train_batch_size": 8})"); }),
             Catch::Contains("'elasticity.micro_batch_sizes' is missing"));
  CHECK_THAT(user_error([] { parse(R"({"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [2, 1.5]})"); }),
             Catch::Contains("'elasticity.micro_batch_sizes' must hold integers, got [2,1.5]"));
  CHECK_THAT(user_error([] { parse(R"({"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [0]})"); }),
             Catch::Contains("must hold positive integers"));
  CHECK_THAT(user_error([] {
               parse(R"({"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [1], "min_gpus": 4,
                         "max_gpus": 2})");
             }),
             Catch::Contains("'elasticity.min_gpus' 4 is larger than 'elasticity.max_gpus' 2"));
  CHECK_THAT(user_error([] {
               parse(R"({"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [1], "version": 0.3})");
             }),
             Catch::Contains("'elasticity.version' 0.3 is not supported"));
  CHECK_THAT(user_error([] {
               parse(R"({"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [1],
                         "model_parallel_size": 2})");
             }),
             Catch::Contains("needs 'elasticity.version' 0.2"));
  CHECK_THAT(user_error([] {
               parse(R"({"enabled": true, "max_train_batch_size": "8", "micro_batch_sizes": [1]})");
             }),
             Catch::Contains("'elasticity.max_train_batch_size' must be an integer"));
  // Bounds that keep the search small, whatever the file says.
  CHECK_THAT(user_error([] { parse(R"({"enabled": true, "max_train_batch_size": 2e9, "micro_batch_sizes": [1]})"); }),
             Catch::Contains("'elasticity.max_train_batch_size' must be between 1 and 1000000000, got 2000000000"));
  std::string many = "[1";
  for (int i = 2; i <= 65; ++i) many += "," + std::to_string(i);
  CHECK_THAT(user_error([&] {
               parse(R"({"enabled": true, "max_train_batch_size": 100, "micro_batch_sizes": )" + many + "]}");
             }),
             Catch::Contains("'elasticity.micro_batch_sizes' must list 1 to 64 sizes, got 65"));
  ElasticityConfig big = parse(R"({"enabled": true, "max_train_batch_size": 1000000000,
      "micro_batch_sizes": [1, 7, 64, 999999937], "max_gpus": 1000000000})");
  CHECK(compute_elastic_config(big).train_batch_size > 0);  // quick: divisors up to the square root
}

TEST_CASE("elastic: hosts of an attempt are the largest usable prefix the limits allow", "[elastic]") {
  std::string why;
  ElasticLimits any;
  CHECK(choose_elastic_hosts({1, 1, 1}, {true, true, true}, any, &why) == std::vector<int>{0, 1, 2});
  CHECK(choose_elastic_hosts({1, 1, 1}, {true, false, true}, any, &why) == std::vector<int>{0, 2});
  ElasticLimits bounded{2, 2, std::nullopt};
  CHECK(choose_elastic_hosts({1, 1, 1}, {true, true, true}, bounded, &why) == std::vector<int>{0, 1});
  CHECK(choose_elastic_hosts({1, 1, 1}, {false, false, true}, bounded, &why).empty());
  CHECK(why == "1 usable host(s), fewer than --min_elastic_nodes 2");
  // Valid DP sizes 1, 2, 4, 8: three one-slot hosts run as two.
  ElasticLimits batch{1, 8, elastic({1, 2, 4}, 8, 1, 8)};
  CHECK(choose_elastic_hosts({1, 1, 1}, {true, true, true}, batch, &why) == std::vector<int>{0, 1});
  CHECK(choose_elastic_hosts({2, 1, 1}, {true, true, true}, batch, &why) == std::vector<int>{0, 1, 2});
  // Model parallel 2 (version 0.2, 2 GPUs per node): a world of 3 never fits.
  ElasticityConfig v2 = elastic({1, 2, 4}, 8, 1, 8);
  v2.version = 0.2;
  v2.model_parallel_size = 2;
  v2.num_gpus_per_node = 2;
  ElasticLimits mp{1, 8, v2};
  CHECK(choose_elastic_hosts({2, 1, 1}, {true, true, true}, mp, &why) == std::vector<int>{0, 1, 2});
  CHECK(choose_elastic_hosts({3}, {true}, mp, &why).empty());
  CHECK_THAT(why, Catch::Contains("model_parallel_size 2"));
  ElasticLimits none{1, 8, elastic({4}, 4, 1, 1)};  // only DP 1 is valid
  CHECK(choose_elastic_hosts({2, 2}, {true, true}, none, &why).empty());
  CHECK_THAT(why, Catch::Contains("is valid for the elasticity section: [1]"));
}

TEST_CASE("elastic: a host is dropped when it goes silent or fails twice in a row", "[elastic]") {
  std::vector<HostHealth> h(3);
  CHECK(!record_host_failure(h, {0, 1, 2}, 2, false, "exit code 137"));
  CHECK(h[2].failures_in_a_row == 1);
  CHECK(!record_host_failure(h, {0, 1, 2}, 1, false, "exit code 1"));  // another host: 2's run is broken
  CHECK(h[2].failures_in_a_row == 0);
  CHECK(!record_host_failure(h, {0, 1, 2}, 2, false, "exit code 137"));
  CHECK(record_host_failure(h, {0, 1, 2}, 2, false, "exit code 137"));
  CHECK(h[2].dropped);
  CHECK(h[2].why == "2 failed attempts in a row, the last: exit code 137");
  CHECK(record_host_failure(h, {0, 1}, 0, true, "lost heartbeat"));  // silence: at once
  CHECK(h[0].dropped);
  CHECK(h[0].why == "lost heartbeat");
}

TEST_CASE("restart: checkpoint directories and the elasticity section come from the program's arguments",
          "[elastic]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("dsrun_elastic_{}", getpid());
  fs::create_directories(dir / "ck");
  const std::string cfg = (dir / "c.json").string();
  std::ofstream(cfg) << R"({"training": {"load": "from_config", "save": "s"},
      "elasticity": {"enabled": true, "max_train_batch_size": 16, "micro_batch_sizes": [1, 2], "max_gpus": 4}})";
  ProgramCheckpoint pc = inspect_program("/x/dstrain", {"--config", cfg, "--load=ck"});
  CHECK(pc.is_dstrain);
  CHECK(pc.load_dir == "ck");
  CHECK(pc.save_dir == "s");
  REQUIRE(pc.elasticity);
  CHECK(compute_elastic_config(*pc.elasticity).train_batch_size == 12);
  pc = inspect_program("train.sh", {"--deepspeed_config=" + cfg});
  CHECK(!pc.is_dstrain);
  CHECK(pc.load_dir == "from_config");
  std::ofstream(cfg) << R"({"elasticity": {"enabled": true, "micro_batch_sizes": [1]}})";
  CHECK_THAT(user_error([&] { inspect_program("dstrain", {"--config", cfg}); }),
             Catch::Contains(cfg + ": config: elasticity is enabled but 'elasticity.max_train_batch_size' is missing"));
  std::ofstream(cfg) << "model: {layers: 2}\n";  // another program's YAML: not dsrun's business
  pc = inspect_program("train.sh", {"--config", cfg, "--load", "x"});
  CHECK(pc.load_dir == "x");
  CHECK(!pc.elasticity);
  CHECK(latest_iteration((dir / "ck").string()) == -1);
  std::ofstream((dir / "ck" / "latest").string()) << "global_step12\n";
  CHECK(latest_iteration((dir / "ck").string()) == 12);
  std::ofstream((dir / "ck" / "latest").string()) << "global_stepx\n";
  CHECK(latest_iteration((dir / "ck").string()) == -1);
  fs::remove_all(dir);
}

TEST_CASE("restart: flag errors name the flag", "[elastic]") {
  CHECK_THAT(parse_flags({"--max_restarts", "-1"}), Catch::Contains("--max_restarts -1 must be between 0 and 10000"));
  CHECK_THAT(parse_flags({"--elastic_training"}),
             Catch::Contains("--elastic_training needs --max_restarts N > 0"));
  CHECK_THAT(parse_flags({"--min_elastic_nodes", "2"}), Catch::Contains("--min_elastic_nodes needs --elastic_training"));
  CHECK_THAT(parse_flags({"--elastic_training", "--max_restarts", "2", "--min_elastic_nodes", "3",
                          "--max_elastic_nodes", "2"}),
             Catch::Contains("--min_elastic_nodes 3 is larger than --max_elastic_nodes 2"));
  CHECK_THAT(parse_flags({"--elastic_training", "--max_restarts", "2", "--num_nodes", "2"}),
             Catch::Contains("--num_nodes cannot be combined with --elastic_training"));
  CHECK_THAT(parse_flags({"--max_restarts", "2", "--no_ssh", "--node_rank", "0"}),
             Catch::Contains("--max_restarts cannot be combined with --no_ssh"));
  CHECK_THAT(parse_flags({"--heartbeat_timeout", "-3"}), Catch::Contains("--heartbeat_timeout -3 must be 0 (off) or between 1 and 86400"));
  CHECK_THAT(parse_flags({"--module", "pkg.main"}), Catch::Contains("--module is a DeepSpeed (Python) feature"));
  CHECK(parse_flags({"--elastic_training", "--max_restarts", "3", "--min_elastic_nodes", "1"}) == "(no error)");
}
