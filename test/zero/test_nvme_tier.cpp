// The NVMe tier of the optimizer state (lib/runtime/nvme_tier.h): an
// optimizer whose state lives in the tier, stepped sub-group by sub-group,
// gives the bits of the same optimizer holding its state in memory, for
// every sub-group size (cutting parameters anywhere), buffer count and
// pipelining choice; any range of a state reads back what was written; a
// tier that does not fit on its disk is one error naming nvme_path.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "lib/core/error.h"
#include "lib/optim/optimizer.h"
#include "lib/runtime/nvme_tier.h"
#include "test/data/test_util.h"
#include "test/model/tiny_model.h"
#include "test/ops_harness/op_test_util.h"
#include "test/skip.h"
#include "test/small_disk.h"

using namespace ds;
using namespace ds::test;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct TierCase {
  int64_t sub_group;
  int buffer_count;
  bool read_ahead, write_behind;
};

}  // namespace

TEST_CASE("optimizer state in the NVMe tier: sub-group steps give the bits of the in-memory update") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const TempDir tmp;
  const ModelLayout layout = build_layout(tiny_model(false));
  const int64_t begin = 7, end = layout.total - 5, n = end - begin;
  for (const OptimizerSpec spec :
       {OptimizerSpec{.type = "AdamW"}, OptimizerSpec{.type = "Adagrad", .initial_accumulator_value = 0.25f},
        OptimizerSpec{.type = "Lion"}}) {
    for (const TierCase c : {TierCase{37, 4, true, true}, TierCase{37, 1, true, true}, TierCase{100, 6, true, false},
                             TierCase{100, 6, false, true}, TierCase{1000000000, 4, false, false},
                             TierCase{1024, 8, true, true}}) {
      CAPTURE(spec.type, c.sub_group, c.buffer_count, c.read_ahead, c.write_behind);
      std::unique_ptr<Optimizer> mem = make_optimizer(spec, layout, Device::cpu(), begin, end);
      std::unique_ptr<Optimizer> off = make_optimizer(spec, layout, Device::cpu(), begin, end, StateHome::Elsewhere);
      REQUIRE(off->state_elsewhere());
      REQUIRE(off->states().empty());
      std::vector<float> initial;
      for (size_t i = 0; i < off->state_specs().size(); ++i) initial.push_back(off->initial_state_value(i));
      AioConfig aio;
      aio.block_size = 8192;  // several requests per sub-group
      NvmeStateTier tier({.dir = tmp.path(), .name = "swap", .aio = aio, .sub_group_size = c.sub_group,
                          .buffer_count = c.buffer_count, .pipeline_read = c.read_ahead,
                          .pipeline_write = c.write_behind},
                         initial, n);
      CHECK(fs::is_empty(fs::path(tmp.path())));  // the swap file is unlinked at once
      CHECK(tier.n_sub_groups() == (n + tier.sub_group() - 1) / tier.sub_group());
      CHECK(tier.pipelined_read() == (c.read_ahead && tier.buffer_sets() >= 2));
      Tensor p_mem = randn({n}, 3), p_off = p_mem.clone();
      StepHyper h;
      h.lr = 1e-2f;
      h.weight_decay = 0.1f;
      for (int step = 1; step <= 3; ++step) {
        const Tensor g = randn({n}, 20 + step, 0.5);
        mem->step({.params = p_mem, .grads = g, .params_lowp = Tensor()}, h, 0.75f);
        off->count_step();
        int visited = 0;
        tier.for_each(
            [&](int64_t lo, int64_t hi, const std::vector<Tensor>& states) {
              ++visited;
              REQUIRE(off->step_part(lo, hi, {.params = p_off.view(lo, {hi - lo}), .grads = g.view(lo, {hi - lo}),
                                              .params_lowp = Tensor(), .states = states},
                                     h, 0.75f));
            },
            true);
        CHECK(visited == tier.n_sub_groups());
        REQUIRE(same_bits(p_mem, p_off));
        for (size_t i = 0; i < mem->state_specs().size(); ++i) {
          Tensor back = Tensor::empty({n}, DType::F32);
          tier.read(static_cast<int>(i), 0, n, back.data<float>());
          REQUIRE(same_bits(mem->state(mem->state_specs()[i].name), back));
        }
      }
    }
  }
}

TEST_CASE("NVMe tier: any range of a state is written and read back, the others untouched") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const TempDir tmp;
  const int64_t n = 5000;
  NvmeStateTier tier({.dir = tmp.path(), .name = "swap", .aio = AioConfig{}, .sub_group_size = 1500,
                      .buffer_count = 2, .pipeline_read = false, .pipeline_write = false},
                     {0.f, 1.5f}, n);
  std::vector<float> a(n), b(n);
  tier.read(1, 0, n, b.data());
  CHECK(std::all_of(b.begin(), b.end(), [](float x) { return x == 1.5f; }));  // the initial value everywhere
  const Tensor r = randn({n}, 9);
  std::memcpy(a.data(), r.data<float>(), n * 4);
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {1499, 1501}, {10, 20}, {2999, 5000}}) {
    CAPTURE(lo, hi);
    tier.write(0, lo, hi, a.data() + lo);
    std::vector<float> got(static_cast<size_t>(hi - lo));
    tier.read(0, lo, hi, got.data());
    CHECK(std::memcmp(got.data(), a.data() + lo, got.size() * 4) == 0);
  }
  std::vector<float> all(n);
  tier.read(0, 0, n, all.data());
  CHECK(std::memcmp(all.data(), a.data(), n * 4) == 0);
  tier.read(1, 0, n, b.data());
  CHECK(std::all_of(b.begin(), b.end(), [](float x) { return x == 1.5f; }));  // state 1 untouched
  CHECK(tier.file_bytes() == NvmeStateTier::file_bytes_for({.sub_group_size = 1500}, 2, n));
  CHECK(tier.host_bytes() == NvmeStateTier::host_bytes_for({.sub_group_size = 1500, .buffer_count = 2}, 2, n));
}

TEST_CASE("NVMe tier: a state that does not fit on the disk is one error naming nvme_path", "[disk_full]") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const TempDir tmp;
  const fs::path dpath = tmp.path();
  // The child's exit code: classify_swap_error of the message.
  const int rc = run_on_small_disk(dpath, 256, [&] {
    std::string e;
    try {
      NvmeStateTier tier({.dir = dpath.string(), .name = "swap", .aio = AioConfig{}, .sub_group_size = 100000,
                          .buffer_count = 4, .pipeline_read = true, .pipeline_write = true},
                         {0.f, 0.f}, 1000000);  // 8 MB of state
      std::fprintf(stderr, "8 MB of state fitted on a 256 KiB tmpfs\n");
      return 2;
    } catch (const UserError& err) {
      e = err.what();
    }
    return test::classify_swap_error(e, dpath.string());
  });
  if (rc == kNoSmallDisk) DS_SKIP("no mount namespace for a small tmpfs here");
  CHECK((rc == test::kDiskFull || rc == test::kNoDirectIo));
  if (rc == test::kNoDirectIo) WARN("this kernel's tmpfs refuses O_DIRECT: the full-disk path was not reached");
}
