// Heartbeat (heartbeat.h): touch, pause by removal, recreate on the next beat.
#include "lib/core/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

namespace ds {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr int64_t kMinGapNs = 100'000'000;  // 100 ms between touches

}  // namespace

Heartbeat::Heartbeat() {
  const char* p = std::getenv(kHeartbeatFileEnv);
  if (p) path_ = p;
}

Heartbeat::Heartbeat(std::string path) : path_(std::move(path)) {}

void Heartbeat::beat() {
  if (path_.empty()) return;
  const int64_t now = steady_ns();
  if (started_ && !paused_ && now - last_ns_ < kMinGapNs) return;
  last_ns_ = now;
  started_ = true;
  if (paused_) {
    // Created again in the agent's private directory; O_NOFOLLOW: never through a link.
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    paused_ = false;
  }
  utimensat(AT_FDCWD, path_.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

void Heartbeat::pause() {
  if (path_.empty() || !started_ || paused_) return;
  unlink(path_.c_str());
  paused_ = true;
}

}  // namespace ds
