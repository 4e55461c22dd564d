// End-to-end trainer tests on a generated corpus: falling loss, bit-identical
// determinism, exact resume (2N steps == N + resume + N, with the default
// dropout 0.1 and with dropout 0.3), preset configs
// parse, and bad inputs fail with one clear error and write nothing.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "test/train/train_fixture.h"

using namespace ds;
namespace fs = std::filesystem;

using namespace ds::test;

TEST_CASE("loss falls on the generated corpus (gpt2 and llama)") {
  for (const char* family : {"gpt2", "llama"}) {
    std::vector<std::string> extra = {"--train-iters", "80"};
    if (std::string(family) == "llama")
      for (const std::string& f : llama_flags()) extra.push_back(f);
    std::vector<float> l = train(extra);
    REQUIRE(l.size() == 80);
    INFO(family << ": first " << l.front() << " last " << l.back());
    REQUIRE(l.front() > 5.0f);           // ~ln(320) at init
    REQUIRE(l.back() < l.front() - 1.2f);
  }
}

TEST_CASE("same seed and config give bit-identical losses") {
  std::vector<float> a = train({"--train-iters", "6"});
  std::vector<float> b = train({"--train-iters", "6"});
  REQUIRE(a == b);
  std::vector<float> c = train({"--train-iters", "6", "--seed", "99"});
  REQUIRE(a != c);
}

TEST_CASE("2N steps equal N steps + resume + N steps, bit for bit") {
  fs::path ck = fixture().dir / "ckpt_resume";
  fs::remove_all(ck);
  std::vector<float> full = train({"--train-iters", "8"});
  std::vector<float> first = train({"--train-iters", "8", "--exit-interval", "4", "--save", ck.string(),
                                    "--save-interval", "4"});
  REQUIRE(first.size() == 4);
  REQUIRE(fs::exists(ck / "latest"));
  std::vector<float> second = train({"--train-iters", "8", "--load", ck.string()});
  REQUIRE(second.size() == 4);
  first.insert(first.end(), second.begin(), second.end());
  REQUIRE(first == full);
}

TEST_CASE("--reset-iteration: a loaded run starts at iteration 0 and the start of the data, weights and optimizer kept") {
  fs::path ck = fixture().dir / "ckpt_reset_iteration";
  fs::remove_all(ck);
  const std::vector<float> fresh = train({"--train-iters", "3"});
  train({"--train-iters", "4", "--save", ck.string(), "--save-interval", "4"});
  // (As the compression scripts: the flags' schedule over the checkpoint's.)
  Trainer t(make_config({"--train-iters", "3", "--load", ck.string(), "--reset-iteration",
                         "--override-opt_param-scheduler"}),
            single_process());
  const std::vector<float> again = t.run();
  REQUIRE(again.size() == 3);  // without the reset: none (the checkpoint is past iteration 3)
  CHECK(t.state().iteration == 3);
  CHECK(t.state().consumed_samples == 3 * 8);
  CHECK(t.optimizer_steps() == 4 + 3);  // Adam's state (and its step count) came with the checkpoint
  CHECK(again[0] < fresh[0]);           // the same first batch, on the trained weights
  REQUIRE(train({"--train-iters", "3", "--load", ck.string(), "--override-opt_param-scheduler"}).empty());
}

TEST_CASE("with strong dropout, resume is still bit for bit and the curve differs from no dropout") {
  // Masks are keyed by (seed, iteration, global sample, ...): a resumed run
  // draws exactly the masks the uninterrupted one drew.
  const std::vector<std::string> drop = {"--hidden-dropout", "0.3", "--attention-dropout", "0.3"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), drop.begin(), drop.end());
    return a;
  };
  fs::path ck = fixture().dir / "ckpt_resume_dropout";
  fs::remove_all(ck);
  std::vector<float> full = train(with({"--train-iters", "8"}));
  std::vector<float> first = train(with({"--train-iters", "8", "--exit-interval", "4", "--save", ck.string(),
                                         "--save-interval", "4"}));
  REQUIRE(first.size() == 4);
  std::vector<float> second = train(with({"--train-iters", "8", "--load", ck.string()}));
  first.insert(first.end(), second.begin(), second.end());
  REQUIRE(first == full);
  std::vector<float> none = train({"--train-iters", "8", "--hidden-dropout", "0", "--attention-dropout", "0"});
  REQUIRE(none.size() == full.size());
  REQUIRE(none[0] != full[0]);  // dropout acts from the first step
}

TEST_CASE("preset configs parse") {
  std::string src = std::getenv("DS_SOURCE_DIR");
  for (const char* f : {"demo", "gpt2-124m", "gpt2-350m", "gpt2-1.3b", "llama-1b"}) {
    std::string path = src + "/configs/" + f + ".json";
    std::vector<std::string> args = {"dstrain", "--config", path};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    INFO(path);
    TrainConfig c = parse_train_config(static_cast<int>(argv.size()), argv.data(), 1);
    REQUIRE(c.train_iters > 0);
  }
}

// CPU optimizer offload on the CPU backend: the optimizer state is in host
// memory already, so the run is the one without the key (Megatron-DeepSpeed's
// offload scripts run unchanged on CPUs).
TEST_CASE("offload_optimizer.device cpu on the CPU backend trains as without it") {
  fs::path offload = fixture().dir / "offload.json", plain = fixture().dir / "zero1.json";
  std::ofstream(offload) << R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})";
  std::ofstream(plain) << R"({"zero_optimization": {"stage": 1}})";
  const std::vector<float> a = train({"--config", offload.string(), "--train-iters", "4"});
  const std::vector<float> b = train({"--config", plain.string(), "--train-iters", "4"});
  REQUIRE(a.size() == 4);
  REQUIRE(a == b);
}

TEST_CASE("bad inputs give one clear error and write nothing") {
  fs::path save = fixture().dir / "must_not_exist";
  auto expect_error = [&](std::vector<std::string> extra, const std::string& needle) {
    extra.insert(extra.end(), {"--train-iters", "4", "--save", save.string()});
    try {
      Trainer t(make_config(extra), single_process());
      t.run();
      FAIL("expected an error mentioning " << needle);
    } catch (const UserError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find(needle) != std::string::npos);
    }
    REQUIRE_FALSE(fs::exists(save));
  };
  expect_error({"--data-path", (fixture().dir / "nope").string()}, "nope");
  expect_error({"--global-batch-size", "6"}, "6");
  expect_error({"--seq-length", "64"}, "max");
  // A vocabulary smaller than the dataset's token ids.
  fs::path small = fixture().dir / "small_vocab.json";
  {
    std::ofstream f(small);
    f << R"({"a": 0, "b": 1, "c": 2})";
  }
  expect_error({"--vocab-file", small.string()}, "vocab");
  // A CSV monitor directory that cannot be made.
  fs::path notes = fixture().dir / "notes.txt";
  { std::ofstream(notes) << "keep me"; }
  fs::path csv = fixture().dir / "csv.json";
  {
    std::ofstream f(csv);
    f << R"({"csv_monitor": {"enabled": true, "output_path": ")" << notes.string() << R"(", "job_name": "j"}})";
  }
  expect_error({"--config", csv.string()}, "csv_monitor: cannot create '" + (notes / "j").string() + "'");
  // Outputs that would fail only after training, and a --load that is a file, are refused before it; an
  // export never replaces a file or a directory of other files.
  fs::path mine = fixture().dir / "mine";
  fs::create_directories(mine);
  { std::ofstream(mine / "train.py") << "keep me too"; }
  expect_error({"--export-hf", notes.string()}, "--export-hf '" + notes.string() + "': '" + notes.string() +
                                                     "' exists and is not a directory");
  expect_error({"--export-hf", mine.string()}, "already holds 'train.py', so it is not a previous export");
  expect_error({"--load", notes.string()}, "--load '" + notes.string() + "' is a file, not a checkpoint directory");
  std::ifstream kept(notes);
  std::string text((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>());
  CHECK(text == "keep me");
  CHECK(fs::exists(mine / "train.py"));
  try {
    Trainer t(make_config({"--train-iters", "4", "--save", (notes / "ck").string()}), single_process());
    FAIL("expected an error naming --save");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--save '" + (notes / "ck").string() + "': '" + notes.string() +
                                         "' is not a directory"));
  }
}

TEST_CASE("an export to DIR/ (trailing slash) writes DIR, and a second export replaces the first") {
  fs::path out = fixture().dir / "hf_slash";
  fs::remove_all(out);
  train({"--train-iters", "3", "--export-hf", out.string() + "/"});
  REQUIRE(fs::exists(out / "model.safetensors"));
  REQUIRE(fs::exists(out / "config.json"));
  train({"--train-iters", "3", "--export-hf", out.string()});
  REQUIRE(fs::exists(out / "model.safetensors"));
  for (const auto& e : fs::directory_iterator(fixture().dir))  // no temporary directory left beside it
    CHECK(e.path().filename().string().find("hf_slash.tmp") == std::string::npos);
}

// Every tensor of every .safetensors file under `dir` is finite.
static bool all_finite(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    SafetensorsFile f = SafetensorsFile::open(e.path().string());
    for (const std::string& n : f.names()) {
      Tensor t = f.get(n);
      if (t.dtype() != DType::F32) continue;
      const float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i)
        if (!std::isfinite(p[i])) return false;
    }
  }
  return true;
}

TEST_CASE("a diverging run skips non-finite iterations, stops after --max-nan-iterations, saves no NaN") {
  for (const char* precision : {"fp32", "bf16"}) {
    INFO(precision);
    fs::path ck = fixture().dir / (std::string("ckpt_nan_") + precision);
    fs::remove_all(ck);
    std::vector<std::string> extra = {"--train-iters", "30", "--lr", "1e20", "--lr-warmup-iters", "0",
                                      "--clip-grad", "0", "--save", ck.string(), "--save-interval", "1",
                                      "--max-nan-iterations", "3"};
    if (std::string(precision) == "bf16") extra.push_back("--bf16");
    Trainer t(make_config(extra), single_process());
    try {
      t.run();
      FAIL("a run with --lr 1e20 must stop with an error");
    } catch (const UserError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find("diverged") != std::string::npos);
      REQUIRE(std::string(e.what()).find("3 iterations in a row") != std::string::npos);
    }
    // It stopped early, and whatever 'latest' names holds finite numbers only.
    REQUIRE(t.state().iteration < 30);
    if (fs::exists(ck / "latest")) {
      std::ifstream in(ck / "latest");
      std::string step;
      in >> step;
      REQUIRE(all_finite(ck / step));
    }
  }
}

TEST_CASE("a short non-finite streak is skipped without an update and training goes on") {
  // With the limit high, the run reaches train_iters; NaN iterations apply no
  // update, so the step counter advances while the LR schedule does not.
  Trainer t(make_config({"--train-iters", "6", "--lr", "1e20", "--lr-warmup-iters", "0", "--clip-grad", "0",
                         "--max-nan-iterations", "100"}),
            single_process());
  t.run();
  REQUIRE(t.state().iteration == 6);
  REQUIRE(t.state().skipped_steps > 0);
  // One process: the device's gate skipped them; Adam's step count agrees.
  REQUIRE(t.optimizer_steps() == 6 - t.state().skipped_steps);
}

TEST_CASE("--exit-duration-in-mins saves and stops once the time is up") {
  fs::path ck = fixture().dir / "ckpt_duration";
  fs::remove_all(ck);
  // A duration shorter than one iteration: stop after the first, with a checkpoint.
  std::vector<float> l = train({"--train-iters", "8", "--exit-duration-in-mins", "1e-9", "--save", ck.string()});
  REQUIRE(l.size() == 1);
  std::ifstream in(ck / "latest");
  std::string step;
  in >> step;
  CHECK(step == "global_step1");
}
