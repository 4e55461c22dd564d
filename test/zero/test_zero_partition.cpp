// ZeRO partitions, buckets, shard chunks, the ZeRO-3 fetch plan and the
// model-state byte formulas (lib/parallel/zero_partition.h).
#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "lib/parallel/zero_partition.h"

using namespace ds;

namespace {

// Every element of [0, total) is covered exactly once by `ranges`, in order, with no empty range.
void check_tiles(const std::vector<Range>& ranges, int64_t total) {
  int64_t next = 0;
  for (const Range& r : ranges) {
    CHECK(r.begin == next);
    CHECK(r.size() > 0);
    next = r.end;
  }
  CHECK(next == total);
}

}  // namespace

TEST_CASE("zero partition: padding, shards, ownership", "[zero]") {
  const int64_t totals[] = {0, 1, 3, 63, 64, 65, 255, 256, 257, 1000, 12345, 1000000, 124475904};
  const int dps[] = {1, 2, 3, 4, 7, 8, 64};
  const int64_t aligns[] = {1, 16, 64};
  for (int64_t total : totals)
    for (int dp : dps)
      for (int64_t align : aligns) {
        CAPTURE(total, dp, align);
        ZeroPartition p = make_zero_partition(total, dp, align);
        REQUIRE(p.total == total);
        REQUIRE(p.dp == dp);
        // padded_total: the smallest multiple of dp*align that is >= total.
        CHECK(p.padded_total % (dp * align) == 0);
        CHECK(p.padded_total >= total);
        CHECK(p.padded_total - total < dp * align);
        CHECK(p.shard * dp == p.padded_total);
        CHECK(p.shard % align == 0);
        // Padded ranges tile [0, padded_total); real ranges tile [0, total) exactly once.
        int64_t padded_next = 0, real_next = 0, real_sum = 0;
        for (int r = 0; r < dp; ++r) {
          Range o = p.owned(r), re = p.owned_real(r);
          CHECK(o.begin == padded_next);
          CHECK(o.size() == p.shard);
          padded_next = o.end;
          CHECK(re.size() >= 0);
          CHECK(re.begin == std::min(o.begin, total));  // empty past the end: [total, total)
          CHECK(re.end == std::min(o.end, total));
          if (re.size() > 0) {
            CHECK(re.begin == real_next);
            real_next = re.end;
          }
          real_sum += re.size();
        }
        CHECK(padded_next == p.padded_total);
        CHECK(real_next == total);
        CHECK(real_sum == total);
      }
}

TEST_CASE("zero partition: hand-computed cases", "[zero]") {
  SECTION("uneven division pads the tail rank") {
    ZeroPartition p = make_zero_partition(1000, 3);  // 3*64 = 192 -> 1152
    CHECK(p.padded_total == 1152);
    CHECK(p.shard == 384);
    CHECK(p.owned(0) == Range{0, 384});
    CHECK(p.owned(2) == Range{768, 1152});
    CHECK(p.owned_real(2) == Range{768, 1000});
  }
  SECTION("tiny total: fewer elements than ranks") {
    ZeroPartition p = make_zero_partition(3, 4);
    CHECK(p.padded_total == 256);
    CHECK(p.shard == 64);
    CHECK(p.owned_real(0) == Range{0, 3});
    for (int r = 1; r < 4; ++r) CHECK(p.owned_real(r).size() == 0);
  }
  SECTION("empty buffer") {
    ZeroPartition p = make_zero_partition(0, 4);
    CHECK(p.padded_total == 0);
    CHECK(p.shard == 0);
    CHECK(p.owned(3).size() == 0);
  }
  SECTION("exact fit needs no padding") {
    ZeroPartition p = make_zero_partition(1024000, 4);
    CHECK(p.padded_total == 1024000);
    CHECK(p.shard == 256000);
  }
  SECTION("dp 1 still pads to the alignment") {
    ZeroPartition p = make_zero_partition(100, 1);
    CHECK(p.padded_total == 128);
    CHECK(p.owned_real(0) == Range{0, 100});
  }
}

TEST_CASE("buckets cover the buffer without overlap", "[zero]") {
  CHECK(make_buckets(0, 10).empty());
  CHECK(make_buckets(10, 0) == std::vector<Range>{{0, 10}});
  CHECK(make_buckets(10, -5) == std::vector<Range>{{0, 10}});
  CHECK(make_buckets(10, 4) == std::vector<Range>{{0, 4}, {4, 8}, {8, 10}});
  CHECK(make_buckets(8, 4) == std::vector<Range>{{0, 4}, {4, 8}});
  CHECK(make_buckets(3, 100) == std::vector<Range>{{0, 3}});
  for (int64_t total : {1, 7, 64, 1000, 123457})
    for (int64_t bucket : {1, 3, 64, 500, 1000000}) {
      CAPTURE(total, bucket);
      auto b = make_buckets(total, bucket);
      check_tiles(b, total);
      for (const Range& r : b) CHECK(r.size() <= bucket);
      CHECK(static_cast<int64_t>(b.size()) == (total + bucket - 1) / bucket);
    }
}

TEST_CASE("shard chunks: aligned, bounded, cover each shard", "[zero]") {
  SECTION("hand-computed") {
    ZeroPartition p = make_zero_partition(1000, 3);  // shard 384
    // bucket 600 -> 200 per rank -> rounded down to 192
    CHECK(make_shard_chunks(p, 600) == std::vector<Range>{{0, 192}, {192, 384}});
    // bucket smaller than dp*align: alignment wins, chunk = 64
    CHECK(make_shard_chunks(p, 10).size() == 6);
    CHECK(make_shard_chunks(p, 0) == std::vector<Range>{{0, 384}});
    CHECK(make_shard_chunks(make_zero_partition(0, 3), 600).empty());
  }
  SECTION("chunk ranges map to rank pieces that tile the padded buffer") {
    ZeroPartition p = make_zero_partition(5000, 4);  // shard 1280
    auto chunks = make_shard_chunks(p, 1000);        // 250 per rank -> 192
    check_tiles(chunks, p.shard);
    std::vector<int> seen(p.padded_total, 0);
    for (const Range& c : chunks)
      for (int r = 0; r < p.dp; ++r)
        for (int64_t i = r * p.shard + c.begin; i < r * p.shard + c.end; ++i) ++seen[i];
    for (int v : seen) REQUIRE(v == 1);
  }
  SECTION("property sweep") {
    for (int64_t total : {1, 100, 4097, 100000, 1234567})
      for (int dp : {1, 2, 3, 8})
        for (int64_t bucket : {1, 100, 5000, 65536, 10000000})
          for (int64_t align : {1, 32, 64}) {
            CAPTURE(total, dp, bucket, align);
            ZeroPartition p = make_zero_partition(total, dp, 64);
            auto chunks = make_shard_chunks(p, bucket, align);
            check_tiles(chunks, p.shard);
            const int64_t limit = std::max<int64_t>(align, std::max<int64_t>(1, bucket / dp) / align * align);
            for (size_t i = 0; i < chunks.size(); ++i) {
              CHECK(chunks[i].size() <= limit);
              CHECK(chunks[i].begin % align == 0);
              if (i + 1 < chunks.size()) CHECK(chunks[i].size() % align == 0);
            }
          }
  }
}

TEST_CASE("zero3 plan: persistence threshold", "[zero]") {
  // embedding 1000, three layers of 300, final norm 8
  std::vector<Range> units = {{0, 1000}, {1000, 1300}, {1300, 1600}, {1600, 1900}, {1900, 1908}};
  Zero3Plan p = make_zero3_plan(units, 1000, 100000, 10);
  CHECK(p.persistent == std::vector<bool>{false, false, false, false, true});
  // strictly smaller than the threshold
  CHECK(make_zero3_plan(units, 1000, 100000, 8).persistent[4] == false);
  CHECK(make_zero3_plan(units, 1000, 100000, 9).persistent[4] == true);
  // threshold 0 / negative: nothing persistent
  for (bool b : make_zero3_plan(units, 1000, 100000, 0).persistent) CHECK_FALSE(b);
  // huge threshold: everything persistent, nothing to fetch
  Zero3Plan all = make_zero3_plan(units, 1000, 100000, 1 << 30);
  for (bool b : all.persistent) CHECK(b);
  CHECK(all.prefetch_depth == 0);
  CHECK(all.peak_live == 1908);
}

TEST_CASE("zero3 plan: prefetch bucket and max live parameters", "[zero]") {
  std::vector<Range> layers;  // eight equal layers of 100
  for (int i = 0; i < 8; ++i) layers.push_back({i * 100, (i + 1) * 100});
  // Prefetch continues while fewer than `bucket` elements are queued.
  CHECK(make_zero3_plan(layers, 0, 1 << 30, 0).prefetch_depth == 0);
  CHECK(make_zero3_plan(layers, 1, 1 << 30, 0).prefetch_depth == 1);
  CHECK(make_zero3_plan(layers, 100, 1 << 30, 0).prefetch_depth == 1);
  CHECK(make_zero3_plan(layers, 101, 1 << 30, 0).prefetch_depth == 2);
  CHECK(make_zero3_plan(layers, 250, 1 << 30, 0).prefetch_depth == 3);
  // Depth never exceeds the number of other gathered units.
  CHECK(make_zero3_plan(layers, 1 << 30, 1 << 30, 0).prefetch_depth == 7);
  // max live: running unit + prefetched <= limit.
  CHECK(make_zero3_plan(layers, 1 << 30, 350, 0).prefetch_depth == 2);
  CHECK(make_zero3_plan(layers, 1 << 30, 100, 0).prefetch_depth == 0);
  CHECK(make_zero3_plan(layers, 1 << 30, 50, 0).prefetch_depth == 0);
  Zero3Plan p = make_zero3_plan(layers, 250, 350, 0);
  CHECK(p.prefetch_depth == 2);
  CHECK(p.peak_live == 300);
  // The larger embedding bounds the depth in backward order too (reverse walk ends at it).
  std::vector<Range> units = {{0, 1000}};
  for (int i = 0; i < 4; ++i) units.push_back({1000 + i * 100, 1100 + i * 100});
  CHECK(make_zero3_plan(units, 1 << 30, 1150, 0).prefetch_depth == 1);  // 1000 + 100 fits, 1000 + 200 not
  CHECK(make_zero3_plan(units, 1 << 30, 1150, 0).peak_live == 1100);
  CHECK(make_zero3_plan(units, 1 << 30, 1200, 0).prefetch_depth == 2);
  CHECK(make_zero3_plan({}, 100, 100, 0).prefetch_depth == 0);
}

TEST_CASE("model-state bytes per rank follow the ZeRO formulas", "[zero]") {
  const int64_t n = 1000000;  // dp 4: padded to 1000192, shard 250048
  REQUIRE(make_zero_partition(n, 4).shard == 250048);
  struct Case {
    int stage;
    StatePrecision prec;
    int64_t params, grads, optimizer;
  };
  const Case cases[] = {
      {0, StatePrecision::FP32, 4000000, 4000000, 8000000},
      {1, StatePrecision::FP32, 4000000, 4000000, 2000384},
      {2, StatePrecision::FP32, 4000000, 1000192, 2000384},
      {3, StatePrecision::FP32, 1000192, 1000192, 2000384},
      {0, StatePrecision::Mixed, 6000000, 4000000, 8000000},
      {1, StatePrecision::Mixed, 3000192, 4000000, 2000384},  // 2n + 4s, s = 250048
      {2, StatePrecision::Mixed, 3000192, 1000192, 2000384},
      {3, StatePrecision::Mixed, 1000192, 1000192, 2000384},
      {0, StatePrecision::MixedLowp, 6000000, 2000000, 8000000},
      {1, StatePrecision::MixedLowp, 3000192, 2000000, 2000384},
      {2, StatePrecision::MixedLowp, 3000192, 500096, 2000384},
      {3, StatePrecision::MixedLowp, 1000192, 500096, 2000384},
  };
  for (const Case& c : cases) {
    CAPTURE(c.stage, c.prec == StatePrecision::FP32);
    ModelStateBytes b = zero_model_state_bytes(n, 4, c.stage, c.prec, false);
    CHECK(b.params == c.params);
    CHECK(b.grads == c.grads);
    CHECK(b.optimizer == c.optimizer);
    CHECK(b.total() == c.params + c.grads + c.optimizer);
    ModelStateBytes off = zero_model_state_bytes(n, 4, c.stage, c.prec, true);
    CHECK(off.params == c.params);
    CHECK(off.grads == c.grads);
    CHECK(off.optimizer == 0);
    CHECK(host_optimizer_bytes(n, 4, c.stage, c.prec) == c.optimizer);
  }
  SECTION("per-parameter figures when nothing is padded") {
    const int64_t m = 1024000;  // a multiple of 4 * 64
    auto per = [&](int stage, StatePrecision p) { return zero_model_state_bytes(m, 4, stage, p, false).total(); };
    CHECK(per(0, StatePrecision::Mixed) == m * 18);                // Megatron without the distributed optimizer
    CHECK(per(1, StatePrecision::Mixed) == m * 6 + m * 12 / 4);   // 6 + 12/DP (DeepSpeed with fp32 gradients)
    CHECK(per(2, StatePrecision::Mixed) == m * 2 + m * 16 / 4);   // 2 + 16/DP (DeepSpeed with fp32 gradients)
    CHECK(per(3, StatePrecision::Mixed) == m * 16 / 4);           // 16/DP
    // Gradients in the compute dtype: DeepSpeed's default figures for stages 0-2.
    CHECK(per(0, StatePrecision::MixedLowp) == m * 16);
    CHECK(per(1, StatePrecision::MixedLowp) == m * 4 + m * 12 / 4);  // 4 + 12/DP
    CHECK(per(2, StatePrecision::MixedLowp) == m * 2 + m * 14 / 4);  // 2 + 14/DP
    CHECK(per(3, StatePrecision::MixedLowp) == m * 14 / 4);          // 14/DP: the f32 shard is the master
    CHECK(per(0, StatePrecision::FP32) == m * 16);
    CHECK(per(1, StatePrecision::FP32) == m * 8 + m * 8 / 4);
    CHECK(per(2, StatePrecision::FP32) == m * 4 + m * 12 / 4);
    CHECK(per(3, StatePrecision::FP32) == m * 16 / 4);
  }
  SECTION("dp 1 equals stage 0 up to padding") {
    for (int stage = 0; stage <= 3; ++stage) {
      CHECK(zero_model_state_bytes(1024, 1, stage, StatePrecision::Mixed, false).total() ==
            (stage == 3 ? 16 : 18) * 1024);
      CHECK(zero_model_state_bytes(1024, 1, stage, StatePrecision::MixedLowp, false).total() ==
            (stage == 3 ? 14 : 16) * 1024);
    }
  }
  SECTION("the optimizer state covers real elements only; grad and param shards are padded") {
    // 1000 elements, DP 1: padded shard 1024, but Adam's moments cover rank 0's real range (1000).
    ModelStateBytes b = zero_model_state_bytes(1000, 1, 3, StatePrecision::FP32, false);
    CHECK(b.params == 4 * 1024);
    CHECK(b.grads == 4 * 1024);
    CHECK(b.optimizer == 8 * 1000);
    CHECK(zero_model_state_bytes(1000, 1, 1, StatePrecision::FP32, false).optimizer == 8 * 1000);
    CHECK(zero_model_state_bytes(1000, 2, 1, StatePrecision::FP32, false).optimizer == 8 * 512);
  }
}
