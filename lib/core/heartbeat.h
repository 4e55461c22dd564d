// The rank side of dsrun's liveness watch (docs/dsrun.md, "Hung ranks"). dsrun
// gives each rank a heartbeat file in DS_HEARTBEAT_FILE; a rank that touches
// it once has opted in, and from then on its agent stops the job when the file
// is older than --heartbeat_timeout. Removing the file pauses that judgement
// (a long phase in which the rank may wait on others: a checkpoint save, the
// final barrier); the next beat creates it again. Without the variable (not
// under dsrun, or the watch is off) every call does nothing.
#pragma once
#include <cstdint>
#include <string>

namespace ds {

inline constexpr const char* kHeartbeatFileEnv = "DS_HEARTBEAT_FILE";

class Heartbeat {
 public:
  // path "": disabled. The default reads DS_HEARTBEAT_FILE.
  Heartbeat();
  explicit Heartbeat(std::string path);

  // Touches the file (at most every 100 ms; at once after a pause): opts in.
  void beat();
  // Beats only once the rank has opted in (progress inside a step, which
  // must not opt in before the first step is done).
  void beat_if_started() {
    if (started_) beat();
  }
  // Removes the file until the next beat (nothing before the first beat).
  void pause();
  bool started() const { return started_; }

  // Pauses for a scope, then beats again.
  class Paused {
   public:
    explicit Paused(Heartbeat& hb) : hb_(hb), was_started_(hb.started()) { hb_.pause(); }
    ~Paused() {
      if (was_started_) hb_.beat();
    }
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    Heartbeat& hb_;
    bool was_started_;
  };

 private:
  std::string path_;
  bool started_ = false, paused_ = false;
  int64_t last_ns_ = 0;
};

}  // namespace ds
