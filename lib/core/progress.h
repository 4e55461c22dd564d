// Progress lines for long operations (dsprep tokenizing, dsconvert, checkpoint
// saves and loads): how much is done (bytes or a count), the rate, the elapsed
// time and the ETA, throttled. On a terminal one status line is redrawn in
// place (carriage return) at most every `period_s`; otherwise (a log file, a
// pipe) a plain line is printed per interval: every `every` units when set,
// else every `line_period_s`. The format is one " | "-separated field each:
//   LABEL | 3.20 GB of 12.00 GB (26.7%) | 512.00 MB/s | elapsed 0:00:06 | ETA 0:00:17
// The environment variable DS_PROGRESS overrides the style: "off" (silent),
// "lines" (plain lines even on a terminal) or "all" (a plain line for every
// update, nothing held back: for tests and debugging).
// docs/plotting.md ("Progress lines") describes it.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ds {

enum class ProgressStyle { Auto, Terminal, Lines, Off };  // Auto: Terminal when `stream` is a terminal
enum class ProgressUnit { Bytes, Count };

struct ProgressOptions {
  std::string label;                  // e.g. "dsprep: tokenizing"
  ProgressUnit unit = ProgressUnit::Bytes;
  std::string count_name = "items";   // what a Count unit (or the side count) counts: "documents"
  int64_t total = 0;                  // 0: unknown (no percentage, ETA unknown)
  ProgressStyle style = ProgressStyle::Auto;
  double period_s = 2;                // Terminal: the least seconds between redraws
  double line_period_s = 5;           // Lines: seconds between lines when `every` is 0
  int64_t every = 0;                  // Lines: a line whenever the side count (else done) passes a multiple
  double quiet_s = 0;                 // nothing before this many seconds: a quick operation stays silent
  std::FILE* stream = stderr;
};

// "H:MM:SS" (hours grow past 99 as needed); negative or non-finite -> "unknown".
std::string format_duration(double seconds);
// "512 B", "3.20 KB", "4.19 MB", "12.00 GB" (powers of 1000).
std::string format_bytes(double bytes);
// One progress line (no newline). `count` < 0: no side count.
std::string format_progress(const ProgressOptions& o, int64_t done, int64_t count, double elapsed_s);

class Progress {
 public:
  explicit Progress(ProgressOptions o);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // ends a status line left open on a terminal

  // `done` units so far (monotone); `count` an optional side count (documents).
  void update(int64_t done, int64_t count = -1);
  void add(int64_t delta) { update(done_ + delta, count_); }
  // A total learnt on the way (a checkpoint load finds the shards it reads one by one).
  void set_total(int64_t total) { o_.total = total; }
  int64_t total() const { return o_.total; }
  // A last line (done, rate, elapsed) if any line was printed before.
  void finish();
  double seconds() const;
  int64_t done() const { return done_; }
  ProgressStyle style() const { return style_; }  // Auto resolved

 private:
  void print();
  ProgressOptions o_;
  ProgressStyle style_;
  std::chrono::steady_clock::time_point t0_, last_;
  int64_t done_ = 0, count_ = -1, next_every_ = 0;
  bool printed_ = false, open_line_ = false, finished_ = false;
};

}  // namespace ds
