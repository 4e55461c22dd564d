// attention_forward / attention_backward: argument checks and the choice of
// implementation (flash, plain; cudnn reserved) from set_attention_backend().
#include "cuda/attn/attention.h"
#include "cuda/core/common.cuh"
#include "cuda/cuda_api.h"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

AttnShape attn_shape(const Tensor& qkv, int NH, const char* op) {
  DS_CUDA_REQUIRE(NH > 0 && qkv.dim() == 3 && qkv.size(2) % (3 * NH) == 0,
                  std::string(op) + ": qkv must be (B, T, 3*NH*HS) with NH=" +
                      std::to_string(NH) + ", got " + desc(qkv));
  AttnShape sh{qkv.size(0), qkv.size(1), NH, int(qkv.size(2) / (3 * NH))};
  DS_CUDA_REQUIRE(sh.HS > 0 && sh.HS <= 256, std::string(op) + ": head size " +
                                                 std::to_string(sh.HS) + " not in [1, 256]");
  expect_float(qkv, qkv.numel(), op, "qkv");
  return sh;
}

void check_act(const Tensor& t, const Tensor& qkv, int64_t numel, const char* op,
               const char* name) {
  expect_float(t, numel, op, name);
  DS_CUDA_REQUIRE(t.dtype() == qkv.dtype(), std::string(op) + ": " + name + " dtype " +
                                                dtype_name(t.dtype()) + " != qkv dtype " +
                                                dtype_name(qkv.dtype()));
}

void reject_cudnn(const char* op) {
  DS_CUDA_REQUIRE(attention_backend() != AttentionBackend::Cudnn,
                  std::string(op) + ": attention_backend 'cudnn' is not built in this "
                                    "version; use 'flash' or 'plain'");
}

}  // namespace

void attention_forward(const AttentionArgs& a, const Stream& s) {
  const char* op = "attention_forward";
  AttnShape sh = attn_shape(a.qkv, a.NH, op);
  int64_t rows = sh.B * sh.T;
  check_act(a.out, a.qkv, rows * sh.NH * sh.HS, op, "out");
  expect_dtype(a.lse, DType::F32, sh.B * sh.NH * sh.T, op, "lse");
  if (rows == 0) return;
  reject_cudnn(op);
  if (attention_backend() == AttentionBackend::Flash && flash_attention_forward(a, sh, s)) return;
  plain_attention_forward(a, sh, s);
}

void attention_backward(const AttentionBwdArgs& a, const Stream& s) {
  const char* op = "attention_backward";
  AttnShape sh = attn_shape(a.qkv, a.NH, op);
  int64_t rows = sh.B * sh.T;
  check_act(a.dqkv, a.qkv, a.qkv.numel(), op, "dqkv");
  check_act(a.dout, a.qkv, rows * sh.NH * sh.HS, op, "dout");
  check_act(a.out, a.qkv, rows * sh.NH * sh.HS, op, "out");
  expect_dtype(a.lse, DType::F32, sh.B * sh.NH * sh.T, op, "lse");
  if (rows == 0) return;
  reject_cudnn(op);
  if (attention_backend() == AttentionBackend::Flash && flash_attention_backward(a, sh, s))
    return;
  plain_attention_backward(a, sh, s);
}

}  // namespace ds::cuda
