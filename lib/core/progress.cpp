// Progress lines: formatting (pure) and the throttled printer.
#include "lib/core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>

namespace ds {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "unknown";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string format_bytes(double b) {
  if (b < 1e3) return fmt::format("{:.0f} B", b);
  if (b < 1e6) return fmt::format("{:.2f} KB", b / 1e3);
  if (b < 1e9) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

std::string format_progress(const ProgressOptions& o, int64_t done, int64_t count, double elapsed_s) {
  const bool bytes = o.unit == ProgressUnit::Bytes;
  const double rate = elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0;
  std::string line = o.label;
  auto field = [&line](const std::string& f) { line += (line.empty() ? "" : " | ") + f; };
  if (count >= 0)
    field(fmt::format("{} {} ({:.0f}/s)", count, o.count_name, elapsed_s > 0 ? count / elapsed_s : 0.0));
  const std::string amount = bytes ? format_bytes(static_cast<double>(done)) : fmt::format("{} {}", done, o.count_name);
  if (o.total > 0) {
    const std::string of = bytes ? format_bytes(static_cast<double>(o.total)) : fmt::format("{} {}", o.total, o.count_name);
    field(fmt::format("{} of {} ({:.1f}%)", amount, of, 100.0 * std::min(done, o.total) / o.total));
  } else {
    field(amount);
  }
  field(bytes ? format_bytes(rate) + "/s" : fmt::format("{:.1f} {}/s", rate, o.count_name));
  field("elapsed " + format_duration(elapsed_s));
  const double left = o.total > 0 && rate > 0 ? static_cast<double>(std::max<int64_t>(o.total - done, 0)) / rate
                      : o.total > 0 && done >= o.total ? 0.0
                                                       : -1.0;
  field("ETA " + format_duration(left));
  return line;
}

Progress::Progress(ProgressOptions o) : o_(std::move(o)), style_(o_.style) {
  const char* env = std::getenv("DS_PROGRESS");
  const std::string mode = env ? env : "";
  if (mode == "off") style_ = ProgressStyle::Off;
  if (style_ != ProgressStyle::Off && (mode == "lines" || mode == "all")) style_ = ProgressStyle::Lines;
  if (style_ != ProgressStyle::Off && mode == "all") {
    o_.every = 0;
    o_.line_period_s = 0;
    o_.quiet_s = 0;
  }
  if (style_ == ProgressStyle::Auto)
    style_ = o_.stream && isatty(fileno(o_.stream)) ? ProgressStyle::Terminal : ProgressStyle::Lines;
  if (!o_.stream) style_ = ProgressStyle::Off;
  t0_ = last_ = std::chrono::steady_clock::now();
  next_every_ = o_.every;
}

Progress::~Progress() {
  if (open_line_) std::fputc('\n', o_.stream);
}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Progress::update(int64_t done, int64_t count) {
  done_ = done;
  count_ = count;
  if (style_ == ProgressStyle::Off || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - t0_).count() < o_.quiet_s) return;
  const double since = std::chrono::duration<double>(now - last_).count();
  bool due;
  if (style_ == ProgressStyle::Terminal) {
    due = since >= o_.period_s;
  } else if (o_.every > 0) {
    const int64_t measure = count >= 0 ? count : done;
    due = measure >= next_every_;
    if (due) next_every_ = (measure / o_.every + 1) * o_.every;
  } else {
    due = since >= o_.line_period_s;
  }
  if (!due) return;
  last_ = now;
  print();
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (style_ == ProgressStyle::Off || !printed_) return;
  print();
  if (open_line_) {
    std::fputc('\n', o_.stream);
    open_line_ = false;
  }
  std::fflush(o_.stream);
}

void Progress::print() {
  const std::string line = format_progress(o_, done_, count_, seconds());
  if (style_ == ProgressStyle::Terminal) {
    std::fprintf(o_.stream, "\r%s\x1b[K", line.c_str());  // redraw in place, clear the rest
    open_line_ = true;
  } else {
    std::fprintf(o_.stream, "%s\n", line.c_str());
  }
  std::fflush(o_.stream);
  printed_ = true;
}

}  // namespace ds
