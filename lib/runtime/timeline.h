// Timeline: begin/end spans of compute units and collectives of a training
// step, recorded from any thread (the compute thread and the groups'
// communication threads), written as a Chrome trace (chrome://tracing,
// Perfetto) by `dstrain --profile`, and read by the overlap tests. Disabled
// (the default), every call is one branch.
// Collectives record three times: issued (the compute thread handed it to the
// group), begin and end (on the communication thread for Gloo; for NCCL the
// host enqueue, since the op itself runs on the GPU).
#pragma once
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace ds {

class Timeline {
 public:
  struct Event {
    std::string name;  // "backward unit 3", "all_reduce bucket 2"
    std::string cat;   // "compute" | "comm"
    int tid = 0;       // 0: compute thread, 1: communication
    double issue_us = 0, begin_us = 0, end_us = 0;  // since the timeline's epoch
  };

  void enable(bool on) { on_ = on; }
  bool enabled() const { return on_; }
  double now_us() const;
  double us(std::chrono::steady_clock::time_point t) const;  // t since the epoch
  void add(Event e);
  std::vector<Event> events();
  void clear();
  // Chrome trace JSON ("X" events, microseconds); UserError naming the path if
  // it cannot be written.
  void write_chrome_trace(const std::string& path, int rank);

 private:
  bool on_ = false;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace ds
