// The offloaded optimizer step on a GPU: OffloadPipeline with CUDA tensors and
// the stream copier (gradient copies to the host and weight copies to the
// device on their own streams, pageable and pinned host buffers) gives the
// same bits as the blocking path (whole-range copies, AdamW::step on the
// host). Skipped (exit 77) without a CUDA device.
#include <catch2/catch.hpp>

#include "cuda/cuda_api.h"
#include "test/skip.h"
#include "test/zero/offload_case.h"

using namespace ds;

TEST_CASE("pipelined offload step on CUDA is bit-identical to the blocking one") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  cuda::init_device(0);
  for (bool pinned : {false, true}) {
    for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{333}, int64_t{1 << 20}}) {
      INFO("bucket " << bucket << (pinned ? ", pinned" : ", pageable"));
      const OffloadCompare r = compare_offload_step(Device::cuda(0), bucket, pinned);
      CHECK(r.params_equal);
      CHECK(r.moments_equal);
      CHECK(r.changed);
      CHECK(r.host_bytes == r.host_bytes_reported);  // pinned or not, what the memory report counts
    }
  }
}
