// The NVMe tier's swap files (lib/io/aio.h) on the real kernel interface:
// io_uring with O_DIRECT. Bytes written come back identical under every
// submission mode (batched, one submit per request, no overlap, a ring of
// one), operations larger than the ring and not multiples of the request
// size included; and every fault is one UserError naming the directory: a
// missing directory, a short read, a full disk (a small tmpfs in a private
// mount namespace, or the file system's refusal of O_DIRECT there). The file
// is unlinked at once, so the directory stays empty and may even be removed
// mid-run.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/io/aio.h"
#include "test/data/test_util.h"
#include "test/skip.h"
#include "test/small_disk.h"

using namespace ds;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

// Deterministic bytes, different for each seed.
void fill(AlignedBuffer& b, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(b.data());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < b.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = static_cast<unsigned char>(x);
  }
}

bool same(const AlignedBuffer& a, const AlignedBuffer& b, int64_t n) { return std::memcmp(a.data(), b.data(), n) == 0; }

using test::error_of;

}  // namespace

TEST_CASE("swap file: what is written is read back, in every submission mode") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const test::TempDir tmp;
  const fs::path dpath = tmp.path();
  AioConfig base;
  base.block_size = 64 << 10;
  AioConfig single = base, no_overlap = base, one = base, wide = base;
  single.single_submit = true;
  no_overlap.overlap_events = false;
  one.queue_depth = 1;
  wide.intra_op_parallelism = 4;
  for (const AioConfig& cfg : {base, single, no_overlap, one, wide}) {
    CAPTURE(cfg.queue_depth, cfg.intra_op_parallelism, cfg.single_submit, cfg.overlap_events);
    SwapFile f(dpath.string(), "swap_rank0", cfg);
    CHECK(fs::is_empty(dpath));  // unlinked at once
    // Three operations in flight at once: 1.5 requests, 40 requests (more than
    // the ring holds), one page.
    const std::vector<int64_t> sizes = {96 << 10, 40 * (64 << 10), kAioAlign};
    std::vector<AlignedBuffer> out, back;
    std::vector<SwapFile::Ticket> tickets;
    int64_t at = 0;
    std::vector<int64_t> offsets;
    for (size_t i = 0; i < sizes.size(); ++i) {
      out.emplace_back(sizes[i]);
      fill(out.back(), i + 1);
      offsets.push_back(at);
      tickets.push_back(f.write(at, out.back().data(), sizes[i]));
      at += sizes[i];
    }
    f.wait(tickets[1]);  // out of order
    f.wait_all();
    CHECK(f.bytes_written() == at);
    for (size_t i = sizes.size(); i-- > 0;) {  // read back in reverse
      back.emplace_back(sizes[i]);
      tickets[i] = f.read(offsets[i], back.back().data(), sizes[i]);
    }
    f.wait_all();
    for (size_t i = 0; i < sizes.size(); ++i) CHECK(same(out[i], back[sizes.size() - 1 - i], sizes[i]));
    // Overwrite the middle and read it again.
    fill(out[1], 99);
    f.wait(f.write(offsets[1], out[1].data(), sizes[1]));
    AlignedBuffer again(sizes[1]);
    f.wait(f.read(offsets[1], again.data(), sizes[1]));
    CHECK(same(out[1], again, sizes[1]));
  }
  CHECK(fs::is_empty(dpath));
}

TEST_CASE("swap file: the directory removed mid-run changes nothing") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const test::TempDir tmp;
  const fs::path dpath = tmp.path();
  SwapFile f(dpath.string(), "swap_rank0", AioConfig{});
  AlignedBuffer a(1 << 20), b(1 << 20);
  fill(a, 7);
  f.wait(f.write(0, a.data(), a.size()));
  fs::remove(dpath);  // empty: the file was unlinked
  REQUIRE_FALSE(fs::exists(dpath));
  f.wait(f.read(0, b.data(), b.size()));
  CHECK(same(a, b, a.size()));
}

TEST_CASE("swap file: a missing directory and a short read are one line naming the directory") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const test::TempDir tmp;
  const fs::path dpath = tmp.path();
  const std::string missing = (dpath / "nope").string();
  const std::string e1 = error_of([&] { SwapFile f(missing, "swap_rank0", AioConfig{}); });
  CHECK_THAT(e1, Contains(missing) && Contains("does not exist"));
  AioConfig bad;
  bad.block_size = 1000;
  CHECK_THAT(error_of([&] { SwapFile f(dpath.string(), "s", bad); }), Contains("aio.block_size 1000"));

  SwapFile f(dpath.string(), "swap_rank0", AioConfig{});
  AlignedBuffer a(64 << 10);
  fill(a, 3);
  f.wait(f.write(0, a.data(), a.size()));
  AlignedBuffer b(128 << 10);
  const SwapFile::Ticket t = f.read(0, b.data(), b.size());  // half of it was never written
  const std::string e2 = error_of([&] { f.wait(t); });
  CHECK_THAT(e2, Contains(dpath.string()) && Contains("short read"));
  CHECK(e2.find('\n') == std::string::npos);
}

TEST_CASE("swap file: a full disk is an error naming the directory", "[disk_full]") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const test::TempDir tmp;
  const fs::path dpath = tmp.path();
  // The child's exit code: test::classify_swap_error of the message.
  const int rc = test::run_on_small_disk(dpath, 256, [&] {
    std::string e;
    try {
      SwapFile f(dpath.string(), "swap_rank0", AioConfig{});
      AlignedBuffer a(4 << 20);
      fill(a, 5);
      f.wait(f.write(0, a.data(), a.size()));
      std::fprintf(stderr, "4 MiB fitted on a 256 KiB tmpfs\n");
      return 2;
    } catch (const UserError& err) {
      e = err.what();
    }
    return test::classify_swap_error(e, dpath.string());
  });
  if (rc == test::kNoSmallDisk) DS_SKIP("no mount namespace for a small tmpfs here");
  CHECK((rc == test::kDiskFull || rc == test::kNoDirectIo));
  if (rc == test::kNoDirectIo) WARN("this kernel's tmpfs refuses O_DIRECT: the full-disk path was not reached");
}

TEST_CASE("direct reader: any byte range of a file, in order, as the page cache would give it") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const test::TempDir tmp;
  const fs::path dpath = tmp.path();
  const fs::path f = dpath / "data.bin";
  std::string bytes(3 * (1 << 20) + 12345, '\0');  // not a multiple of the page size
  uint64_t x = 42;
  for (char& c : bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  {
    FILE* out = std::fopen(f.c_str(), "wb");
    REQUIRE(out);
    REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size());
    std::fclose(out);
  }
  AioConfig cfg;
  cfg.block_size = 256 << 10;
  cfg.queue_depth = 3;
  std::unique_ptr<DirectReader> r = DirectReader::open(f.string(), cfg);
  REQUIRE(r);
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, bytes.size()}, {1, 100}, {4095, 2}, {777, 1 << 20}, {bytes.size() - 5, 5}, {bytes.size() - 300000, 300000}};
  for (const auto& [off, n] : ranges) {
    CAPTURE(off, n);
    std::string got;
    uint64_t expect_at = off;
    bool in_order = true;
    r->read(off, n, [&](uint64_t at, const char* p, size_t len) {
      in_order = in_order && at == expect_at;
      expect_at = at + len;
      got.append(p, len);
    });
    CHECK(in_order);
    CHECK(got == bytes.substr(off, n));
  }
  std::string e;
  try {
    r->read(bytes.size() - 10, 20, [](uint64_t, const char*, size_t) {});
  } catch (const UserError& err) {
    e = err.what();
  }
  CHECK_THAT(e, Contains(f.string()) && Contains("shorter"));
}
