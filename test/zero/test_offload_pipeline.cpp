// The offloaded optimizer step in buckets (lib/runtime/offload_pipeline.h):
// the schedule exactly for a small case and its invariants over a grid
// (every bucket copied in, waited for, updated and copied back, in that order;
// a gradient buffer refilled only after the update that read it; at most two
// gradient copies in flight), and the pipelined AdamW on the CPU copy engine
// bit-identical to the blocking whole-range AdamW::step, over several steps
// and bucket sizes that cut parameters anywhere; the same with the Adam state
// in an NVMe tier (step_tier, the GPU model's offload_optimizer nvme) for
// sub-groups that cut parameters, one or two buffer sets, pipelined or not.
// test_offload_cuda runs the same comparisons with CUDA tensors and the
// stream copier.
#include <catch2/catch.hpp>
#include <algorithm>
#include <map>
#include <string>

#include "lib/io/aio.h"
#include "lib/runtime/offload_pipeline.h"
#include "test/data/test_util.h"
#include "test/skip.h"
#include "test/zero/offload_case.h"

using namespace ds;

namespace {

std::string str(const std::vector<OffloadOp>& ops) {
  std::string s;
  for (const OffloadOp& o : ops) {
    const char* k = "";
    switch (o.kind) {
      case OffloadOpKind::GradToHost: k = "G"; break;
      case OffloadOpKind::WaitGrad: k = "W"; break;
      case OffloadOpKind::Update: k = "U"; break;
      case OffloadOpKind::ParamToDevice: k = "P"; break;
      case OffloadOpKind::Finish: k = "F"; break;
    }
    s += k;
    if (o.bucket >= 0) s += std::to_string(o.bucket);
    if (o.buffer >= 0) {
      s += '/';
      s += std::to_string(o.buffer);
    }
    s += ' ';
  }
  return s;
}

}  // namespace

TEST_CASE("offload schedule: three buckets, two buffers") {
  CHECK(str(offload_schedule(3, 2)) == "G0/0 G1/1 W0/0 U0/0 P0 G2/0 W1/1 U1/1 P1 W2/0 U2/0 P2 F ");
  CHECK(str(offload_schedule(1, 2)) == "G0/0 W0/0 U0/0 P0 F ");
  CHECK(str(offload_schedule(0, 2)) == "F ");
}

TEST_CASE("offload schedule invariants") {
  for (int n = 0; n <= 9; ++n) {
    for (int nb = 1; nb <= 3; ++nb) {
      INFO("buckets " << n << " buffers " << nb);
      std::vector<OffloadOp> ops = offload_schedule(n, nb);
      REQUIRE(!ops.empty());
      REQUIRE(ops.back().kind == OffloadOpKind::Finish);
      std::map<int, std::vector<OffloadOpKind>> per_bucket;
      std::map<int, int> buffer_holder;  // buffer -> bucket copied in, not yet updated
      int in_flight = 0, max_in_flight = 0;
      for (const OffloadOp& o : ops) {
        if (o.bucket >= 0) per_bucket[o.bucket].push_back(o.kind);
        if (o.kind == OffloadOpKind::GradToHost) {
          REQUIRE(o.buffer == o.bucket % nb);
          REQUIRE(buffer_holder.count(o.buffer) == 0);  // its previous bucket was updated
          buffer_holder[o.buffer] = o.bucket;
          max_in_flight = std::max(max_in_flight, ++in_flight);
        }
        if (o.kind == OffloadOpKind::Update) {
          REQUIRE(buffer_holder.at(o.buffer) == o.bucket);
          buffer_holder.erase(o.buffer);
          --in_flight;
        }
      }
      REQUIRE(static_cast<int>(per_bucket.size()) == n);
      for (const auto& [b, kinds] : per_bucket)
        REQUIRE(kinds == std::vector<OffloadOpKind>{OffloadOpKind::GradToHost, OffloadOpKind::WaitGrad,
                                                   OffloadOpKind::Update, OffloadOpKind::ParamToDevice});
      REQUIRE(max_in_flight == std::min(n, nb));
    }
  }
}

TEST_CASE("pipelined offload step is bit-identical to the blocking one (CPU copy engine)") {
  for (bool host_params : {false, true})
  for (bool deferred : {false, true})
  for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{333}, int64_t{1000}, int64_t{1 << 20}}) {
    INFO("bucket " << bucket << (deferred ? ", copies deferred to their waits" : "")
                   << (host_params ? ", parameters on the host (offload_param cpu)" : ""));
    const OffloadCompare r = compare_offload_step(Device::cpu(), bucket, false, deferred, host_params);
    CHECK(r.params_equal);
    CHECK(r.moments_equal);
    CHECK(r.changed);  // the update really moved the weights
    // The master copy and the gradient buffers, as the memory report counts them.
    CHECK(r.host_bytes == r.host_bytes_reported);
    if (!host_params) CHECK(r.host_bytes >= 4 * 590);  // at least the range's master copy (590 elements)
  }
}

TEST_CASE("offload step through the NVMe tier is bit-identical to AdamW in memory (CPU copy engine)") {
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  const test::TempDir tmp;
  using At = OffloadPipeline::ParamsAt;
  for (At at : {At::Device, At::Host, At::Tier})
  for (bool deferred : {false, true})
    for (const NvmeOffloadCase c : {NvmeOffloadCase{.sub_group = 37, .buffer_count = 4, .pipelined = true},
                                    NvmeOffloadCase{.sub_group = 37, .buffer_count = 2, .pipelined = true},
                                    NvmeOffloadCase{.sub_group = 100, .buffer_count = 4, .pipelined = false},
                                    NvmeOffloadCase{.sub_group = 2048, .buffer_count = 4, .pipelined = true},
                                    NvmeOffloadCase{.sub_group = 1, .buffer_count = 4, .pipelined = true}}) {
      INFO("sub-group " << c.sub_group << ", buffer_count " << c.buffer_count << (c.pipelined ? ", pipelined" : "")
                        << (deferred ? ", copies deferred to their waits" : "") << ", parameters "
                        << (at == At::Device ? "on the device" : at == At::Host ? "on the host" : "in the tier"));
      NvmeOffloadCase d = c;
      d.deferred = deferred;
      d.params = at;
      const OffloadCompare r = compare_nvme_offload_step(Device::cpu(), tmp.path(), d);
      CHECK(r.params_equal);
      CHECK(r.moments_equal);
      CHECK(r.changed);
      CHECK(r.host_bytes == r.host_bytes_reported);
    }
}
