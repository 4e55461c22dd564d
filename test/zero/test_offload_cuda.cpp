// The offloaded optimizer step on a GPU: OffloadPipeline with CUDA tensors and
// the stream copier (gradient copies to the host and weight copies to the
// device on their own streams, pageable and pinned host buffers) gives the
// same bits as the blocking path (whole-range copies, AdamW::step on the
// host); and the same through the NVMe tier (step_tier) against AdamW in
// memory. Skipped (exit 77) without a CUDA device.
#include <catch2/catch.hpp>

#include "cuda/cuda_api.h"
#include "lib/io/aio.h"
#include "test/data/test_util.h"
#include "test/skip.h"
#include "test/zero/offload_case.h"

using namespace ds;

TEST_CASE("pipelined offload step on CUDA is bit-identical to the blocking one") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  cuda::init_device(0);
  for (bool pinned : {false, true}) {
    for (bool host_params : {false, true})
    for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{333}, int64_t{1 << 20}}) {
      INFO("bucket " << bucket << (pinned ? ", pinned" : ", pageable") << (host_params ? ", host parameters" : ""));
      const OffloadCompare r = compare_offload_step(Device::cuda(0), bucket, pinned, false, host_params);
      CHECK(r.params_equal);
      CHECK(r.moments_equal);
      CHECK(r.changed);
      CHECK(r.host_bytes == r.host_bytes_reported);  // pinned or not, what the memory report counts
    }
  }
}

TEST_CASE("offload step through the NVMe tier on CUDA is bit-identical to AdamW in memory") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::string why = aio_unavailable_reason();
  if (!why.empty()) DS_SKIP(why);
  cuda::init_device(0);
  const test::TempDir tmp;
  using At = OffloadPipeline::ParamsAt;
  for (At at : {At::Device, At::Host, At::Tier})
  for (bool pinned : {false, true})
    for (int64_t sub : {int64_t{1}, int64_t{37}, int64_t{2048}}) {
      INFO("sub-group " << sub << (pinned ? ", pinned" : ", pageable") << ", parameters at " << static_cast<int>(at));
      const OffloadCompare r =
          compare_nvme_offload_step(Device::cuda(0), tmp.path(),
                                    {.sub_group = sub, .buffer_count = 4, .pipelined = true, .pinned = pinned,
                                     .deferred = false, .params = at});
      CHECK(r.params_equal);
      CHECK(r.moments_equal);
      CHECK(r.changed);
      CHECK(r.host_bytes == r.host_bytes_reported);
    }
}
