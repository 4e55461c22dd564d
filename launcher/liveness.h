// The agent's watch over its ranks (docs/dsrun.md, "Hung ranks"): a rank that
// stays stopped (SIGSTOP, SIGTSTP: process state T) or a zombie with live
// threads for --heartbeat_timeout seconds, or that opted in to the heartbeat
// (touched its DS_HEARTBEAT_FILE once) and then left it untouched that long,
// is stalled. A rank stopped by a debugger (ptrace stop) is not judged while
// it is stopped. The agent polls; check() says which rank to blame.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ds::launch {

struct Stall {
  size_t index = 0;  // which watched rank (order of add_rank)
  std::string why;   // "has been stopped (...) for 3.1 s, over --heartbeat_timeout 3", ...
};

class LivenessWatch {
 public:
  // timeout_s 0: off (no files, no checks). Otherwise creates a private
  // directory (0700) for the heartbeat files, under /dev/shm when it can.
  explicit LivenessWatch(double timeout_s);
  ~LivenessWatch();  // removes the heartbeat files and their directory
  LivenessWatch(const LivenessWatch&) = delete;
  LivenessWatch& operator=(const LivenessWatch&) = delete;

  bool on() const { return timeout_ > 0; }
  // Creates the heartbeat file of global rank `rank` (empty, 0600) and
  // returns its path for DS_HEARTBEAT_FILE ("" when off).
  std::string add_rank(int rank);
  void started(size_t index, pid_t pid, double now);
  void exited(size_t index);
  // Milliseconds until the next check is due (for poll), -1 when off.
  int ms_to_next_check(double now) const;
  // When a check is due, looks at every live rank: the stall to act on, if any.
  // A stopped rank is blamed before one whose heartbeat went stale (its
  // peers usually wait on it), else the one silent longest.
  std::optional<Stall> check(double now);

 private:
  struct Rank {
    std::string path;
    pid_t pid = 0;
    bool live = false;
    bool opted_in = false;
    long long mtime_ns = -1;  // last seen
    double last_beat = 0;     // when the last change was seen
    double stopped_since = -1;
  };
  void observe(Rank& r, double now);

  double timeout_;
  double period_;
  double next_check_ = 0;
  std::string dir_;
  std::vector<Rank> ranks_;
};

// Removes what a LivenessWatch of process `pid` left when that process was
// killed outright (called by the guard after its worker died).
void remove_heartbeat_dirs_of(pid_t pid);
// The heartbeat directories (ours) of dsrun processes that no longer exist
// and whose files nobody touched for `quiet_s` seconds: what an agent killed
// together with its guard (SIGKILL to the process group) left behind.
// LivenessWatch removes them when it starts (quiet_s 600; a live job in
// another pid namespace sharing /dev/shm touches its files far more often).
void remove_stale_heartbeat_dirs(double quiet_s);

}  // namespace ds::launch
