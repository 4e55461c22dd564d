// attention_forward / attention_backward: argument checks and the choice of
// implementation (flash, flash2, cudnn, plain) from set_attention_backend().
// A fused call that falls back (flash2 -> flash -> plain, cudnn -> flash ->
// plain) says why, once per shape and path, and every call is counted by the
// path that ran (attention_path_counts()).
#include <atomic>
#include <mutex>
#include <set>
#include <tuple>

#include "cuda/attn/attention.h"
#include "cuda/attn/cudnn_sdpa.h"
#include "cuda/core/common.cuh"
#include "cuda/cuda_api.h"
#include "lib/core/log.h"
#include "lib/ops/ops.h"

namespace ds::cuda {
namespace {

std::atomic<int64_t> g_flash_fwd{0}, g_plain_fwd{0}, g_flash_bwd{0}, g_plain_bwd{0};
std::atomic<int64_t> g_flash2_fwd{0}, g_flash2_bwd{0}, g_cudnn_fwd{0}, g_cudnn_bwd{0};

// Logs `why` the first time a (direction, path, shape, dtype) falls back from
// `path` to `next`.
void note_fallback(const char* op, const char* path, const char* next, const AttnShape& sh, DType dt,
                   const std::string& why) {
  static std::mutex mu;
  static std::set<std::tuple<std::string, std::string, int64_t, int64_t, int, int, int>> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert({op, path, sh.B, sh.T, sh.NH, sh.HS, int(dt)}).second) return;
  }
  warn_line(std::string(op) + ": " + path + " attention not used for B=" + std::to_string(sh.B) + " T=" +
            std::to_string(sh.T) + " NH=" + std::to_string(sh.NH) + " HS=" + std::to_string(sh.HS) + " " +
            dtype_name(dt) + " (" + why + "); running the " + next + " kernels");
}

AttnShape attn_shape(const Tensor& qkv, int NH, int NKV, const char* op) {
  const int nkv = NKV == 0 ? NH : NKV;
  AttnShape sh{qkv.size(0), qkv.size(1), NH, int(qkv.size(2) / (NH + 2 * nkv)), nkv};
  DS_CUDA_REQUIRE(sh.HS > 0 && sh.HS <= 256, std::string(op) + ": head size " +
                                                 std::to_string(sh.HS) + " not in [1, 256]");
  return sh;
}

void check_act(const Tensor& t, const Tensor& qkv, const char* op, const char* name) {
  expect_compute(t, qkv.dtype(), op, name, "qkv");
}

}  // namespace

std::string flash_unsupported(const AttnShape& sh, DType dt, std::initializer_list<const Tensor*> ptrs) {
  if (dt != DType::BF16 && dt != DType::F16)
    return std::string("dtype ") + dtype_name(dt) + ": the flash kernels run bf16 and f16";
  if (sh.HS != 64 && sh.HS != 128)
    return "head size " + std::to_string(sh.HS) + ": the flash kernels support 64 and 128";
  for (const Tensor* t : ptrs)
    if ((reinterpret_cast<uintptr_t>(t->raw()) & 15) != 0) return "a tensor is not 16-byte aligned";
  if (sh.T > int64_t(65535) * 64 || sh.NH > 65535 || sh.B > 65535) return "B, T or NH beyond the grid limits";
  return "";
}

AttentionPathCounts attention_path_counts() {
  return {g_flash_fwd.load(), g_plain_fwd.load(), g_flash_bwd.load(), g_plain_bwd.load(),
          g_flash2_fwd.load(), g_flash2_bwd.load(), g_cudnn_fwd.load(), g_cudnn_bwd.load()};
}

void attention_forward(const AttentionArgs& a, const Stream& s) {
  const char* op = "attention_forward";
  AttnShape sh = attn_shape(a.qkv, a.NH, a.NKV, op);
  int64_t rows = sh.B * sh.T;
  check_act(a.out, a.qkv, op, "out");
  DS_CUDA_REQUIRE(!a.lengths.defined(), std::string(op) + ": per-sample lengths (right-padding masks) run on the CPU backend only");
  if (rows == 0) return;
  const AttentionBackend be = attention_backend();
  if (be == AttentionBackend::Cudnn) {
    const std::string why = cudnn_attention_forward(a, sh, s);
    if (why.empty()) {
      g_cudnn_fwd += 1;
      return;
    }
    note_fallback(op, "cudnn", "flash", sh, a.qkv.dtype(), why);
  }
  if (be == AttentionBackend::Flash2) {
    const std::string why = flash2_attention_forward(a, sh, s);
    if (why.empty()) {
      g_flash2_fwd += 1;
      return;
    }
    note_fallback(op, "flash2", "flash", sh, a.qkv.dtype(), why);
  }
  if (be == AttentionBackend::Flash || be == AttentionBackend::Flash2 || be == AttentionBackend::Cudnn) {
    const std::string why = flash_attention_forward(a, sh, s);
    if (why.empty()) {
      g_flash_fwd += 1;
      return;
    }
    note_fallback(op, "flash", "plain", sh, a.qkv.dtype(), why);
  }
  g_plain_fwd += 1;
  plain_attention_forward(a, sh, s);
}

void attention_backward(const AttentionBwdArgs& a, const Stream& s) {
  const char* op = "attention_backward";
  AttnShape sh = attn_shape(a.qkv, a.NH, a.NKV, op);
  int64_t rows = sh.B * sh.T;
  check_act(a.dqkv, a.qkv, op, "dqkv");
  check_act(a.dout, a.qkv, op, "dout");
  check_act(a.out, a.qkv, op, "out");
  DS_CUDA_REQUIRE(!a.lengths.defined(), std::string(op) + ": per-sample lengths (right-padding masks) run on the CPU backend only");
  if (rows == 0) return;
  const AttentionBackend be = attention_backend();
  if (be == AttentionBackend::Cudnn) {
    const std::string why = cudnn_attention_backward(a, sh, s);
    if (why.empty()) {
      g_cudnn_bwd += 1;
      return;
    }
    note_fallback(op, "cudnn", "flash", sh, a.qkv.dtype(), why);
  }
  if (be == AttentionBackend::Flash2) {
    const std::string why = flash2_attention_backward(a, sh, s);
    if (why.empty()) {
      g_flash2_bwd += 1;
      return;
    }
    note_fallback(op, "flash2", "flash", sh, a.qkv.dtype(), why);
  }
  if (be == AttentionBackend::Flash || be == AttentionBackend::Flash2 || be == AttentionBackend::Cudnn) {
    const std::string why = flash_attention_backward(a, sh, s);
    if (why.empty()) {
      g_flash_bwd += 1;
      return;
    }
    note_fallback(op, "flash", "plain", sh, a.qkv.dtype(), why);
  }
  g_plain_bwd += 1;
  plain_attention_backward(a, sh, s);
}

}  // namespace ds::cuda
