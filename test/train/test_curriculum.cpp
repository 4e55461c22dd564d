// Sequence-length curriculum (DeepSpeed's legacy curriculum_learning): the
// scheduler against hand-computed DeepSpeed values for the three schedule
// types and the hold-at-max rule, the config section's parsing and errors,
// and the trainer: the first step trains on the first L tokens of each
// sample, consumed tokens follow the real lengths (and --train-tokens with
// them), and a run resumed mid-warmup continues bit for bit.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/config/curriculum.h"
#include "lib/core/error.h"
#include "lib/train/data_pipeline.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;
namespace fs = std::filesystem;

namespace {

CurriculumConfig linear(int64_t min, int64_t max, int64_t total, int64_t step) {
  CurriculumConfig c;
  c.enabled = true;
  c.min_difficulty = min;
  c.max_difficulty = max;
  c.schedule = CurriculumSchedule::FixedLinear;
  c.total_curriculum_step = total;
  c.difficulty_step = step;
  return c;
}

CurriculumConfig discrete(int64_t max, std::vector<int64_t> d, std::vector<int64_t> steps) {
  CurriculumConfig c;
  c.enabled = true;
  c.min_difficulty = d.front();
  c.max_difficulty = max;
  c.schedule = CurriculumSchedule::FixedDiscrete;
  c.difficulty = std::move(d);
  c.max_step = std::move(steps);
  return c;
}

// A config file holding `section` as its curriculum_learning key (and `more`
// keys, if given).
std::string config_file(const std::string& name, const std::string& section, const std::string& more = "") {
  const fs::path p = fixture().dir / (name + ".json");
  std::ofstream(p) << "{" << more << (more.empty() ? "" : ", ") << "\"curriculum_learning\": " << section << "}";
  return p.string();
}

// Column `col` (0-based) of the first data row of a CSV file.
double first_row_value(const fs::path& csv, int col) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);  // header
  std::getline(f, line);
  std::stringstream ss(line);
  std::string cell;
  for (int i = 0; i <= col; ++i) std::getline(ss, cell, ',');
  return std::stod(cell);
}

std::string parse_error(std::vector<std::string> extra) {
  try {
    make_config(std::move(extra));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

const char* kTemplate = R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
  "max_difficulty": 32, "schedule_type": "fixed_linear",
  "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}})";

}  // namespace

TEST_CASE("fixed_linear and fixed_root give DeepSpeed's values") {
  // min 64, max 2048, 100 steps, multiples of 8 (the rope_slw script's shape):
  // step 1: floor(0.01 * 1984 + 64) = 83 -> 80; step 33: floor(718.72) = 718 -> 712.
  const CurriculumConfig c = linear(64, 2048, 100, 8);
  CHECK(curriculum_difficulty(c, 1) == 80);
  CHECK(curriculum_difficulty(c, 33) == 712);
  CHECK(curriculum_difficulty(c, 50) == 1056);
  CHECK(curriculum_difficulty(c, 100) == 2048);
  CHECK(curriculum_difficulty(c, 250) == 2048);  // capped at max
  // fixed_root, degree 2: min 8, max 64, 16 steps, multiples of 4.
  CurriculumConfig r = linear(8, 64, 16, 4);
  r.schedule = CurriculumSchedule::FixedRoot;
  r.root_degree = 2;
  CHECK(curriculum_difficulty(r, 1) == 20);  // sqrt(1/16) * 56 + 8 = 22 -> 20
  CHECK(curriculum_difficulty(r, 2) == 24);  // 27.798 -> 27 -> 24
  CHECK(curriculum_difficulty(r, 4) == 36);  // 0.5 * 56 + 8
  CHECK(curriculum_difficulty(r, 9) == 48);  // 50 -> 48
  CHECK(curriculum_difficulty(r, 16) == 64);
  // Rounding down below the start is raised to the first multiple of the step at or above min.
  CHECK(curriculum_difficulty(linear(8, 64, 100, 16), 1) == 16);
  // A max that is not a multiple of the step is reached only through the cap.
  const CurriculumConfig odd = linear(64, 100, 10, 8);
  CHECK(curriculum_difficulty(odd, 10) == 96);
  CHECK(curriculum_difficulty(odd, 12) == 100);
  CHECK(curriculum_values(odd) == std::vector<int64_t>{64, 72, 80, 88, 96, 100});
}

TEST_CASE("fixed_discrete walks its list and the scheduler holds at max") {
  const CurriculumConfig c = discrete(64, {16, 32, 64}, {3, 5});
  const std::vector<int64_t> want = {16, 16, 16, 32, 32, 64, 64};
  for (int64_t s = 1; s <= 7; ++s) CHECK(curriculum_difficulty(c, s) == want[s - 1]);
  // Once the current difficulty reaches max it stays, even where the list goes down.
  const CurriculumConfig down = discrete(64, {16, 64, 32}, {2, 4});
  CurriculumScheduler held(down);
  std::vector<int64_t> got;
  for (int64_t s = 1; s <= 6; ++s) got.push_back(held.update(s));
  CHECK(got == std::vector<int64_t>{16, 16, 64, 64, 64, 64});
  CurriculumScheduler free_to_fall(discrete(128, {16, 64, 32}, {2, 4}));
  got.clear();
  for (int64_t s = 1; s <= 6; ++s) got.push_back(free_to_fall.update(s));
  CHECK(got == std::vector<int64_t>{16, 16, 64, 64, 32, 32});
  // replay(n) is the state after steps 1..n.
  CurriculumScheduler resumed(down);
  resumed.replay(4);
  CHECK(resumed.current() == 64);
  CHECK(resumed.update(5) == 64);
  CurriculumScheduler fresh(linear(64, 2048, 100, 8));
  CHECK(fresh.current() == 64);
  fresh.replay(33);
  CHECK(fresh.current() == 712);
}

TEST_CASE("the curriculum_learning section parses, round-trips and refuses bad values") {
  const TrainConfig cfg = make_config({"--config", config_file("cl_ok", kTemplate)});
  const CurriculumConfig& c = cfg.curriculum;
  REQUIRE(c.enabled);
  CHECK(c.min_difficulty == 8);
  CHECK(c.max_difficulty == 32);
  CHECK(c.schedule == CurriculumSchedule::FixedLinear);
  CHECK(c.total_curriculum_step == 6);
  CHECK(c.difficulty_step == 8);
  for (const std::string& w : cfg.warnings) CHECK(w.find("curriculum") == std::string::npos);
  const TrainConfig step4 = make_config({"--config", config_file("cl_step4", R"({"enabled": true,
    "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 4, "root_degree": 3}})")});
  REQUIRE(step4.warnings.size() >= 2);
  CHECK_THAT(step4.warnings, Catch::VectorContains(std::string(
                                 "config: 'curriculum_learning.schedule_config.difficulty_step' 4 is not a multiple of "
                                 "8: sequence lengths that are not multiples of 8 keep tensor cores partly idle on GPUs")));
  CHECK_THAT(step4.warnings, Catch::VectorContains(std::string(
                                 "config: 'curriculum_learning.schedule_config.root_degree' is ignored by the "
                                 "fixed_linear schedule (degree 1)")));
  const TrainConfig again = train_config_from_json(cfg.resolved, 1);
  CHECK(again.resolved == cfg.resolved);
  CHECK(again.curriculum.total_curriculum_step == 6);
  // Disabled: nothing happens, nothing is said.
  const TrainConfig off = make_config({"--config", config_file("cl_off", R"({"enabled": false, "x": 1})")});
  CHECK(!off.curriculum.enabled);

  auto err = [](const std::string& name, const std::string& section, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--config", config_file(name, section)});
    return parse_error(extra);
  };
  CHECK_THAT(err("cl_type", R"({"enabled": true, "curriculum_type": "vocabularyrarity", "min_difficulty": 8,
    "max_difficulty": 32, "schedule_type": "fixed_linear"})"),
             Catch::Contains("'curriculum_learning.curriculum_type' is \"vocabularyrarity\"; dstrain implements only "
                             "\"seqlen\""));
  CHECK_THAT(err("cl_nomin", R"({"enabled": true, "curriculum_type": "seqlen", "max_difficulty": 32,
    "schedule_type": "fixed_linear"})"),
             Catch::Contains("'curriculum_learning.min_difficulty' is missing"));
  CHECK_THAT(err("cl_sched", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
    "max_difficulty": 32, "schedule_type": "custom"})"),
             Catch::Contains("'curriculum_learning.schedule_type' is \"custom\""));
  CHECK_THAT(err("cl_total", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
    "max_difficulty": 32, "schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": 6,
    "difficulty_step": 8}})"),
             Catch::Contains("'curriculum_learning.schedule_config.root_degree' is required"));
  CHECK_THAT(err("cl_list", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
    "max_difficulty": 32, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16.5],
    "max_step": [3]}})"),
             Catch::Contains("'curriculum_learning.schedule_config.difficulty' must be a list of positive integers"));
  CHECK_THAT(err("cl_len", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
    "max_difficulty": 32, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16, 32],
    "max_step": [3]}})"),
             Catch::Contains("one more difficulty than max_step"));
  CHECK_THAT(err("cl_max", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
    "max_difficulty": 64, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 6,
    "difficulty_step": 8}})"),
             Catch::Contains("max_difficulty 64 must satisfy 1 <= min <= max <= model.seq_length 32"));
  CHECK_THAT(err("cl_step", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
    "max_difficulty": 32, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 0,
    "difficulty_step": 8}})"),
             Catch::Contains("total_curriculum_step 0 and difficulty_step 8 must be positive"));
  CHECK_THAT(err("cl_num", R"({"enabled": true, "curriculum_type": "seqlen", "min_difficulty": "8",
    "max_difficulty": 32, "schedule_type": "fixed_linear"})"),
             Catch::Contains("'curriculum_learning.min_difficulty' must be an integer"));
}

TEST_CASE("lengths a sequence-splitting layout cannot take are refused at start-up") {
  const std::string odd = config_file("cl_odd", R"({"enabled": true, "curriculum_type": "seqlen",
    "min_difficulty": 6, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 3}})");
  auto parse = [&](std::vector<std::string> a, int world) {
    a.insert(a.begin(), {"dstrain", "--config", odd, "--num-layers", "2", "--hidden-size", "32",
                         "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "4",
                         "--global-batch-size", "8"});
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    try {
      parse_train_config(static_cast<int>(argv.size()), argv.data(), world);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(parse({}, 1).empty());  // a single process takes any length (DeepSpeed's multiple-of-8 advice is a warning)
  CHECK_THAT(parse({"--ds-sequence-parallel-size", "2"}, 2),
             Catch::Contains("the schedule reaches sequence length 9, which is not divisible by 2 "
                             "(ds_sequence_parallel_size 2 x 1 for sequence parallelism)"));
  CHECK_THAT(parse({"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2),
             Catch::Contains("not divisible by 2 (ds_sequence_parallel_size 1 x 2 for sequence parallelism)"));
  CHECK(parse({"--tensor-model-parallel-size", "2"}, 2).empty());  // plain TP keeps whole sequences
}

TEST_CASE("a curriculum step trains on the first L tokens of every sample, weighted per real token") {
  // min 16, step 8, 4 steps to 32: step 1 trains on 16 positions.
  const fs::path csv = fixture().dir / "cl_first_csv";
  fs::remove_all(csv);
  const std::string cl = config_file("cl_first", R"({"enabled": true, "curriculum_type": "seqlen",
    "min_difficulty": 16, "max_difficulty": 32, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}})",
                                     R"("csv_monitor": {"enabled": true, "output_path": ")" + csv.string() +
                                         R"(", "job_name": "j"})");
  const std::vector<std::string> args = {"--config", cl, "--train-iters", "1", "--lr-warmup-iters", "0", "--hidden-dropout", "0",
                                         "--attention-dropout", "0", "--eval-iters", "0"};
  TrainConfig cfg = make_config(args);
  Trainer t(cfg, single_process());
  resolve_vocab(cfg);  // the trainer does this on its own copy
  DataPipeline data(cfg, Device::cpu());
  double want16 = 0, want32 = 0;
  // The gradient of the mean loss over the 8 x 16 tokens of step 1: its norm is
  // what the step reports (before clipping).
  const Tensor g0 = t.model().grads().to(Device::cpu());
  for (int micro = 0; micro < 2; ++micro) {
    MicroBatch mb = data.train_batch(0, micro, 0, 1, 16);
    t.model().forward_backward(mb.tokens, mb.targets, 1.0f / (4 * 16 * 2), DropoutKey{.train = true});
  }
  const Tensor g1 = t.model().grads().to(Device::cpu());
  double sq = 0;
  for (int64_t i = 0; i < g1.numel(); ++i) {
    const double d = static_cast<double>(g1.data<float>()[i]) - g0.data<float>()[i];
    sq += d * d;
  }
  const double want_norm = std::sqrt(sq);
  for (int micro = 0; micro < 2; ++micro) {  // global 8 = micro 4 x 2
    MicroBatch mb = data.train_batch(0, micro, 0, 1, 16);
    REQUIRE(mb.tokens.size(1) == 16);
    MicroBatch full = data.train_batch(0, micro, 0, 1);
    REQUIRE(full.tokens.size(1) == 32);
    for (int64_t b = 0; b < 4; ++b)  // the first 16 positions and their targets, unchanged
      for (int64_t i = 0; i < 16; ++i) {
        REQUIRE(mb.tokens.data<int32_t>()[b * 16 + i] == full.tokens.data<int32_t>()[b * 32 + i]);
        REQUIRE(mb.targets.data<int32_t>()[b * 16 + i] == full.targets.data<int32_t>()[b * 32 + i]);
      }
    want16 += t.model().forward_loss(mb.tokens, mb.targets) / 2;
    want32 += t.model().forward_loss(full.tokens, full.targets) / 2;
  }
  const std::vector<float> got = t.run();
  REQUIRE(got.size() == 1);
  INFO("curriculum step 1: " << got[0] << ", forward over 16 positions " << want16 << ", over 32 " << want32);
  CHECK(std::abs(got[0] - want16) <= 1e-6 * std::abs(want16));
  CHECK(std::abs(want16 - want32) > 1e-4);
  CHECK(t.state().consumed_tokens == 8 * 16);
  // CSV columns: iteration, consumed_samples, lr, loss, grad_norm, ...
  const double norm = first_row_value(csv / "j" / "train.csv", 4);
  INFO("grad norm of step 1: " << norm << ", of the mean over 8 x 16 tokens " << want_norm);
  CHECK(std::abs(norm - want_norm) <= 1e-5 * want_norm);  // the CSV holds 7 significant digits
}

TEST_CASE("consumed tokens follow the curriculum: --train-tokens, and resume mid-warmup is bit for bit") {
  // Lengths 8, 16, 16, 24, 24, 32, 32, ... (fixed_linear over 6 steps: floor(s/6 * 24 + 8) in multiples of 8).
  const std::string cl = config_file("cl_resume", kTemplate);
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), {"--config", cl});
    return a;
  };
  {
    Trainer t(make_config(with({"--train-iters", "100", "--train-tokens", std::to_string(8 * (8 + 16 + 16 + 24))})),
              single_process());
    const std::vector<float> l = t.run();
    CHECK(l.size() == 4);  // the full length would have stopped after 2
    CHECK(t.state().consumed_tokens == 8 * 64);
  }
  const auto [full, tokens] = require_resume_equal(with({}), (fixture().dir / "ckpt_curriculum").string());
  CHECK(tokens == 8 * (8 + 16 + 16 + 24 + 24 + 32 + 32 + 32));
  // Without the curriculum the curve differs from the first step.
  const std::vector<float> plain = train({"--train-iters", "1", "--lr-warmup-iters", "0"});
  CHECK(plain[0] != full[0]);
}
