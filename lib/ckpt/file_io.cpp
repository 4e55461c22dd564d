// Stale temporaries, file checksums, bounded reads and output-directory checks.
#include "lib/ckpt/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lib/ckpt/crc32c.h"
#include "lib/core/error.h"
#include "lib/core/progress.h"

namespace ds {
namespace {

// The pid of a temporary's name NAME.tmp.<pid> / NAME.tmp-<pid> (NAME equal
// to `stem` when one is given), or 0 when the name is not one.
pid_t temporary_pid(const std::string& name, const std::string& stem) {
  size_t at = name.rfind(".tmp");
  if (at == std::string::npos || at + 5 >= name.size() || (name[at + 4] != '.' && name[at + 4] != '-')) return 0;
  if (!stem.empty() && name.compare(0, at, stem) != 0) return 0;
  if (stem.empty() && at == 0) return 0;
  const std::string digits = name.substr(at + 5);
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return 0;
  return static_cast<pid_t>(std::stol(digits));
}

void remove_stale_in(const std::filesystem::path& dir, const std::string& stem, bool into_step_dirs,
                     std::vector<std::string>& removed) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    const pid_t pid = temporary_pid(name, stem);
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) == -1 && errno == ESRCH) {
      if (fs::remove_all(p, ec) > 0 && !ec) removed.push_back(p.string());
      continue;
    }
    if (into_step_dirs && pid == 0 && name.rfind(".tmp-", 0) == 0 && fs::is_directory(fs::symlink_status(p, ec)))
      remove_stale_in(p, "", false, removed);
  }
}

}  // namespace

std::vector<std::string> remove_stale_temporaries(const std::string& dir, const std::string& stem) {
  std::vector<std::string> removed;
  remove_stale_in(dir, stem, stem.empty(), removed);
  return removed;
}


uint32_t file_crc32c(const std::string& path, Progress* progress) {
  std::vector<uint32_t> none;
  return file_crc32c(path, 0, none, progress);
}

uint32_t file_crc32c(const std::string& path, uint64_t chunk, std::vector<uint32_t>& chunks, Progress* progress) {
  chunks.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_USER_CHECK(fd >= 0, "checkpoint file '{}' cannot be opened: {}", path, std::strerror(errno));
  // One pass front to back: ask for the kernel's largest readahead, and read
  // in 4 MiB requests (1 MiB ones ran at a quarter of the disk's cold-read
  // speed on the development VM; docs/benchmarks.md, "Checkpoint I/O").
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(size_t(4) << 20);
  uint32_t crc = 0, part = 0;  // the whole file's, the current chunk's
  uint64_t in_part = 0;        // bytes of the current chunk so far
  while (true) {
    const ssize_t k = ::read(fd, buf.data(), buf.size());
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const int e = errno;
      ::close(fd);
      DS_USER_ERROR("checkpoint file '{}' cannot be read: {}", path, std::strerror(e));
    }
    if (k == 0) break;
    crc = crc32c(buf.data(), static_cast<size_t>(k), crc);
    for (size_t at = 0; chunk > 0 && at < static_cast<size_t>(k);) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(k) - at, chunk - in_part));
      part = crc32c(buf.data() + at, n, part);
      at += n;
      in_part += n;
      if (in_part == chunk) {
        chunks.push_back(part);
        part = 0;
        in_part = 0;
      }
    }
    if (progress) progress->add(k);
  }
  ::close(fd);
  if (in_part > 0) chunks.push_back(part);
  return crc;
}

std::string output_dir_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).lexically_normal();
  if (ec) p = fs::path(path);
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "out/" is "out"
  return p.string();
}

void check_output_dir(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = output_dir_path(path);
  const fs::path given = p;
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  DS_USER_CHECK(fs::is_directory(p, ec), "{} '{}': '{}' {}", what, path, p.string(),
                p == given ? "exists and is not a directory" : "is not a directory, so nothing can be created in it");
  DS_USER_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, "{} '{}': cannot write into '{}': {}", what, path, p.string(),
                std::strerror(errno));
}

}  // namespace ds
