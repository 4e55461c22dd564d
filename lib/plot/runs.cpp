// Reading a run's curves: CSV monitor files and TensorBoard event files.
#include "lib/plot/runs.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/ckpt/crc32c.h"
#include "lib/core/decimal.h"
#include "lib/core/error.h"

namespace fs = std::filesystem;

namespace ds::plot {

XAxis parse_x_axis(const std::string& s) {
  if (s == "iteration") return XAxis::Iteration;
  if (s == "samples") return XAxis::Samples;
  if (s == "tokens") return XAxis::Tokens;
  DS_USER_ERROR("--x must be iteration, samples or tokens, got '{}'", s);
}

const char* x_axis_name(XAxis x) {
  switch (x) {
    case XAxis::Iteration: return "iteration";
    case XAxis::Samples: return "consumed samples";
    case XAxis::Tokens: return "consumed tokens";
  }
  return "";
}

namespace {

std::string slurp(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  DS_USER_CHECK(in.good(), "{} '{}' cannot be opened: {}", what, path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  DS_USER_CHECK(!in.bad(), "{} '{}' cannot be read", what, path);
  return ss.str();
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = line.find(sep, start);
    out.push_back(line.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

// A CSV monitor value: a plain decimal, or nan / inf as the monitor writes a
// non-finite loss; the count columns (iteration, consumed_samples) are
// non-negative integers. No hex, no spaces.
bool parse_csv_value(const std::string& t, bool count, double& v) {
  if (count) {
    const std::optional<int64_t> n = parse_decimal_int(t);
    v = n ? static_cast<double>(*n) : 0.0;
    return n && *n >= 0;
  }
  if (t == "nan" || t == "-nan") v = std::nan("");
  else if (t == "inf" || t == "-inf") v = t[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  else if (const std::optional<double> d = parse_decimal(t)) v = *d;
  else return false;
  return true;
}

bool count_column(const std::string& name) { return name == "iteration" || name == "consumed_samples"; }

// Points keyed by x: a later value for the same x (a resumed run repeating
// iterations) replaces the earlier one.
using Points = std::map<double, double>;

Curve to_curve(const Points& p) {
  Curve c;
  for (const auto& [x, y] : p) {
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    c.x.push_back(x);
    c.y.push_back(y);
  }
  return c;
}

int column(const CsvTable& t, const char* name) {
  auto it = std::find(t.columns.begin(), t.columns.end(), name);
  return it == t.columns.end() ? -1 : static_cast<int>(it - t.columns.begin());
}

// consumed samples at an iteration, from the training rows (linear between
// logged iterations: exact while the global batch is constant).
double samples_at(const Points& samples, double iteration, const std::string& file) {
  DS_USER_CHECK(!samples.empty(), "'{}': no training rows to map iterations to samples/tokens", file);
  auto hi = samples.lower_bound(iteration);
  if (hi != samples.end() && hi->first == iteration) return hi->second;
  if (hi == samples.begin()) return hi->second * iteration / hi->first;  // before the first row: from 0
  auto lo = std::prev(hi);
  if (hi == samples.end()) return lo->second * iteration / lo->first;
  return lo->second + (hi->second - lo->second) * (iteration - lo->first) / (hi->first - lo->first);
}

// False, with a warning, for an empty file (no header: its run could not write one).
bool csv_to_read(const fs::path& file, Run& run) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return false;
  if (!fs::is_regular_file(file, ec) || fs::file_size(file, ec) != 0 || ec) return true;
  run.warnings.push_back(fmt::format("'{}' is empty (not even a header line: was the disk full?); "
                                     "its curves are left out", file.string()));
  return false;
}

void load_csv_dir(const fs::path& dir, const LoadOptions& o, Run& run) {
  const fs::path train = dir / "train.csv", valid = dir / "valid.csv";
  DS_USER_CHECK(o.x != XAxis::Tokens || o.seq_length > 0,
                "'{}': CSV monitor files count samples; --x tokens needs --seq-length (the run's seq_length)",
                dir.string());
  const double scale = o.x == XAxis::Tokens ? static_cast<double>(o.seq_length) : 1.0;
  Points samples;  // iteration -> consumed samples
  if (csv_to_read(train, run)) {
    const CsvTable t = read_csv(train.string());
    const int it = column(t, "iteration"), cs = column(t, "consumed_samples");
    DS_USER_CHECK(it >= 0 && cs >= 0 && column(t, "loss") >= 0,
                  "'{}' is not a dstrain train.csv: its header needs iteration, consumed_samples and loss",
                  train.string());
    for (const auto& r : t.rows) samples[r[it]] = r[cs];
    const std::pair<const char*, const char*> keys[] = {{"loss", "train_loss"},      {"lr", "lr"},
                                                        {"grad_norm", "grad_norm"}, {"loss_scale", "loss_scale"},
                                                        {"tokens_per_s", "tokens_per_s"}};
    for (const auto& [col, key] : keys) {
      const int c = column(t, col);
      if (c < 0) continue;
      Points p;
      for (const auto& r : t.rows) p[o.x == XAxis::Iteration ? r[it] : r[cs] * scale] = r[c];
      run.curves[key] = to_curve(p);
    }
  }
  if (csv_to_read(valid, run)) {
    const CsvTable t = read_csv(valid.string());
    const int it = column(t, "iteration"), l = column(t, "loss");
    DS_USER_CHECK(it >= 0 && l >= 0, "'{}' is not a dstrain valid.csv: its header needs iteration and loss",
                  valid.string());
    Points p;
    for (const auto& r : t.rows)
      p[o.x == XAxis::Iteration ? r[it] : samples_at(samples, r[it], train.string()) * scale] = r[l];
    run.curves["valid_loss"] = to_curve(p);
  }
}

// Megatron(-DeepSpeed) scalar tags -> curve keys; the x axis comes from the
// " vs samples" / " vs tokens" suffix.
const char* curve_key_of_tag(const std::string& base) {
  static const std::pair<const char*, const char*> kTags[] = {
      {"lm-loss-training/lm loss", "train_loss"},
      {"lm loss", "train_loss"},
      {"lm-loss-validation/lm loss validation", "valid_loss"},
      {"lm loss validation", "valid_loss"},
      {"learning-rate/learning-rate", "lr"},
      {"learning-rate", "lr"},
      {"grad-norm/grad-norm", "grad_norm"},
      {"grad-norm", "grad_norm"},
      {"loss-scale/loss-scale", "loss_scale"},
      {"loss-scale", "loss_scale"},
      {"reward", "reward"},  // dschat ppo's (DeepSpeed-Chat's step 3) tags
      {"actor_loss", "actor_loss"},
      {"critic_loss", "critic_loss"},
  };
  for (const auto& [tag, key] : kTags)
    if (base == tag) return key;
  return nullptr;
}

void load_event_files(const std::vector<fs::path>& files, const LoadOptions& o, Run& run) {
  const std::string suffix = o.x == XAxis::Samples ? " vs samples" : o.x == XAxis::Tokens ? " vs tokens" : "";
  std::map<std::string, Points> points;
  for (const fs::path& f : files) {  // in name order (the creation time): a resumed run's later file wins
    for (const Scalar& s : read_event_file(f.string())) {
      const bool has_vs = s.tag.find(" vs ") != std::string::npos;
      std::string base = s.tag;
      if (!suffix.empty()) {
        if (s.tag.size() <= suffix.size() || s.tag.compare(s.tag.size() - suffix.size(), suffix.size(), suffix) != 0)
          continue;
        base = s.tag.substr(0, s.tag.size() - suffix.size());
      } else if (has_vs) {
        continue;
      }
      if (const char* key = curve_key_of_tag(base)) points[key][static_cast<double>(s.step)] = s.value;
    }
  }
  for (const auto& [key, p] : points) run.curves[key] = to_curve(p);
}

bool is_event_file(const fs::path& p) {
  return p.filename().string().rfind("events.out.tfevents.", 0) == 0 && fs::is_regular_file(p);
}

std::vector<fs::path> event_files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_event_file(e.path())) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The run's label: the directory's name (p empty: the current directory,
// the parent of a bare file name).
std::string name_of(const fs::path& p) {
  const fs::path a = fs::absolute(p.empty() ? fs::path(".") : p).lexically_normal();
  const std::string n = a.filename().string();
  return n.empty() ? a.parent_path().filename().string() : n;
}

}  // namespace

CsvTable read_csv(const std::string& path) {
  const std::string text = slurp(path, "CSV file");
  CsvTable t;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const bool complete = end != std::string::npos;
    if (!complete) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string> fields = split(line, ',');
    if (t.columns.empty()) {
      t.columns = fields;
      continue;
    }
    std::vector<double> row(fields.size());
    bool ok = fields.size() == t.columns.size();
    for (size_t i = 0; ok && i < fields.size(); ++i) ok = parse_csv_value(fields[i], count_column(t.columns[i]), row[i]);
    if (!ok && !complete) break;  // a last line still being written by a live run
    DS_USER_CHECK(fields.size() == t.columns.size(), "'{}' line {}: {} values, the header has {} columns", path,
                  line_no, fields.size(), t.columns.size());
    for (size_t i = 0; i < fields.size(); ++i)
      DS_USER_CHECK(parse_csv_value(fields[i], count_column(t.columns[i]), row[i]),
                    "'{}' line {}: column '{}' holds '{}', not {}", path, line_no, t.columns[i], fields[i],
                    count_column(t.columns[i]) ? "a non-negative decimal integer" : "a decimal number");
    t.rows.push_back(std::move(row));
  }
  DS_USER_CHECK(!t.columns.empty(), "CSV file '{}' is empty (no header line)", path);
  return t;
}

Run load_run(const std::string& path, const LoadOptions& o) {
  const fs::path p(path);
  DS_USER_CHECK(fs::exists(p), "input '{}' does not exist (give a run directory, a train.csv/valid.csv or an "
                "events.out.tfevents.* file)", path);
  Run run;
  run.source = path;
  if (fs::is_directory(p)) {
    run.label = name_of(p);
    if (fs::exists(p / "train.csv") || fs::exists(p / "valid.csv")) {
      load_csv_dir(p, o, run);
    } else if (auto events = event_files_in(p); !events.empty()) {
      load_event_files(events, o, run);
    } else {
      std::vector<fs::path> jobs;  // csv_monitor's OUTPUT_PATH: one directory per job name
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_directory() && fs::exists(e.path() / "train.csv")) jobs.push_back(e.path());
      DS_USER_CHECK(!jobs.empty(), "input '{}' holds no train.csv, valid.csv or events.out.tfevents.* file", path);
      std::sort(jobs.begin(), jobs.end());
      DS_USER_CHECK(jobs.size() == 1, "input '{}' holds {} CSV monitor jobs ({}, ...): give the one to plot", path,
                    jobs.size(), jobs[0].filename().string());
      run.label = name_of(jobs[0]);
      load_csv_dir(jobs[0], o, run);
    }
  } else if (is_event_file(p)) {
    run.label = name_of(p.parent_path());
    load_event_files({p}, o, run);
  } else {
    const std::string name = p.filename().string();
    DS_USER_CHECK(name.size() > 4 && name.compare(name.size() - 4, 4, ".csv") == 0,
                  "input '{}' is neither a directory, a .csv monitor file nor an events.out.tfevents.* file", path);
    run.label = name_of(p.parent_path());
    load_csv_dir(p.parent_path().empty() ? fs::path(".") : p.parent_path(), o, run);
  }
  const bool any = std::any_of(run.curves.begin(), run.curves.end(), [](const auto& kv) { return !kv.second.x.empty(); });
  DS_USER_CHECK(any, "input '{}' holds no values to plot (against {})", path, x_axis_name(o.x));
  return run;
}

}  // namespace ds::plot
