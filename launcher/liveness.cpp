// LivenessWatch (liveness.h): heartbeat files in a private directory, process
// states from /proc, and the choice of the rank to blame.
#include "launcher/liveness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "launcher/process.h"

namespace ds::launch {
namespace {

// Where the heartbeat directories live: /dev/shm (memory: a touch costs no
// disk write) when usable, else $TMPDIR, else /tmp.
std::vector<std::string> base_dirs() {
  std::vector<std::string> out = {"/dev/shm"};
  const char* t = std::getenv("TMPDIR");
  if (t && *t == '/') out.push_back(t);
  out.push_back("/tmp");
  return out;
}

std::string prefix_of(pid_t pid) { return fmt::format("dsrun-hb-{}-", pid); }

// Removes the rank_* files of a heartbeat directory we own, then the directory.
void remove_dir(const std::string& dir) {
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) return;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "rank_", 5) == 0) unlink((dir + "/" + e->d_name).c_str());
    closedir(d);
  }
  rmdir(dir.c_str());
}

long long mtime_ns(const struct stat& st) { return st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec; }

}  // namespace

LivenessWatch::LivenessWatch(double timeout_s) : timeout_(timeout_s), period_(std::min(1.0, timeout_s / 4)) {
  if (!on()) return;
  remove_stale_heartbeat_dirs(600);
  std::string last_error;
  for (const auto& base : base_dirs()) {
    std::string templ = fmt::format("{}/{}XXXXXX", base, prefix_of(getpid()));
    if (mkdtemp(templ.data())) {
      dir_ = templ;
      return;
    }
    last_error = fmt::format("{}: {}", base, std::strerror(errno));
  }
  throw SpawnError(fmt::format("--heartbeat_timeout: cannot create a directory for the heartbeat files ({})",
                               last_error));
}

LivenessWatch::~LivenessWatch() {
  if (!dir_.empty()) remove_dir(dir_);
}

std::string LivenessWatch::add_rank(int rank) {
  ranks_.push_back({});
  if (!on()) return "";
  Rank& r = ranks_.back();
  r.path = fmt::format("{}/rank_{}", dir_, rank);
  const int fd = open(r.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw SpawnError(fmt::format("cannot create the heartbeat file '{}': {}", r.path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) == 0) r.mtime_ns = mtime_ns(st);
  close(fd);
  return r.path;
}

void LivenessWatch::started(size_t index, pid_t pid, double now) {
  Rank& r = ranks_.at(index);
  r.pid = pid;
  r.live = true;
  r.last_beat = now;
  if (next_check_ == 0) next_check_ = now + period_;
}

void LivenessWatch::exited(size_t index) { ranks_.at(index).live = false; }

int LivenessWatch::ms_to_next_check(double now) const {
  if (!on()) return -1;
  return std::max(0, static_cast<int>(std::ceil((next_check_ - now) * 1000)));
}

void LivenessWatch::observe(Rank& r, double now) {
  const char state = process_state(r.pid);
  if (state == 't') {  // a debugger holds it: not judged while it does
    r.stopped_since = -1;
    r.last_beat = now;
    return;
  }
  if (state == 'T' || state == 'Z') {
    if (r.stopped_since < 0) r.stopped_since = now;
  } else {
    r.stopped_since = -1;
  }
  struct stat st {};
  if (lstat(r.path.c_str(), &st) != 0) {  // removed by the rank: paused
    r.last_beat = now;
    return;
  }
  if (mtime_ns(st) != r.mtime_ns) {
    r.mtime_ns = mtime_ns(st);
    r.opted_in = true;
    r.last_beat = now;
  }
}

std::optional<Stall> LivenessWatch::check(double now) {
  if (!on() || now < next_check_) return std::nullopt;
  next_check_ = now + period_;
  const Rank* stopped = nullptr;
  const Rank* silent = nullptr;
  bool any_stall = false;
  for (Rank& r : ranks_) {
    if (!r.live) continue;
    observe(r, now);
    if (r.stopped_since >= 0) {
      any_stall |= now - r.stopped_since >= timeout_;
      if (!stopped || r.stopped_since < stopped->stopped_since) stopped = &r;
    }
    if (r.opted_in && now - r.last_beat >= timeout_) {
      any_stall = true;
      if (!silent || r.last_beat < silent->last_beat) silent = &r;
    }
  }
  if (!any_stall) return std::nullopt;
  Stall s;
  if (stopped) {
    s.index = static_cast<size_t>(stopped - ranks_.data());
    const char state = process_state(stopped->pid);
    s.why = fmt::format("has been {} for {:.1f} s, over --heartbeat_timeout {}",
                        state == 'Z' ? "a zombie with live threads (process state Z)"
                                     : "stopped (process state T: SIGSTOP or SIGTSTP)",
                        now - stopped->stopped_since, timeout_);
  } else {
    s.index = static_cast<size_t>(silent - ranks_.data());
    s.why = fmt::format("touched no heartbeat for {:.1f} s, over --heartbeat_timeout {}: it is hung or deadlocked",
                        now - silent->last_beat, timeout_);
  }
  return s;
}

void remove_stale_heartbeat_dirs(double quiet_s) {
  const std::string prefix = "dsrun-hb-";
  const long long now = static_cast<long long>(time(nullptr)) * 1000000000LL;
  for (const auto& base : base_dirs()) {
    DIR* d = opendir(base.c_str());
    if (!d) continue;
    std::vector<std::string> stale;
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
      char* end = nullptr;
      const long pid = std::strtol(e->d_name + prefix.size(), &end, 10);
      if (pid <= 0 || !end || *end != '-') continue;
      if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
      const std::string dir = base + "/" + e->d_name;
      struct stat st {};
      if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) continue;
      long long newest = mtime_ns(st);
      if (DIR* h = opendir(dir.c_str())) {
        while (dirent* f = readdir(h)) {
          struct stat fs {};
          if (std::strncmp(f->d_name, "rank_", 5) == 0 && lstat((dir + "/" + f->d_name).c_str(), &fs) == 0)
            newest = std::max(newest, mtime_ns(fs));
        }
        closedir(h);
      }
      if (static_cast<double>(now - newest) / 1e9 >= quiet_s) stale.push_back(dir);
    }
    closedir(d);
    for (const auto& dir : stale) remove_dir(dir);
  }
}

void remove_heartbeat_dirs_of(pid_t pid) {
  const std::string prefix = prefix_of(pid);
  for (const auto& base : base_dirs()) {
    DIR* d = opendir(base.c_str());
    if (!d) continue;
    std::vector<std::string> found;
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back(base + "/" + e->d_name);
    closedir(d);
    for (const auto& dir : found) remove_dir(dir);
  }
}

}  // namespace ds::launch
