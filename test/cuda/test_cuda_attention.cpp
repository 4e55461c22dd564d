// GPU tests of causal attention (plain and flash backends) against the CPU
// attention at several (B, T, NH, HS), including T that is not a multiple of
// the flash tile sizes, in f32, bf16 and f16 (flash runs bf16/f16 with HS 64
// and 128; other cases exercise its fallback to the plain kernels).
#include "cuda/cuda_api.h"
#include "lib/ops/ops.h"
#include "op_harness.h"

using namespace ds;
using namespace ds::test;

namespace {

struct AttnCase {
  int64_t B, T;
  int NH, HS;
};

const AttnCase kCases[] = {
    {1, 1, 1, 64}, {2, 37, 3, 64}, {1, 130, 2, 128}, {2, 65, 2, 32}, {1, 257, 1, 128},
    {1, 200, 2, 64},
};

void run_case(const AttnCase& c, DType dt) {
  const int64_t W = 3 * int64_t(c.NH) * c.HS, O = int64_t(c.NH) * c.HS;
  Tensor qkv = randn({c.B, c.T, W}, 1000 + c.T + c.HS);
  Fields fw{{"out", Field{Tensor::zeros({c.B, c.T, O}, DType::F32), Kind::Act, true}},
            {"lse", Field{Tensor::zeros({c.B, c.NH, c.T}, DType::F32), Kind::F32, true}},
            {"qkv", Field{qkv, Kind::Act, false}}};
  const int NH = c.NH;
  std::string what = "attention_forward B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                     " NH=" + std::to_string(c.NH) + " HS=" + std::to_string(c.HS);
  check_op(what, fw, dt, [NH](const TensorMap& m, bool gpu) {
    AttentionArgs a{get(m, "out"), get(m, "lse"), get(m, "qkv"), NH};
    if (gpu) ops::attention_forward(a);
    else cpu::attention_forward(a, Stream{});
  });
  // Backward inputs: out and lse from the CPU forward on the f32 qkv.
  Tensor out = Tensor::zeros({c.B, c.T, O}, DType::F32);
  Tensor lse = Tensor::zeros({c.B, c.NH, c.T}, DType::F32);
  cpu::attention_forward(AttentionArgs{out, lse, qkv, NH}, Stream{});
  Fields bw{{"dqkv", Field{Tensor::zeros({c.B, c.T, W}, DType::F32), Kind::Act, true}},
            {"dout", Field{randn({c.B, c.T, O}, 2000 + c.T), Kind::Act, false}},
            {"out", Field{out, Kind::Act, false}},
            {"lse", Field{lse, Kind::F32, false}},
            {"qkv", Field{qkv, Kind::Act, false}}};
  what.replace(0, std::string("attention_forward").size(), "attention_backward");
  check_op(what, bw, dt, [NH](const TensorMap& m, bool gpu) {
    AttentionBwdArgs a{get(m, "dqkv"), get(m, "dout"), get(m, "out"), get(m, "lse"),
                       get(m, "qkv"), NH};
    if (gpu) ops::attention_backward(a);
    else cpu::attention_backward(a, Stream{});
  });
}

}  // namespace

TEST_CASE("cuda attention, plain backend") {
  if (!gpu_or_skip()) return;
  ds::cuda::set_attention_backend(ds::cuda::AttentionBackend::Plain);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const AttnCase& c : kCases) run_case(c, dt);
  ds::cuda::set_attention_backend(ds::cuda::AttentionBackend::Flash);
}

TEST_CASE("cuda attention, flash backend") {
  if (!gpu_or_skip()) return;
  ds::cuda::set_attention_backend(ds::cuda::AttentionBackend::Flash);
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (const AttnCase& c : kCases) run_case(c, dt);
}

TEST_CASE("cuda attention backend names") {
  using ds::cuda::AttentionBackend;
  CHECK(ds::cuda::attention_backend_from_name("flash") == AttentionBackend::Flash);
  CHECK(ds::cuda::attention_backend_from_name("plain") == AttentionBackend::Plain);
  CHECK(ds::cuda::attention_backend_from_name("cudnn") == AttentionBackend::Cudnn);
  CHECK_THROWS(ds::cuda::attention_backend_from_name("fast"));
}
