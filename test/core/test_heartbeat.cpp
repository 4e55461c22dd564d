// The rank side of dsrun's liveness watch (lib/core/heartbeat.h) on a real
// file: the first beat opts in, pause removes the file, the next beat creates
// it again, beats inside a step wait for the first step, no path does nothing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "lib/core/heartbeat.h"

namespace {

long long mtime_ns(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec : -1;
}

struct TempFile {
  std::string dir, path;
  TempFile() {
    char templ[] = "/tmp/ds-heartbeat-XXXXXX";
    dir = mkdtemp(templ);
    path = dir + "/rank_0";
    close(creat(path.c_str(), 0600));
    struct timespec old[2] = {{1, 0}, {1, 0}};  // far in the past: any touch changes it
    utimensat(AT_FDCWD, path.c_str(), old, 0);
  }
  ~TempFile() {
    unlink(path.c_str());
    rmdir(dir.c_str());
  }
};

}  // namespace

TEST_CASE("heartbeat: beat, pause and resume on a real file", "[heartbeat]") {
  TempFile f;
  ds::Heartbeat hb(f.path);
  const long long before = mtime_ns(f.path);
  hb.beat_if_started();  // inside the first step: not yet
  CHECK(mtime_ns(f.path) == before);
  CHECK_FALSE(hb.started());
  hb.beat();
  CHECK(hb.started());
  CHECK(mtime_ns(f.path) > before);
  {
    const ds::Heartbeat::Paused paused(hb);
    CHECK(mtime_ns(f.path) == -1);  // removed: the agent does not judge it
  }
  CHECK(mtime_ns(f.path) > before);  // created again by the beat at the end of the pause
}

TEST_CASE("heartbeat: a pause before the first beat does nothing; no path, no file", "[heartbeat]") {
  TempFile f;
  ds::Heartbeat hb(f.path);
  { const ds::Heartbeat::Paused paused(hb); }
  CHECK(mtime_ns(f.path) > 0);
  CHECK_FALSE(hb.started());
  ds::Heartbeat off("");
  off.beat();
  off.pause();
  CHECK(off.started() == false);
}
