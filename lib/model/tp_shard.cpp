// Full <-> local tensor-parallel weight mapping, as contiguous runs.
#include "lib/model/tp_shard.h"

#include <cstring>

#include "lib/core/error.h"
#include "lib/model/param_store.h"

namespace ds {
namespace {

// Calls fn(full_off, local_off, count) (offsets within the weight) for each
// contiguous run of local weight p on rank r of tp.
template <class Fn>
void for_each_run(const ParamSpec& p, int tp, int r, Fn fn) {
  if (p.split == TpSplit::Replicated || tp == 1) return fn(int64_t{0}, int64_t{0}, p.numel);
  const int64_t rows = p.full_shape[0];
  const int64_t inner = shape_numel(p.full_shape) / rows;
  if (p.split == TpSplit::Rows) {
    const int64_t block = rows / p.split_groups, local = block / tp;  // rows per group: full, local
    for (int g = 0; g < p.split_groups; ++g)
      fn((g * block + r * local) * inner, g * local * inner, local * inner);
    return;
  }
  const int64_t cols = p.full_shape[1], lc = cols / tp;  // Cols: (rows, cols) -> (rows, lc)
  for (int64_t i = 0; i < rows; ++i) fn(i * cols + r * lc, i * lc, lc);
}

}  // namespace

void slice_tp_params(const ModelLayout& local, const ModelLayout& full, const Tensor& full_buf,
                     const Tensor& local_out) {
  const float* src = full_buf.data<float>();  // (full.total)
  float* dst = local_out.data<float>();       // (local.total)
  for (const ParamSpec& p : local.params) {
    const ParamSpec& f = full.find(p.name);
    for_each_run(p, local.tp, local.tp_rank, [&](int64_t fo, int64_t lo, int64_t n) {
      std::memcpy(dst + p.offset + lo, src + f.offset + fo, n * sizeof(float));
    });
  }
}

void gather_tp_params(Communicator* tp, const ModelLayout& local, const ModelLayout& full, int num_layers,
                      const Tensor& local_buf, const Tensor& full_out) {
  if (local.tp == 1) {
    if (full_out.defined()) Tensor(full_out).copy_from(local_buf.view(0, {local.total}));
    return;
  }
  DS_CHECK(tp && tp->size() == local.tp, "gather_tp_params: tp communicator of size {} for a tp {} layout",
           tp ? tp->size() : 0, local.tp);
  const std::vector<Range> units = unit_ranges(local, num_layers);
  for (const Range& u : units) {
    Tensor all = Tensor::empty({local.tp * u.size()}, DType::F32);  // (tp, unit) rank-major
    tp->all_gather(local_buf.view(u.begin, {u.size()}), all);
    if (!full_out.defined()) continue;
    float* dst = full_out.data<float>();
    for (const ParamSpec& p : local.params) {
      if (p.offset < u.begin || p.offset >= u.end) continue;
      const ParamSpec& f = full.find(p.name);
      for (int r = 0; r < local.tp; ++r) {
        const float* src = all.data<float>() + r * u.size() + (p.offset - u.begin);
        for_each_run(p, local.tp, r, [&](int64_t fo, int64_t lo, int64_t n) {
          std::memcpy(dst + f.offset + fo, src + lo, n * sizeof(float));
        });
      }
    }
  }
}

std::vector<Range> replicated_ranges(const ModelLayout& local) {
  std::vector<Range> out;
  for (const ParamSpec& p : local.params) {
    if (p.split != TpSplit::Replicated) continue;
    if (!out.empty() && out.back().end == p.offset)
      out.back().end += p.numel;
    else
      out.push_back({p.offset, p.offset + p.numel});
  }
  return out;
}

}  // namespace ds
