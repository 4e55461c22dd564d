// Bounded reads of regular files (file_read.h).
#include "lib/core/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "lib/core/error.h"

namespace ds {
namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "of another kind";
}

}  // namespace

std::string read_small_file(const std::string& path, size_t max_bytes, const std::string& what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (regular files ignore it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DS_USER_CHECK(fd >= 0, "{} cannot be opened: {}", what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DS_USER_ERROR("{} is not a regular file (it is {})", what, file_kind(st.st_mode));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    DS_USER_ERROR("{} is {} bytes, more than the {} such a file can have", what, st.st_size, max_bytes);
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  int err = 0;
  while (got < out.size()) {
    const ssize_t k = ::read(fd, out.data() + got, out.size() - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) err = errno;
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  ::close(fd);
  DS_USER_CHECK(err == 0, "{} cannot be read: {}", what, std::strerror(err));
  out.resize(got);
  return out;
}

}  // namespace ds
