// Asynchronous file I/O for the NVMe storage tier (ZeRO-Infinity's swap
// files): reads and writes go to the device through io_uring (liburing) with
// O_DIRECT, bypassing the page cache, and stay in flight while the caller
// computes (the optimizer updates one sub-group while the next is read and the
// last written). DeepSpeed's `aio` section sets the request size and depth.
//
// A SwapFile is one rank's file under a directory (zero_optimization's
// nvme_path). It is unlinked as soon as it is created: it takes disk space
// while the process holds it and disappears however the process ends, so no
// run leaves swap files behind and removing the directory mid-run changes
// nothing. Every failure (the directory missing or not writable, a file
// system without O_DIRECT, a full disk, a short read, an I/O error) is a
// UserError naming the directory and what happened; nothing is retried
// silently, so a value read back is the value written.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ds {

// DeepSpeed's `aio` keys, as this backend reads them.
struct AioConfig {
  int64_t block_size = 1 << 20;   // bytes per request (a multiple of kAioAlign)
  int queue_depth = 8;            // requests in flight at most
  // DeepSpeed splits each operation over this many threads; io_uring needs
  // one submitter, so here it multiplies the requests in flight
  // (queue_depth x intra_op_parallelism), which is what the threads buy.
  int intra_op_parallelism = 1;
  bool single_submit = false;     // one io_uring_submit per request instead of per batch
  bool overlap_events = true;     // reap completions while submitting (false: submit all, then wait)
};

// Offsets, sizes and buffer addresses of every request are multiples of this
// (O_DIRECT's logical block size on every device we meet).
inline constexpr int64_t kAioAlign = 4096;

// Host memory aligned for O_DIRECT: `bytes` rounded up to kAioAlign.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  void* data() const { return p_.get(); }
  int64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> p_;
  int64_t size_ = 0;
};

// Whether this process may use io_uring ("" if so, else why not: an old
// kernel, kernel.io_uring_disabled, a sandbox, or a build without liburing).
std::string aio_unavailable_reason();

// The io_uring queue one file's requests go through (aio.cpp).
class AioQueue;

class SwapFile {
 public:
  using Ticket = int64_t;

  // Creates and unlinks `dir`/`name` (O_DIRECT). UserError naming `dir` when it
  // is missing, not a writable directory, or on a file system without O_DIRECT,
  // or when io_uring is unavailable (aio_unavailable_reason).
  SwapFile(const std::string& dir, const std::string& name, const AioConfig& cfg);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Queue a write of `bytes` from `src` to `offset` / a read into `dst`; both
  // return at once (requests go out as the ring has room) with a ticket for
  // wait(). offset, bytes and the buffer address must be multiples of
  // kAioAlign, and the buffer must stay untouched until the ticket completes.
  Ticket write(int64_t offset, const void* src, int64_t bytes);
  Ticket read(int64_t offset, void* dst, int64_t bytes);
  // Blocks until the operation is done; UserError naming the file's directory
  // on failure (the disk full, a read past what was written, an I/O error).
  void wait(Ticket t);
  void wait_all();

  const std::string& dir() const { return dir_; }
  int64_t bytes_written() const { return written_; }
  int64_t bytes_read() const { return read_; }

 private:
  std::unique_ptr<AioQueue> q_;
  std::string dir_;
  int64_t written_ = 0, read_ = 0;
};

// Reading an existing file front to back with O_DIRECT (checkpoint loads):
// aligned windows of block_size, queue_depth x intra_op_parallelism of them
// in flight, each handed over in file order. The windows' aligned buffers
// belong to the calling thread, not to the reader, so a load with many files
// open holds one set (32 MiB for 8 x 4 MiB) however many it reads.
// open() returns null where the file system refuses O_DIRECT or io_uring is
// unavailable (the caller reads through the page cache instead).
class DirectReader {
 public:
  static std::unique_ptr<DirectReader> open(const std::string& path, const AioConfig& cfg);
  ~DirectReader();
  // Reads bytes [offset, offset + n) of the file and calls fn(at, data, len)
  // for consecutive pieces of it, in order (at: the piece's file offset).
  // fn must not read through another DirectReader (the buffers are shared).
  // UserError naming the file when it ends early or a read fails.
  void read(uint64_t offset, uint64_t n, const std::function<void(uint64_t, const char*, size_t)>& fn);

 private:
  DirectReader() = default;
  std::unique_ptr<AioQueue> q_;
  std::string path_;
  uint64_t size_ = 0;
  AioConfig cfg_;
};

}  // namespace ds
