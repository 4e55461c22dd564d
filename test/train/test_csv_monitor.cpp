// The CSV monitor under faults: a full disk stops training with one line
// naming the file and leaves whole rows only (and a resume appends cleanly);
// a partial last row from a killed run is removed before new rows; dsplot
// warns about an empty valid.csv instead of refusing the run. The full disk
// is a small tmpfs (test/small_disk.h); the case skips where none can be made.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "lib/core/error.h"
#include "lib/plot/runs.h"
#include "lib/train/metrics.h"
#include "test/data/test_util.h"
#include "test/skip.h"
#include "test/small_disk.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

IterStats row(int64_t iteration) {
  IterStats s;
  s.iteration = iteration;
  s.consumed_samples = 16 * iteration;
  s.lr = 1e-3;
  s.loss = 5.0 - 1e-4 * static_cast<double>(iteration);
  s.grad_norm = 1.5;
  s.ms_per_iter = 120;
  return s;
}

int64_t rows_in(const std::string& path) { return static_cast<int64_t>(plot::read_csv(path).rows.size()); }

// Child, on a 16 KiB tmpfs at `dir`: log rows until the disk is full, check
// the error and the file, then free space and resume. 1: as expected.
int fill_then_resume(const fs::path& dir) {
  test::spit((dir / "filler").string(), std::string(8192, 'x'));
  const std::string train = (dir / "job" / "train.csv").string();
  int64_t written = 0;
  std::string msg;
  {
    CsvMonitor csv;
    csv.open(dir.string(), "job");
    try {
      for (int64_t it = 1; it <= 100000; ++it, ++written) csv.train(row(it));
    } catch (const UserError& e) {
      msg = e.what();
    }
  }
  const std::string text = test::slurp(train);
  const bool named = msg.find("No space left on device") != std::string::npos &&
                     msg.find(train) != std::string::npos && msg.find('\n') == std::string::npos;
  const bool whole = !text.empty() && text.back() == '\n' && rows_in(train) == written;
  if (!named || !whole || written == 0) {
    std::fprintf(stderr, "after %lld rows: message '%s', file ends %s, %lld rows read\n",
                 static_cast<long long>(written), msg.c_str(), text.empty() || text.back() != '\n' ? "mid-row" : "whole",
                 static_cast<long long>(text.empty() ? 0 : rows_in(train)));
    return 2;
  }
  fs::remove(dir / "filler");
  CsvMonitor resumed;
  resumed.open(dir.string(), "job");
  resumed.train(row(written + 1));
  resumed.valid(written + 1, 4.0);
  const plot::CsvTable t = plot::read_csv(train);
  return t.rows.size() == static_cast<size_t>(written + 1) && t.rows.back()[0] == static_cast<double>(written + 1)
             ? 1
             : 2;
}

}  // namespace

TEST_CASE("a full disk stops the CSV monitor with one line and leaves whole rows", "[small_disk]") {
  test::TempDir tmp;
  const fs::path dir = tmp / "disk";
  fs::create_directories(dir);
  const int code = test::run_on_small_disk(dir, 16, [&] { return fill_then_resume(dir); });
  if (code == test::kNoSmallDisk) DS_SKIP("cannot mount a small tmpfs here (not root, no user namespaces)");
  CHECK(code == 1);
}

TEST_CASE("a partial last row is removed before the monitor appends") {
  test::TempDir tmp;
  fs::create_directories(tmp / "job");
  const std::string train = tmp / "job/train.csv", valid = tmp / "job/valid.csv";
  test::spit(train,
             "iteration,consumed_samples,lr,loss,grad_norm,loss_scale,ms_per_iter,tokens_per_s,tflops\n"
             "10,160,1e-3,5.0,1.5,1,120,1,1\n20,32");
  test::spit(valid, "iteration,lo");  // killed while writing the header
  {
    CsvMonitor csv;
    csv.open(tmp.path(), "job");
    csv.train(row(30));
    csv.valid(30, 4.5);
  }
  const plot::CsvTable t = plot::read_csv(train);
  REQUIRE(t.rows.size() == 2);
  CHECK(t.rows[0][0] == 10);
  CHECK(t.rows[1][0] == 30);
  const plot::CsvTable v = plot::read_csv(valid);
  CHECK(v.columns == std::vector<std::string>{"iteration", "loss", "ppl"});
  REQUIRE(v.rows.size() == 1);
  CHECK(v.rows[0][1] == 4.5);
}

TEST_CASE("dsplot warns about an empty valid.csv and plots the training rows") {
  test::TempDir tmp;
  fs::create_directories(tmp / "job");
  test::spit(tmp / "job/train.csv",
             "iteration,consumed_samples,lr,loss,grad_norm,loss_scale,ms_per_iter,tokens_per_s,tflops\n"
             "10,160,1e-3,5.0,1.5,1,120,1,1\n20,320,1e-3,4.5,1.5,1,120,1,1\n");
  test::spit(tmp / "job/valid.csv", "");
  const plot::Run r = plot::load_run(tmp / "job", plot::LoadOptions{});
  CHECK(r.curves.at("train_loss").x == std::vector<double>{10, 20});
  CHECK(r.curves.count("valid_loss") == 0);
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0].find(tmp / "job/valid.csv") != std::string::npos);
  CHECK(r.warnings[0].find("empty") != std::string::npos);
}
