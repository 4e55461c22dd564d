// The NVMe tier's swap file bandwidth against fio on the same directory, in
// one run (docs/benchmarks.md, "NVMe swap files against fio").
//
//   bench_aio [--dir D] [--gib N] [--block KiB] [--depth Q] [--op MiB] [--repeat K]
//
// Ours: a SwapFile (io_uring, O_DIRECT) writes N GiB as operations of --op
// MiB (a sub-group's state), two in flight, then reads them back the same
// way; every byte read is compared with what was written. fio: the same bytes
// with --ioengine=io_uring --direct=1, the same request size (--bs) and queue
// depth (--iodepth), sequential write then read, on a file in the same
// directory. The runs alternate (ours, fio) K times and the best of each is
// kept, since a virtual disk's speed drifts. Prints GB/s and ours / fio.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "lib/core/error.h"
#include "lib/io/aio.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs a shell command; its wall time in seconds, negative on failure.
double timed(const std::string& cmd) {
  const double t0 = now_s();
  const int rc = std::system((cmd + " > /dev/null 2>&1").c_str());
  return rc == 0 ? now_s() - t0 : -1.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/bench_aio";
  int64_t gib = 4, block_kib = 1024, op_mib = 256;
  int depth = 8, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--gib") gib = std::stoll(v);
    else if (a == "--block") block_kib = std::stoll(v);
    else if (a == "--depth") depth = std::stoi(v);
    else if (a == "--op") op_mib = std::stoll(v);
    else if (a == "--repeat") repeat = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_aio: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "bench_aio: %s\n", why.c_str());
    return 1;
  }
  fs::create_directories(dir);
  AioConfig cfg;
  cfg.block_size = block_kib << 10;
  cfg.queue_depth = depth;
  const int64_t op = op_mib << 20, total = (gib << 30) / op * op;
  std::printf("%.2f GB in %lld MiB operations (two in flight), requests of %lld KiB, queue depth %d, in %s\n",
              total / 1e9, static_cast<long long>(op_mib), static_cast<long long>(block_kib), depth, dir.c_str());
  AlignedBuffer buf[2] = {AlignedBuffer(op), AlignedBuffer(op)};
  for (AlignedBuffer& b : buf)
    for (int64_t i = 0; i < op; i += 8) {
      const uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + (&b == &buf[0] ? 1 : 2);
      std::memcpy(static_cast<char*>(b.data()) + i, &x, 8);
    }
  AlignedBuffer check(op);
  const bool fio = std::system("command -v fio > /dev/null 2>&1") == 0;
  double ours_w = 1e30, ours_r = 1e30, fio_w = 1e30, fio_r = 1e30;
  for (int k = 0; k < repeat; ++k) {
    {
      SwapFile f(dir, "bench_swap_" + std::to_string(::getpid()), cfg);
      SwapFile::Ticket t[2] = {0, 0};
      double t0 = now_s();
      for (int64_t at = 0, i = 0; at < total; at += op, ++i) {
        if (t[i % 2]) f.wait(t[i % 2]);
        t[i % 2] = f.write(at, buf[i % 2].data(), op);
      }
      f.wait_all();
      const double w = now_s() - t0;
      ours_w = std::min(ours_w, w);
      t0 = now_s();
      double compare = 0;
      for (int64_t at = 0, i = 0; at < total; at += op, ++i) {
        const SwapFile::Ticket r = f.read(at, check.data(), op);
        f.wait(r);
        const double c0 = now_s();
        DS_CHECK(std::memcmp(check.data(), buf[i % 2].data(), static_cast<size_t>(op)) == 0,
                 "bench_aio: operation {} read back different bytes", i);
        compare += now_s() - c0;
      }
      const double r = now_s() - t0 - compare;  // the comparison is not I/O
      ours_r = std::min(ours_r, r);
      std::printf("run %d: ours write %.2f GB/s, read %.2f GB/s\n", k, total / 1e9 / w, total / 1e9 / r);
    }
    if (!fio) continue;
    const std::string file = dir + "/fio.bin";
    const std::string common = " --name=seq --filename=" + file + " --size=" + std::to_string(total >> 20) +
                               "M --bs=" + std::to_string(block_kib) + "k --iodepth=" + std::to_string(depth) +
                               " --ioengine=io_uring --direct=1 --numjobs=1";
    double t = timed("fio" + common + " --rw=write");
    if (t > 0) fio_w = std::min(fio_w, t);
    t = timed("fio" + common + " --rw=read");
    if (t > 0) fio_r = std::min(fio_r, t);
    fs::remove(file);
  }
  fs::remove_all(dir);
  const double g = total / 1e9;
  std::printf("best of %d (fio's times include its start-up, about 10-30 ms)\n", repeat);
  if (!fio || fio_w > 1e29 || fio_r > 1e29) {
    std::printf("write  ours %6.2f GB/s   fio (not run)\nread   ours %6.2f GB/s   fio (not run)\n", g / ours_w,
                g / ours_r);
    return 0;
  }
  std::printf("write  ours %6.2f GB/s   fio %6.2f GB/s   ours/fio %.2f\n", g / ours_w, g / fio_w, fio_w / ours_w);
  std::printf("read   ours %6.2f GB/s   fio %6.2f GB/s   ours/fio %.2f\n", g / ours_r, g / fio_r, fio_r / ours_r);
  return 0;
}
