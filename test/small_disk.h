// A full disk for tests: a forked child makes `dir` a small tmpfs in a private
// mount namespace (as root, or in a user namespace) and runs a function there.
// The mount lives and dies with the child, so it is gone on every path out of
// the test. Where no namespace may be made, the child exits kNoSmallDisk (77)
// and the caller skips (DS_SKIP).
#pragma once
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>

namespace ds::test {

inline constexpr int kNoSmallDisk = 77;

namespace small_disk_detail {

inline bool write_text(const char* path, const std::string& s) {
  const int fd = ::open(path, O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  ::close(fd);
  return ok;
}

// A private mount namespace in which `dir` is a tmpfs of `kib` KiB.
inline bool mount_small_tmpfs(const std::filesystem::path& dir, int kib) {
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  if (::unshare(CLONE_NEWNS) != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
    write_text("/proc/self/setgroups", "deny");
    if (!write_text("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !write_text("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
      return false;
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  const std::string opts = "size=" + std::to_string(kib) + "k";
  return ::mount("none", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
}

}  // namespace small_disk_detail

// Runs fn() in a child in which `dir` is a `kib` KiB tmpfs and returns the
// child's exit code: fn()'s result, kNoSmallDisk when the mount is not
// allowed, 2 when fn() throws (printed), 128+signal when it dies.
inline int run_on_small_disk(const std::filesystem::path& dir, int kib, const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    int code = kNoSmallDisk;
    if (small_disk_detail::mount_small_tmpfs(dir, kib)) {
      try {
        code = fn();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tmpfs of %d KiB: unexpected exception: %s\n", kib, e.what());
        code = 2;
      }
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return 2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// What a swap file's error on a full small tmpfs says, as a child exit code
// for run_on_small_disk: kDiskFull (one line naming `dir`, the disk full),
// kNoDirectIo (this kernel's tmpfs refuses O_DIRECT: that fault's message
// instead), 2 anything else (printed).
inline constexpr int kDiskFull = 1, kNoDirectIo = 3;
inline int classify_swap_error(const std::string& e, const std::string& dir) {
  if (e.find(dir) == std::string::npos || e.find('\n') != std::string::npos) {
    std::fprintf(stderr, "unexpected message: %s\n", e.c_str());
    return 2;
  }
  if (e.find("No space left on device") != std::string::npos || e.find("disk is full") != std::string::npos)
    return kDiskFull;
  if (e.find("without O_DIRECT") != std::string::npos) return kNoDirectIo;
  std::fprintf(stderr, "unexpected message: %s\n", e.c_str());
  return 2;
}

}  // namespace ds::test
