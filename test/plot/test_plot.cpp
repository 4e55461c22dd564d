// Tests of lib/plot (CSV and TensorBoard files read back, axes, SVG, PNG via
// librsvg), the progress lines (lib/core/progress.h) and the trainer's
// iteration line with its elapsed time and ETA.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <regex>
#include <sstream>

#include "lib/ckpt/checkpoint.h"
#include "lib/core/error.h"
#include "lib/core/progress.h"
#include "lib/plot/png.h"
#include "lib/plot/runs.h"
#include "lib/plot/svg.h"
#include "lib/train/metrics.h"
#include "lib/train/tensorboard.h"
#include "test/data/test_util.h"
#include "test/model/tiny_model.h"

#ifdef DS_HAVE_CAIRO
#include <cairo.h>
#endif

using namespace ds;
using namespace ds::plot;

namespace {

// The text a Progress wrote into a temporary stream.
struct Captured {
  std::FILE* f = std::tmpfile();
  ~Captured() { std::fclose(f); }
  std::string text() {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[512];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    return s;
  }
};

void write_text(const std::string& path, const std::string& text) { test::spit(path, text); }

using test::error_of;

const char* kTrainCsv =
    "iteration,consumed_samples,lr,loss,grad_norm,loss_scale,ms_per_iter,tokens_per_s,tflops\n"
    "10,160,1.00000000e-03,5.50000000e+00,2.500000e+00,1,100.000,20480.0,0.0100\n"
    "20,320,2.00000000e-03,4.75000000e+00,1.250000e+00,1,100.000,20480.0,0.0100\n"
    "30,480,1.50000000e-03,nan,inf,1,100.000,20480.0,0.0100\n";

}  // namespace

TEST_CASE("progress lines carry done, rate, elapsed and ETA fields") {
  CHECK(format_duration(0) == "0:00:00");
  CHECK(format_duration(3725.4) == "1:02:05");
  CHECK(format_duration(-1) == "unknown");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(4.19e6) == "4.19 MB");
  ProgressOptions o{.label = "saving checkpoint", .unit = ProgressUnit::Bytes, .total = 4000000000};
  CHECK(format_progress(o, 1000000000, -1, 2.0) ==
        "saving checkpoint | 1.00 GB of 4.00 GB (25.0%) | 500.00 MB/s | elapsed 0:00:02 | ETA 0:00:06");
  ProgressOptions c{.label = "x", .unit = ProgressUnit::Count, .count_name = "documents"};
  CHECK(format_progress(c, 30, -1, 3.0) == "x | 30 documents | 10.0 documents/s | elapsed 0:00:03 | ETA unknown");
}

TEST_CASE("progress prints a plain line per interval and a last line; a terminal line is redrawn") {
  {
    Captured cap;
    Progress p(ProgressOptions{.label = "t", .unit = ProgressUnit::Count, .count_name = "docs", .total = 10,
                               .style = ProgressStyle::Lines, .every = 4, .stream = cap.f});
    for (int i = 1; i <= 10; ++i) p.update(i);
    p.finish();
    const std::string s = cap.text();
    const std::regex line(R"(t \| (\d+) docs of 10 docs \((\d+\.\d)%\) \| [\d.]+ docs/s \| elapsed \d+:\d\d:\d\d \| ETA (\d+:\d\d:\d\d)\n)");
    std::vector<std::string> done;
    for (auto it = std::sregex_iterator(s.begin(), s.end(), line); it != std::sregex_iterator(); ++it)
      done.push_back((*it)[1]);
    CHECK(done == std::vector<std::string>{"4", "8", "10"});  // every 4, then the last line
    CHECK(s.find("ETA 0:00:00\n") != std::string::npos);
    CHECK(s.find('\r') == std::string::npos);
  }
  {
    Captured cap;
    Progress p(ProgressOptions{.label = "t", .total = 100, .style = ProgressStyle::Terminal, .period_s = 0,
                               .stream = cap.f});
    p.update(50);
    p.update(100);
    p.finish();
    const std::string s = cap.text();
    CHECK(s.rfind("\rt | 50 B of 100 B (50.0%)", 0) == 0);
    CHECK(s.find("\rt | 100 B of 100 B (100.0%)") != std::string::npos);
    CHECK(s.back() == '\n');
    CHECK(std::count(s.begin(), s.end(), '\n') == 1);  // one line, redrawn in place
  }
  {
    Captured cap;  // a quick operation stays silent, and so does its finish
    Progress p(ProgressOptions{.label = "t", .total = 100, .style = ProgressStyle::Lines, .line_period_s = 0,
                               .quiet_s = 60, .stream = cap.f});
    p.update(100);
    p.finish();
    CHECK(cap.text().empty());
  }
}

TEST_CASE("the iteration line ends with the elapsed time and the ETA to train_iters") {
  IterStats s;
  s.iteration = 20;
  s.train_iters = 300;
  s.ms_per_iter = 812.5;
  s.elapsed_s = 3725;
  const std::string line = format_iteration(s);
  std::smatch m;
  REQUIRE(std::regex_search(line, m, std::regex(R"( elapsed time: (\d+):(\d\d):(\d\d) \| ETA: (\d+):(\d\d):(\d\d) \|$)")));
  CHECK(m.str(1) + ":" + m.str(2) + ":" + m.str(3) == "1:02:05");
  const int eta = std::stoi(m.str(4)) * 3600 + std::stoi(m.str(5)) * 60 + std::stoi(m.str(6));
  CHECK(eta == 228);  // 280 iterations left at 0.8125 s
  s.elapsed_s = -1;
  CHECK(format_iteration(s).find("ETA") == std::string::npos);
}

TEST_CASE("CSV monitor files read back against iterations, samples and tokens") {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "logs/job");
  write_text(dir / "logs/job/train.csv", kTrainCsv);
  write_text(dir / "logs/job/valid.csv", "iteration,loss,ppl\n20,4.9,134.28\n25,4.8,121.5\n");
  Run r = load_run(dir / "logs", LoadOptions{});  // csv_monitor's output_path with one job
  CHECK(r.label == "job");
  CHECK(r.curves.at("train_loss").x == std::vector<double>{10, 20});  // nan dropped
  CHECK(r.curves.at("train_loss").y == std::vector<double>{5.5, 4.75});
  CHECK(r.curves.at("grad_norm").y == std::vector<double>{2.5, 1.25});  // inf dropped
  CHECK(r.curves.at("lr").y == std::vector<double>{1e-3, 2e-3, 1.5e-3});
  CHECK(r.curves.at("valid_loss").y == std::vector<double>{4.9, 4.8});
  Run t = load_run(dir / "logs/job/valid.csv", LoadOptions{.x = XAxis::Tokens, .seq_length = 64});
  CHECK(t.curves.at("train_loss").x == std::vector<double>{160 * 64, 320 * 64});
  CHECK(t.curves.at("valid_loss").x == std::vector<double>{320 * 64, 400 * 64});  // 25: between rows 20 and 30
  CHECK(error_of([&] { load_run(dir / "logs/job", LoadOptions{.x = XAxis::Tokens}); }).find("--seq-length") !=
        std::string::npos);
  // A resumed run repeats iterations: the later row wins.
  write_text(dir / "logs/job/train.csv", std::string(kTrainCsv) + "20,320,2e-3,4.5,1,1,1,1,1\n");
  CHECK(load_run(dir / "logs/job", LoadOptions{}).curves.at("train_loss").y == std::vector<double>{5.5, 4.5});
  // A live run's last line still being written is left out; a bad line elsewhere is an error naming it.
  write_text(dir / "logs/job/train.csv", std::string(kTrainCsv) + "40,6");
  CHECK(load_run(dir / "logs/job", LoadOptions{}).curves.at("lr").x.size() == 3);
  // Decimal only: a hex, spaced or fractional iteration is an error naming the line and column.
  for (const char* it : {"0x28", " 40", "40.5", "4e1"}) {
    write_text(dir / "logs/job/train.csv", std::string(kTrainCsv) + it + ",640,1,1,1,1,1,1,1\n");
    CHECK(error_of([&] { load_run(dir / "logs/job", LoadOptions{}); })
              .find(fmt::format("line 5: column 'iteration' holds '{}', not a non-negative decimal integer", it)) !=
          std::string::npos);
  }
  write_text(dir / "logs/job/train.csv", std::string(kTrainCsv) + "40,640,0x1p3,1,1,1,1,1,1\n");
  CHECK(error_of([&] { load_run(dir / "logs/job", LoadOptions{}); }).find("column 'lr' holds '0x1p3'") !=
        std::string::npos);
  write_text(dir / "logs/job/train.csv", std::string(kTrainCsv) + "40,x,1,1,1,1,1,1,1\n");
  CHECK(error_of([&] { load_run(dir / "logs/job", LoadOptions{}); }).find("line 5: column 'consumed_samples' holds 'x'") !=
        std::string::npos);
  const std::string missing = dir / "nowhere";
  CHECK(error_of([&] { load_run(missing, LoadOptions{}); }).find(fmt::format("'{}' does not exist", missing)) !=
        std::string::npos);
  write_text(dir / "other.txt", "x");
  CHECK(error_of([&] { load_run(dir / "other.txt", LoadOptions{}); }).find("neither") != std::string::npos);
}

TEST_CASE("a bare file name in the current directory is labelled by that directory") {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "job");
  write_text(dir / "job/train.csv", kTrainCsv);
  {
    TensorBoardMonitor tb;
    tb.open(dir / "job", TensorBoardOptions{});
    tb.train(TrainPoint{.iteration = 1, .samples = 8, .tokens = 512, .lr = 1e-3, .loss = 5, .loss_scale = 1});
    tb.flush();
  }
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(dir / "job"))
    if (e.path().filename().string().starts_with("events.out.tfevents")) events = e.path().filename().string();
  REQUIRE(!events.empty());
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir / "job");
  std::string csv_label, events_label;
  try {
    csv_label = load_run("train.csv", LoadOptions{}).label;
    events_label = load_run(events, LoadOptions{}).label;
  } catch (...) {
    std::filesystem::current_path(cwd);
    throw;
  }
  std::filesystem::current_path(cwd);
  CHECK(csv_label == "job");
  CHECK(events_label == "job");
}

TEST_CASE("TensorBoard event files written by dstrain read back, corruption named") {
  test::TempDir dir;
  {
    TensorBoardMonitor tb;
    tb.open(dir / "tb", TensorBoardOptions{});
    for (int i = 1; i <= 3; ++i)
      tb.train(TrainPoint{.iteration = i, .samples = 8 * i, .tokens = 512 * i, .lr = 1e-3 * i, .loss = 6.0 - i,
                          .loss_scale = 1, .grad_norm = 0.5 * i});
    tb.valid(TrainPoint{.iteration = 3, .samples = 24, .tokens = 1536}, 2.75);
    tb.flush();
  }
  Run r = load_run(dir / "tb", LoadOptions{});
  CHECK(r.label == "tb");
  CHECK(r.curves.at("train_loss").x == std::vector<double>{1, 2, 3});
  CHECK(r.curves.at("train_loss").y == std::vector<double>{5, 4, 3});
  CHECK(r.curves.at("valid_loss").y == std::vector<double>{2.75});
  CHECK(r.curves.at("lr").y[1] == Approx(2e-3).epsilon(1e-6));  // stored as float
  CHECK(r.curves.count("loss_scale") == 0);                    // written for fp16 only
  Run t = load_run(dir / "tb", LoadOptions{.x = XAxis::Tokens});
  CHECK(t.curves.at("train_loss").x == std::vector<double>{512, 1024, 1536});
  // Flip one payload byte of the last record: its checksum no longer matches.
  const std::string file = std::filesystem::directory_iterator(dir / "tb")->path().string();
  std::string bytes = test::slurp(file);
  bytes[bytes.size() - 8] ^= 0x20;
  test::spit(file, bytes);
  CHECK(error_of([&] { read_event_file(file); }).find("checksum does not match") != std::string::npos);
}

TEST_CASE("nice axes and tick labels") {
  Axis a = nice_axis(3.1, 10.9, 6);
  CHECK(a.step == 2);
  CHECK(a.ticks == std::vector<double>{2, 4, 6, 8, 10, 12});
  Axis b = nice_axis(0, 2.6e6, 5);
  CHECK(b.step == 1e6);
  CHECK(tick_label(2e6, b.step) == "2M");
  CHECK(tick_label(15000, 2500) == "15.0k");
  CHECK(tick_label(0.0015, 0.0005) == "0.0015");
  CHECK(tick_label(7.5, 2.5) == "7.5");
  CHECK(nice_axis(5, 5, 4).ticks.size() >= 2);  // a flat curve still gets an axis
  CHECK(xml_escape("a<b & \"c\"") == "a&lt;b &amp; &quot;c&quot;");
}

TEST_CASE("the PNG renders the SVG's curves") {
  if (!png_supported()) {
    WARN("dsplot built without librsvg: no PNG output to check");
    return;
  }
  Run a{.label = "single process", .source = "a", .curves = {{"train_loss", {{0, 100}, {6, 3}}}}, .warnings = {}};
  Run b{.label = "TP2xPP2", .source = "b", .curves = {{"train_loss", {{0, 100}, {3, 6}}}}, .warnings = {}};
  const std::string svg = render_svg({a, b}, PlotOptions{.metrics = {"loss"}, .x = XAxis::Iteration, .title = "", .width = 400});
  test::TempDir dir;
  write_png(svg, dir / "c.png", 1.0);
#ifdef DS_HAVE_CAIRO
  cairo_surface_t* s = cairo_image_surface_create_from_png((dir / "c.png").c_str());
  REQUIRE(cairo_surface_status(s) == CAIRO_STATUS_SUCCESS);
  CHECK(cairo_image_surface_get_width(s) == 400);
  const int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* px = cairo_image_surface_get_data(s);
  int blue = 0, red = 0;  // pixels of each run's colour (#1f77b4, #d62728), ARGB32 little-endian: B G R A
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const unsigned char* p = px + y * stride + 4 * x;
      blue += p[0] > 150 && p[1] > 90 && p[1] < 150 && p[2] < 60;
      red += p[2] > 180 && p[1] < 70 && p[0] < 70;
    }
  cairo_surface_destroy(s);
  CHECK(blue > 200);  // a line across the panel (and its legend sample)
  CHECK(red > 200);
#endif
  CHECK(error_of([&] { write_png(svg, dir / "no/such/dir/c.png", 1.0); }).find("no/such/dir/c.png") !=
        std::string::npos);
  CHECK(!std::filesystem::exists(dir / "no"));
}

TEST_CASE("checkpoint saves and loads print byte progress lines") {
  test::TempDir dir;
  const ModelConfig cfg = test::tiny_model(false);
  const ModelLayout layout = build_layout(cfg);
  Tensor p = Tensor::zeros({layout.total}, DType::F32), m = p.clone(), v = p.clone();
  TrainState st;
  st.iteration = 7;
  // DS_PROGRESS=all: every update is a plain line (quick operations are otherwise silent).
  ::setenv("DS_PROGRESS", "all", 1);
  std::fflush(stderr);
  const int saved_fd = ::dup(2);
  const std::string log = dir / "stderr.txt";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  {
    CheckpointData d{&layout, p, adam_states(m, v), 0, layout.total, 0, 0, 1, nullptr, {}, nullptr};
    save_checkpoint(dir / "ckpt", st, d, nlohmann::json::object());
    TrainState back;
    REQUIRE(load_checkpoint(dir / "ckpt", back, d));
    CHECK(back.iteration == 7);
  }
  std::fflush(stderr);
  ::dup2(saved_fd, 2);
  ::close(saved_fd);
  ::unsetenv("DS_PROGRESS");
  const std::string text = test::slurp(log);
  INFO(text);
  const std::string fields = R"( \| [\d.]+ [KMG]?B of [\d.]+ [KMG]?B \([\d.]+%\) \| [\d.]+ [KMG]?B/s \| elapsed \d+:\d\d:\d\d \| ETA (\d+:\d\d:\d\d|unknown)\n)";
  CHECK(std::regex_search(text, std::regex("saving checkpoint .*/ckpt/global_step7" + fields)));
  CHECK(std::regex_search(text, std::regex("checksumming checkpoint .*" + fields)));
  CHECK(std::regex_search(text, std::regex("loading checkpoint .*/ckpt/global_step7" + fields)));
}

namespace {

// Every number in the points="..." attributes of the SVG's polylines, and
// how many points each polyline has.
std::vector<double> polyline_coordinates(const std::string& svg, std::vector<size_t>* counts) {
  std::vector<double> out;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) {
    const size_t begin = svg.find(" points=\"", at) + 9, end = svg.find('"', begin);
    std::istringstream in(svg.substr(begin, end - begin));
    std::string pair;
    size_t n = 0;
    while (in >> pair) {
      const size_t comma = pair.find(',');
      out.push_back(std::strtod(pair.substr(0, comma).c_str(), nullptr));
      out.push_back(comma == std::string::npos ? NAN : std::strtod(pair.substr(comma + 1).c_str(), nullptr));
      ++n;
    }
    counts->push_back(n);
  }
  return out;
}

}  // namespace

TEST_CASE("huge finite values plot at finite coordinates; long runs are drawn per pixel column") {
  Run huge{.label = "huge", .source = "a", .curves = {{"train_loss", {{0, 1e308, 1.7e308}, {-1e308, 1e308, 5}}}},
           .warnings = {}};
  std::vector<size_t> counts;
  std::string svg = render_svg({huge}, PlotOptions{.metrics = {"loss"}, .x = XAxis::Iteration, .title = "", .width = 400});
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
  for (double v : polyline_coordinates(svg, &counts)) CHECK(std::isfinite(v));
  CHECK(counts == std::vector<size_t>{3});
  const Axis flat = nice_axis(1e308, 1e308, 5);
  CHECK((std::isfinite(flat.lo) && std::isfinite(flat.hi) && flat.hi > flat.lo));

  Curve c;  // 300k iterations: a sawtooth whose extremes are at known places
  for (int i = 0; i < 300000; ++i) {
    c.x.push_back(i + 1);
    c.y.push_back(i == 123456 ? 9.0 : i == 234567 ? -9.0 : (i % 7) * 0.1);
  }
  Run long_run{.label = "long", .source = "b", .curves = {{"train_loss", c}}, .warnings = {}};
  svg = render_svg({long_run}, PlotOptions{.metrics = {"loss"}, .x = XAxis::Iteration, .title = "", .width = 900});
  counts.clear();
  const std::vector<double> xy = polyline_coordinates(svg, &counts);
  REQUIRE(counts.size() == 1);
  CHECK(counts[0] <= 2 * 900);  // at most two points per pixel column
  CHECK(svg.size() < 200000);
  CHECK(svg.find(" 9 ") != std::string::npos);   // both extremes are kept in data-y
  CHECK(svg.find(" -9 ") != std::string::npos);
  for (double v : xy) CHECK(std::isfinite(v));
}
