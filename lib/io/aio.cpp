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

struct SwapFile::Ring {
  io_uring ring{};
  bool ready = false;
  AioConfig cfg;
  struct Request {  // one block_size piece of an operation
    Ticket t = 0;
    bool is_write = false;
    int64_t offset = 0, bytes = 0;
    char* buf = nullptr;
  };
  struct Op {
    bool is_write = false;
    int64_t offset = 0, bytes = 0;
    int64_t remaining = 0;  // requests not yet completed
    int err = 0;            // the first errno
    int64_t short_at = -1;  // the first request that moved fewer bytes than asked (its offset)
  };
  std::deque<Request> queued;     // not yet submitted
  std::vector<Request> slots;     // in flight, by user_data
  std::vector<int> free_slots;
  std::unordered_map<Ticket, Op> ops;
  Ticket next = 1;
  int unsubmitted = 0;  // prepared, not yet io_uring_submit'ed

  ~Ring() {
    if (ready) io_uring_queue_exit(&ring);
  }
  // Moves queued requests into the ring while it has free slots.
  void pump(int fd) {
    while (!queued.empty() && !free_slots.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;
      const int slot = free_slots.back();
      free_slots.pop_back();
      const Request& r = slots[slot] = queued.front();
      queued.pop_front();
      if (r.is_write)
        io_uring_prep_write(sqe, fd, r.buf, static_cast<unsigned>(r.bytes), static_cast<uint64_t>(r.offset));
      else
        io_uring_prep_read(sqe, fd, r.buf, static_cast<unsigned>(r.bytes), static_cast<uint64_t>(r.offset));
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
      ++unsubmitted;
      if (cfg.single_submit) flush();
    }
    flush();
  }
  void flush() {
    if (unsubmitted == 0) return;
    int rc;
    do rc = io_uring_submit(&ring);
    while (rc == -EINTR);
    DS_CHECK(rc >= 0, "io_uring_submit: {}", std::strerror(-rc));
    unsubmitted = 0;
  }
  // Handles completions: waits for one when `block`, then takes all that are ready.
  void reap(bool block) {
    io_uring_cqe* cqe = nullptr;
    if (block) {
      int rc;
      do rc = io_uring_wait_cqe(&ring, &cqe);
      while (rc == -EINTR);
      DS_CHECK(rc == 0, "io_uring_wait_cqe: {}", std::strerror(-rc));
    }
    while (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe) {
      const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      const Request& r = slots[slot];
      Op& op = ops.at(r.t);
      if (res < 0 && op.err == 0) op.err = -res;
      if (res >= 0 && res < r.bytes && op.short_at < 0) op.short_at = r.offset + res;
      --op.remaining;
      free_slots.push_back(slot);
    }
  }
};

SwapFile::SwapFile(const std::string& dir, const std::string& name, const AioConfig& cfg) : dir_(dir) {
  DS_USER_CHECK(cfg.block_size > 0 && cfg.block_size % kAioAlign == 0 && cfg.block_size <= (int64_t{1} << 30),
                "aio.block_size {} must be a positive multiple of {} up to 1 GiB", cfg.block_size, kAioAlign);
  DS_USER_CHECK(cfg.queue_depth >= 1 && cfg.queue_depth <= 4096, "aio.queue_depth {} must be in [1, 4096]",
                cfg.queue_depth);
  DS_USER_CHECK(cfg.intra_op_parallelism >= 1 && cfg.intra_op_parallelism <= 64,
                "aio.intra_op_parallelism {} must be in [1, 64]", cfg.intra_op_parallelism);
  std::error_code ec;
  DS_USER_CHECK(fs::is_directory(dir, ec), "nvme_path '{}' {}", dir,
                fs::exists(dir, ec) ? "is not a directory" : "does not exist (create it on the NVMe device)");
  const std::string why = aio_unavailable_reason();
  DS_USER_CHECK(why.empty(), "nvme_path '{}': NVMe offload needs io_uring: {}", dir, why);
  path_ = (fs::path(dir) / name).string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  const int e = errno;
  DS_USER_CHECK(fd_ >= 0 || e != EINVAL, "nvme_path '{}' is on a file system without O_DIRECT (tmpfs or a network "
                "file system?); give a directory on a local disk", dir);
  DS_USER_CHECK(fd_ >= 0, "nvme_path '{}': cannot create the swap file '{}': {}", dir, name, std::strerror(e));
  ::unlink(path_.c_str());  // gone with the process, however it ends
  ring_ = std::make_unique<Ring>();
  ring_->cfg = cfg;
  const int capacity = cfg.queue_depth * cfg.intra_op_parallelism;
  const int rc = io_uring_queue_init(static_cast<unsigned>(capacity), &ring_->ring, 0);
  if (rc < 0) {
    ::close(fd_);
    DS_USER_ERROR("nvme_path '{}': io_uring with {} entries cannot be set up: {}", dir, capacity, std::strerror(-rc));
  }
  ring_->ready = true;
  ring_->slots.resize(static_cast<size_t>(capacity));
  for (int i = capacity - 1; i >= 0; --i) ring_->free_slots.push_back(i);
}

SwapFile::~SwapFile() {
  if (ring_) {
    try {
      // Requests still in flight write into or read from the caller's buffers: drain them first.
      while (ring_->free_slots.size() < ring_->slots.size()) ring_->reap(true);
    } catch (...) {
    }
  }
  ring_.reset();
  if (fd_ >= 0) ::close(fd_);
}

SwapFile::Ticket SwapFile::submit(bool is_write, int64_t offset, void* buf, int64_t bytes) {
  DS_CHECK(offset >= 0 && offset % kAioAlign == 0 && bytes >= 0 && bytes % kAioAlign == 0 &&
               reinterpret_cast<uintptr_t>(buf) % kAioAlign == 0,
           "SwapFile: offset {}, {} bytes and the buffer must be multiples of {}", offset, bytes, kAioAlign);
  Ring& r = *ring_;
  const Ticket t = r.next++;
  Ring::Op& op = r.ops[t];
  op.is_write = is_write;
  op.offset = offset;
  op.bytes = bytes;
  for (int64_t at = 0; at < bytes; at += r.cfg.block_size) {
    const int64_t n = std::min(r.cfg.block_size, bytes - at);
    r.queued.push_back({t, is_write, offset + at, n, static_cast<char*>(buf) + at});
    ++op.remaining;
  }
  if (r.cfg.overlap_events) {
    r.reap(false);
    r.pump(fd_);
  }
  return t;
}

SwapFile::Ticket SwapFile::write(int64_t offset, const void* src, int64_t bytes) {
  return submit(true, offset, const_cast<void*>(src), bytes);
}

SwapFile::Ticket SwapFile::read(int64_t offset, void* dst, int64_t bytes) { return submit(false, offset, dst, bytes); }

void SwapFile::wait(Ticket t) {
  Ring& r = *ring_;
  auto it = r.ops.find(t);
  DS_CHECK(it != r.ops.end(), "SwapFile::wait: unknown ticket {}", t);
  while (it->second.remaining > 0) {
    r.pump(fd_);
    r.reap(true);
  }
  const Ring::Op op = it->second;
  r.ops.erase(it);
  const char* what = op.is_write ? "writing" : "reading";
  if (op.err != 0)
    DS_USER_ERROR("nvme_path '{}': {} {} bytes at offset {} of the swap file failed: {}{}", dir_, what, op.bytes,
                  op.offset, std::strerror(op.err), op.err == ENOSPC ? " (the disk is full)" : "");
  if (op.short_at >= 0)
    DS_USER_ERROR("nvme_path '{}': {} {} bytes at offset {} of the swap file stopped at byte {}{}", dir_, what,
                  op.bytes, op.offset, op.short_at,
                  op.is_write ? " (the disk is full?)" : " (past the end of what was written: a short read)");
  (op.is_write ? written_ : read_) += op.bytes;
}

void SwapFile::wait_all() {
  std::vector<Ticket> ts;
  for (const auto& [t, op] : ring_->ops) ts.push_back(t);
  std::sort(ts.begin(), ts.end());
  std::string first;
  for (Ticket t : ts) {  // every ticket is waited for, the first error reported
    try {
      wait(t);
    } catch (const UserError& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw UserError(first);
}

#else  // no liburing in this build

std::string aio_unavailable_reason() { return "this build has no liburing (install liburing-dev and rebuild)"; }

struct SwapFile::Ring {};

SwapFile::SwapFile(const std::string& dir, const std::string&, const AioConfig&) : dir_(dir) {
  DS_USER_ERROR("nvme_path '{}': NVMe offload needs io_uring: {}", dir, aio_unavailable_reason());
}
SwapFile::~SwapFile() = default;
SwapFile::Ticket SwapFile::submit(bool, int64_t, void*, int64_t) { return 0; }
SwapFile::Ticket SwapFile::write(int64_t, const void*, int64_t) { return 0; }
SwapFile::Ticket SwapFile::read(int64_t, void*, int64_t) { return 0; }
void SwapFile::wait(Ticket) {}
void SwapFile::wait_all() {}

#endif

}  // namespace ds
