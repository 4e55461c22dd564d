// Full <-> local tensor-parallel weight mapping, as contiguous runs.
#include "lib/model/tp_shard.h"

#include <cstring>

#include "lib/core/error.h"
#include "lib/model/param_store.h"

namespace ds {
namespace {

Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

}  // namespace

void slice_tp_params(const ModelLayout& local, const ModelLayout& full, const Tensor& full_buf,
                     const Tensor& local_out) {
  // Device buffers are staged through host memory (start-up and checkpoint paths only).
  const Tensor src_h = on_host(full_buf);
  Tensor dst_h = local_out.device().is_cpu() ? local_out : Tensor::empty(local_out.shape(), DType::F32);
  const float* src = src_h.data<float>();  // (full.total)
  float* dst = dst_h.data<float>();        // (local.total)
  for (const ParamSpec& p : local.params) {
    const ParamSpec& f = full.find(p.name);
    for_each_shard_run(p, local.shard, [&](int64_t fo, int64_t lo, int64_t n) {
      std::memcpy(dst + p.offset + lo, src + f.offset + fo, n * sizeof(float));
    });
  }
  if (!local_out.device().is_cpu()) Tensor(local_out).copy_from(dst_h);
}

void place_tp_slices(const ParamSpec& p, int tp, const float* all, int64_t stride, float* full) {
  for (int r = 0; r < tp; ++r)
    for_each_tp_run(p, tp, r, [&](int64_t fo, int64_t lo, int64_t n) {
      std::memcpy(full + fo, all + r * stride + lo, n * sizeof(float));
    });
}

std::vector<Range> duplicate_ranges(const ModelLayout& local) {
  std::vector<Range> out;
  const int tp = local.shard.tp, r = local.shard.tp_rank;
  auto add = [&](int64_t begin, int64_t n) {
    if (!out.empty() && out.back().end == begin)
      out.back().end += n;
    else
      out.push_back({begin, begin + n});
  };
  for (const ParamSpec& p : local.params) {
    if (p.split == TpSplit::Replicated && r != 0) add(p.offset, p.numel);
    if (p.split != TpSplit::Rows || tp == 1) continue;
    // Rows: the row blocks of each expert's matrix (one matrix unless ep_split).
    const int64_t matrices = p.ep_split ? p.shape[0] : 1, per = p.numel / matrices;
    int64_t local_rows = 0;
    for (const RowBlock& b : p.row_blocks) local_rows += b.rows / b.parts;
    const int64_t inner = per / local_rows;
    for (int64_t e = 0; e < matrices; ++e) {
      int64_t local_at = 0;
      for (const RowBlock& b : p.row_blocks) {
        const int64_t rows = b.rows / b.parts;
        if (r % (tp / b.parts) != 0) add(p.offset + e * per + local_at * inner, rows * inner);
        local_at += rows;
      }
    }
  }
  return out;
}

}  // namespace ds
