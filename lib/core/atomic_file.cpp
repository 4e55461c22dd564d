// Atomic file writes: single files and sets of files renamed together.
#include "lib/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "lib/core/error.h"
#include "lib/core/progress.h"

namespace ds {
namespace {

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

void fsync_dir_of(const std::string& path) {
  const int dfd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // make the rename durable; best effort
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string tmp_name(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

// Writes `pieces` to `tmp` and fsyncs it; on failure removes it and throws naming `path`.
void write_tmp(const std::string& tmp, const std::string& path, const std::vector<std::string_view>& pieces,
               Progress* progress) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error(tmp, errno);
  int err = 0;
  for (size_t i = 0; i < pieces.size() && err == 0; ++i)
    err = write_all_fd(fd, pieces[i].data(), pieces[i].size(), progress);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw_write_error(path, err);
  }
}

}  // namespace

void throw_write_error(const std::string& path, int err) {
  if (err == ENOSPC || err == EDQUOT)
    DS_USER_ERROR("cannot write '{}': No space left on device (free some space and retry)", path);
  DS_USER_ERROR("cannot write '{}': {}", path, std::strerror(err));
}

// In pieces of at most 64 MiB so that a progress line can follow a large file.
int write_all_fd(int fd, const char* p, size_t n, Progress* progress) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, std::min<size_t>(n, size_t(64) << 20));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return errno;
    if (k == 0) return EIO;
    p += k;
    n -= static_cast<size_t>(k);
    if (progress) progress->add(k);
  }
  return 0;
}

void write_file_atomic(const std::string& path, std::string_view bytes, Progress* progress) {
  write_file_atomic(path, std::vector<std::string_view>{bytes}, progress);
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces, Progress* progress) {
  const std::string tmp = tmp_name(path);
  write_tmp(tmp, path, pieces, progress);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    DS_USER_ERROR("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(e));
  }
  fsync_dir_of(path);
}

void write_file_atomic_stream(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                              Progress* progress) {
  const std::string tmp = tmp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error(tmp, errno);
  int err = 0;
  try {
    produce([&](std::string_view bytes) {
      if (err == 0) err = write_all_fd(fd, bytes.data(), bytes.size(), progress);
    });
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw_write_error(path, err);
  }
  fsync_dir_of(path);
}

StagedFiles::~StagedFiles() { discard(); }

void StagedFiles::discard() {
  for (const Entry& f : files_) {
    ::unlink(f.tmp.c_str());
    if (!f.backup.empty()) ::unlink(f.backup.c_str());
  }
  files_.clear();
}

void StagedFiles::stage(const std::string& path, std::string_view bytes) {
  Entry e{.path = path, .tmp = tmp_name(path), .backup = {}};
  try {
    write_tmp(e.tmp, path, {bytes}, nullptr);
  } catch (const UserError& err) {
    discard();
    throw UserError(std::string(err.what()) + "; no file was replaced");
  }
  files_.push_back(std::move(e));
}

bool StagedFiles::restore(size_t renamed) {
  bool ok = true;
  for (size_t i = 0; i < renamed; ++i) {
    const Entry& f = files_[i];
    if (f.backup.empty())
      ok = (::unlink(f.path.c_str()) == 0) && ok;
    else
      ok = (::rename(f.backup.c_str(), f.path.c_str()) == 0) && ok;
    fsync_dir_of(f.path);
  }
  return ok;
}

void StagedFiles::commit() {
  for (Entry& f : files_) {  // hard links: no data is copied, so a full disk does not stop them
    const std::string backup = f.path + ".old." + std::to_string(::getpid());
    ::unlink(backup.c_str());
    if (::link(f.path.c_str(), backup.c_str()) == 0) {
      f.backup = backup;
    } else if (errno != ENOENT) {
      const int e = errno;
      discard();
      DS_USER_ERROR("cannot keep a backup of '{}' while replacing it: {} (nothing was changed)", f.path,
                    std::strerror(e));
    }
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    if (::rename(files_[i].tmp.c_str(), files_[i].path.c_str()) == 0) continue;
    const int e = errno;
    std::string names;
    for (const Entry& f : files_) names += (names.empty() ? "'" : ", '") + f.path + "'";
    if (restore(i)) {
      discard();
      DS_USER_ERROR("cannot rename '{}' to '{}': {}; the old {} are kept", files_[i].tmp, files_[i].path,
                    std::strerror(e), names);
    }
    const std::string tmp = files_[i].tmp, path = files_[i].path;
    files_.clear();  // leave every file where it is: the line below says what is where
    DS_USER_ERROR("cannot rename '{}' to '{}': {}, and the {} file(s) renamed before it could not be put back: "
                  "{} no longer match (the old copies are the .old.{} files beside them)",
                  tmp, path, std::strerror(e), i, names, ::getpid());
  }
  for (const Entry& f : files_) fsync_dir_of(f.path);
  for (Entry& f : files_) {
    if (!f.backup.empty()) ::unlink(f.backup.c_str());
    f.tmp.clear();
    f.backup.clear();
  }
  files_.clear();
}

}  // namespace ds
