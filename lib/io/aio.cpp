// io_uring swap files (aio.h). One ring per file; an operation is split into
// block_size requests, at most queue_depth x intra_op_parallelism in flight;
// the rest wait in a queue and go out as completions free their slots.
#include "lib/io/aio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <unordered_map>
#include <vector>

#include "lib/core/error.h"

#ifdef DS_HAVE_LIBURING
#include <liburing.h>
#endif

namespace ds {

namespace fs = std::filesystem;

void AlignedBuffer::Free::operator()(void* p) const { std::free(p); }

AlignedBuffer::AlignedBuffer(int64_t bytes) {
  DS_CHECK(bytes >= 0, "AlignedBuffer: {} bytes", bytes);
  size_ = (bytes + kAioAlign - 1) / kAioAlign * kAioAlign;
  if (size_ == 0) return;
  void* p = std::aligned_alloc(static_cast<size_t>(kAioAlign), static_cast<size_t>(size_));
  DS_CHECK(p != nullptr, "AlignedBuffer: cannot allocate {} bytes", size_);
  p_.reset(p);
}

#ifdef DS_HAVE_LIBURING

std::string aio_unavailable_reason() {
  static const std::string reason = [] {
    io_uring ring;
    const int rc = io_uring_queue_init(2, &ring, 0);
    if (rc < 0)
      return fmt::format("io_uring cannot be set up here ({}; kernel.io_uring_disabled, an old kernel or a sandbox)",
                         std::strerror(-rc));
    io_uring_queue_exit(&ring);
    return std::string();
  }();
  return reason;
}

// One file descriptor's io_uring: operations split into requests, at most
// `capacity` in flight, the rest queued; wait() reports an operation's
// failure as a UserError beginning with `where` ("nvme_path 'D'", ...).
class AioQueue {
 public:
  using Ticket = int64_t;
  struct Result {
    bool is_write = false;
    int64_t offset = 0, bytes = 0;
    int err = 0;            // the first errno
    int64_t short_at = -1;  // where the first request that moved fewer bytes than asked stopped
  };

  AioQueue(int fd, std::string where, const AioConfig& cfg) : fd_(fd), where_(std::move(where)), cfg_(cfg) {
    const int capacity = cfg.queue_depth * cfg.intra_op_parallelism;
    const int rc = io_uring_queue_init(static_cast<unsigned>(capacity), &ring_, 0);
    if (rc < 0) {
      ::close(fd_);  // the queue owns the descriptor from here on
      DS_USER_ERROR("{}: io_uring with {} entries cannot be set up: {}", where_, capacity, std::strerror(-rc));
    }
    slots_.resize(static_cast<size_t>(capacity));
    for (int i = capacity - 1; i >= 0; --i) free_.push_back(i);
  }
  ~AioQueue() {
    try {  // requests in flight use the caller's buffers: drain them first
      while (free_.size() < slots_.size()) reap(true);
    } catch (...) {
    }
    io_uring_queue_exit(&ring_);
    ::close(fd_);
  }
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  Ticket submit(bool is_write, int64_t offset, void* buf, int64_t bytes) {
    DS_CHECK(offset >= 0 && offset % kAioAlign == 0 && bytes >= 0 && bytes % kAioAlign == 0 &&
                 reinterpret_cast<uintptr_t>(buf) % kAioAlign == 0,
             "{}: offset {}, {} bytes and the buffer must be multiples of {}", where_, offset, bytes, kAioAlign);
    const Ticket t = next_++;
    Op& op = ops_[t];
    op.r.is_write = is_write;
    op.r.offset = offset;
    op.r.bytes = bytes;
    for (int64_t at = 0; at < bytes; at += cfg_.block_size) {
      const int64_t n = std::min(cfg_.block_size, bytes - at);
      queued_.push_back({t, is_write, offset + at, n, static_cast<char*>(buf) + at});
      ++op.remaining;
    }
    if (cfg_.overlap_events) {
      reap(false);
      pump();
    }
    return t;
  }
  // Blocks until the operation is done and returns how it went.
  Result finish(Ticket t) {
    auto it = ops_.find(t);
    DS_CHECK(it != ops_.end(), "{}: unknown ticket {}", where_, t);
    while (it->second.remaining > 0) {
      pump();
      reap(true);
    }
    const Result r = it->second.r;
    ops_.erase(it);
    return r;
  }
  // finish(t), with a failure as a UserError.
  Result wait(Ticket t) {
    const Result op = finish(t);
    const char* what = op.is_write ? "writing" : "reading";
    if (op.err != 0)
      DS_USER_ERROR("{}: {} {} bytes at offset {} failed: {}{}", where_, what, op.bytes, op.offset,
                    std::strerror(op.err), op.err == ENOSPC ? " (the disk is full)" : "");
    if (op.short_at >= 0)
      DS_USER_ERROR("{}: {} {} bytes at offset {} stopped at byte {}{}", where_, what, op.bytes, op.offset,
                    op.short_at,
                    op.is_write ? " (the disk is full?)" : " (past the end of what was written: a short read)");
    return op;
  }
  std::vector<Ticket> pending() const {
    std::vector<Ticket> ts;
    for (const auto& [t, op] : ops_) ts.push_back(t);
    std::sort(ts.begin(), ts.end());
    return ts;
  }
  const std::string& where() const { return where_; }

 private:
  struct Request {  // one block_size piece of an operation
    Ticket t = 0;
    bool is_write = false;
    int64_t offset = 0, bytes = 0;
    char* buf = nullptr;
  };
  struct Op {
    Result r;
    int64_t remaining = 0;  // requests not yet completed
  };
  io_uring ring_{};
  int fd_;
  std::string where_;
  AioConfig cfg_;
  std::deque<Request> queued_;  // not yet submitted
  std::vector<Request> slots_;  // in flight, by user_data
  std::vector<int> free_;
  std::unordered_map<Ticket, Op> ops_;
  Ticket next_ = 1;
  int unsubmitted_ = 0;  // prepared, not yet io_uring_submit'ed

  // Moves queued requests into the ring while it has free slots.
  void pump() {
    while (!queued_.empty() && !free_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      const int slot = free_.back();
      free_.pop_back();
      const Request& r = slots_[slot] = queued_.front();
      queued_.pop_front();
      if (r.is_write)
        io_uring_prep_write(sqe, fd_, r.buf, static_cast<unsigned>(r.bytes), static_cast<uint64_t>(r.offset));
      else
        io_uring_prep_read(sqe, fd_, r.buf, static_cast<unsigned>(r.bytes), static_cast<uint64_t>(r.offset));
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
      ++unsubmitted_;
      if (cfg_.single_submit) flush();
    }
    flush();
  }
  void flush() {
    if (unsubmitted_ == 0) return;
    int rc;
    do rc = io_uring_submit(&ring_);
    while (rc == -EINTR);
    DS_CHECK(rc >= 0, "{}: io_uring_submit: {}", where_, std::strerror(-rc));
    unsubmitted_ = 0;
  }
  // Handles completions: waits for one when `block`, then takes all that are ready.
  void reap(bool block) {
    io_uring_cqe* cqe = nullptr;
    if (block) {
      int rc;
      do rc = io_uring_wait_cqe(&ring_, &cqe);
      while (rc == -EINTR);
      DS_CHECK(rc == 0, "{}: io_uring_wait_cqe: {}", where_, std::strerror(-rc));
    }
    while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe) {
      const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      const Request& r = slots_[slot];
      Op& op = ops_.at(r.t);
      if (res < 0 && op.r.err == 0) op.r.err = -res;
      if (res >= 0 && res < r.bytes && op.r.short_at < 0) op.r.short_at = r.offset + res;
      --op.remaining;
      free_.push_back(slot);
    }
  }
};

namespace {

void check_config(const AioConfig& cfg) {
  DS_USER_CHECK(cfg.block_size > 0 && cfg.block_size % kAioAlign == 0 && cfg.block_size <= (int64_t{1} << 30),
                "aio.block_size {} must be a positive multiple of {} up to 1 GiB", cfg.block_size, kAioAlign);
  DS_USER_CHECK(cfg.queue_depth >= 1 && cfg.queue_depth <= 4096, "aio.queue_depth {} must be in [1, 4096]",
                cfg.queue_depth);
  DS_USER_CHECK(cfg.intra_op_parallelism >= 1 && cfg.intra_op_parallelism <= 64,
                "aio.intra_op_parallelism {} must be in [1, 64]", cfg.intra_op_parallelism);
}

}  // namespace

SwapFile::SwapFile(const std::string& dir, const std::string& name, const AioConfig& cfg) : dir_(dir) {
  check_config(cfg);
  std::error_code ec;
  DS_USER_CHECK(fs::is_directory(dir, ec), "nvme_path '{}' {}", dir,
                fs::exists(dir, ec) ? "is not a directory" : "does not exist (create it on the NVMe device)");
  const std::string why = aio_unavailable_reason();
  DS_USER_CHECK(why.empty(), "nvme_path '{}': NVMe offload needs io_uring: {}", dir, why);
  const std::string path = (fs::path(dir) / name).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  const int e = errno;
  DS_USER_CHECK(fd >= 0 || e != EINVAL, "nvme_path '{}' is on a file system without O_DIRECT (tmpfs or a network "
                "file system?); give a directory on a local disk", dir);
  DS_USER_CHECK(fd >= 0, "nvme_path '{}': cannot create the swap file '{}': {}", dir, name, std::strerror(e));
  ::unlink(path.c_str());  // gone with the process, however it ends
  q_ = std::make_unique<AioQueue>(fd, fmt::format("nvme_path '{}': the swap file", dir), cfg);
}

SwapFile::~SwapFile() = default;

SwapFile::Ticket SwapFile::write(int64_t offset, const void* src, int64_t bytes) {
  return q_->submit(true, offset, const_cast<void*>(src), bytes);
}

SwapFile::Ticket SwapFile::read(int64_t offset, void* dst, int64_t bytes) {
  return q_->submit(false, offset, dst, bytes);
}

void SwapFile::wait(Ticket t) {
  const AioQueue::Result r = q_->wait(t);
  (r.is_write ? written_ : read_) += r.bytes;
}

void SwapFile::wait_all() {
  std::string first;
  for (Ticket t : q_->pending()) {  // every ticket is waited for, the first error reported
    try {
      wait(t);
    } catch (const UserError& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw UserError(first);
}

std::unique_ptr<DirectReader> DirectReader::open(const std::string& path, const AioConfig& cfg) {
  check_config(cfg);
  if (!aio_unavailable_reason().empty()) return nullptr;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return nullptr;  // no O_DIRECT here (or unreadable: the caller's own open names it)
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return nullptr;
  }
  std::unique_ptr<DirectReader> r(new DirectReader());
  r->path_ = path;
  r->size_ = static_cast<uint64_t>(st.st_size);
  r->cfg_ = cfg;
  try {
    r->q_ = std::make_unique<AioQueue>(fd, fmt::format("file '{}'", path), cfg);
  } catch (const UserError&) {
    return nullptr;  // a ring this size is refused here (a memlock limit): the page cache path reads the file
  }
  return r;
}

DirectReader::~DirectReader() = default;

void DirectReader::read(uint64_t offset, uint64_t n, const std::function<void(uint64_t, const char*, size_t)>& fn) {
  if (n == 0) return;
  DS_USER_CHECK(offset + n <= size_, "file '{}' is {} bytes, shorter than the {} bytes at offset {} asked for",
                path_, size_, n, offset);
  const uint64_t block = static_cast<uint64_t>(cfg_.block_size);
  const uint64_t start = offset / kAioAlign * kAioAlign;
  const uint64_t end = (offset + n + kAioAlign - 1) / kAioAlign * kAioAlign;  // may pass the file's end
  const size_t depth = static_cast<size_t>(cfg_.queue_depth * cfg_.intra_op_parallelism);
  static thread_local std::vector<AlignedBuffer> bufs;  // one set per thread, whatever the files
  if (bufs.size() < depth) bufs.resize(depth);
  for (AlignedBuffer& b : bufs)
    if (b.size() < cfg_.block_size) b = AlignedBuffer(cfg_.block_size);
  struct Window {
    uint64_t at, len;
    AioQueue::Ticket t;
    size_t buf;
  };
  std::deque<Window> flight;  // in file order
  uint64_t next = start;
  size_t next_buf = 0;
  auto issue = [&] {
    while (next < end && flight.size() < depth) {
      const uint64_t len = std::min(block, end - next);
      const size_t b = next_buf++ % depth;
      flight.push_back({next, len, q_->submit(false, static_cast<int64_t>(next), bufs[b].data(),
                                               static_cast<int64_t>(len)), b});
      next += len;
    }
  };
  // On a failure the windows still in flight are waited for before the
  // error leaves: they write into this thread's buffers.
  struct Drain {
    std::deque<Window>& flight;
    AioQueue& q;
    ~Drain() {
      try {
        for (const Window& w : flight) q.finish(w.t);
      } catch (...) {  // the ring itself failed: its destructor drains what is left
      }
    }
  } drain{flight, *q_};
  issue();
  while (!flight.empty()) {
    const Window w = flight.front();
    flight.pop_front();
    const AioQueue::Result r = q_->finish(w.t);
    DS_USER_CHECK(r.err == 0, "file '{}': reading {} bytes at offset {} failed: {}", path_, w.len, w.at,
                  std::strerror(r.err));
    // The window's part of [offset, offset + n); a read may stop at the file's
    // end (the last window passes it), never before what was asked for.
    const uint64_t lo = std::max(w.at, offset), hi = std::min(w.at + w.len, offset + n);
    const uint64_t got = r.short_at >= 0 ? static_cast<uint64_t>(r.short_at) : w.at + w.len;
    DS_USER_CHECK(got >= hi, "file '{}' ended at byte {} while reading up to byte {} (truncated while open?)", path_,
                  got, hi);
    fn(lo, static_cast<const char*>(bufs[w.buf].data()) + (lo - w.at), static_cast<size_t>(hi - lo));
    issue();  // the window's buffer is free again
  }
}

#else  // no liburing in this build

std::string aio_unavailable_reason() { return "this build has no liburing (install liburing-dev and rebuild)"; }

class AioQueue {};

SwapFile::SwapFile(const std::string& dir, const std::string&, const AioConfig&) : dir_(dir) {
  DS_USER_ERROR("nvme_path '{}': NVMe offload needs io_uring: {}", dir, aio_unavailable_reason());
}
SwapFile::~SwapFile() = default;
SwapFile::Ticket SwapFile::write(int64_t, const void*, int64_t) { return 0; }
SwapFile::Ticket SwapFile::read(int64_t, void*, int64_t) { return 0; }
void SwapFile::wait(Ticket) {}
void SwapFile::wait_all() {}

std::unique_ptr<DirectReader> DirectReader::open(const std::string&, const AioConfig&) { return nullptr; }
DirectReader::~DirectReader() = default;
void DirectReader::read(uint64_t, uint64_t, const std::function<void(uint64_t, const char*, size_t)>&) {}

#endif

}  // namespace ds
