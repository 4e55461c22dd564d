// File checksums, bounded reads and output-directory checks.
#include "lib/ckpt/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lib/ckpt/crc32c.h"
#include "lib/core/error.h"
#include "lib/core/progress.h"

namespace ds {

uint32_t file_crc32c(const std::string& path, Progress* progress) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_USER_CHECK(fd >= 0, "checkpoint file '{}' cannot be opened: {}", path, std::strerror(errno));
  std::vector<char> buf(size_t(1) << 20);
  uint32_t crc = 0;
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
    if (progress) progress->add(k);
  }
  ::close(fd);
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

std::string read_small_file(const std::string& path, size_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_USER_CHECK(fd >= 0, "{} cannot be opened: {}", what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DS_USER_ERROR("{} is not a regular file", what);
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    DS_USER_ERROR("{} is {} bytes, more than the {} such a file can have", what, st.st_size, max_bytes);
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t k = ::read(fd, out.data() + got, out.size() - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

}  // namespace ds
