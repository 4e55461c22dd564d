// Parameter units of a layout and the flat (unsharded) parameter store.
#include "lib/model/param_store.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

std::vector<Range> unit_ranges(const ModelLayout& layout, int num_layers) {
  std::vector<Range> units(num_layers + 2, Range{-1, -1});
  for (const ParamSpec& p : layout.params) {
    const int u = unit_of(p);
    DS_CHECK(u >= 0 && u < num_layers + 2, "parameter '{}' has layer {} outside -1..{}", p.name, p.layer, num_layers);
    Range& r = units[u];
    if (r.begin < 0) r = {p.offset, p.offset};
    DS_CHECK(r.end == p.offset, "parameter '{}' is not contiguous with the rest of its unit {}", p.name, u);
    r.end = p.offset + p.numel;
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].begin < 0) {  // not on this pipeline stage: an empty unit where it would be
      const int64_t at = u == 0 ? 0 : units[u - 1].end;
      units[u] = {at, at};
    }
    DS_CHECK(u == 0 || units[u].begin == units[u - 1].end, "parameter units {} and {} are not adjacent", u - 1, u);
  }
  return units;
}

FlatParamStore::FlatParamStore(const ModelLayout& layout, int num_layers, Device dev, int64_t alloc_elems,
                               DType compute)
    : units_(unit_ranges(layout, num_layers)), total_(layout.total) {
  const int64_t n = std::max(alloc_elems, layout.total);
  params_ = Tensor::zeros({n}, DType::F32, dev);
  grads_ = Tensor::zeros({n}, DType::F32, dev);
  if (compute != DType::F32) compute_ = Tensor::zeros({total_}, compute, dev);
}

Tensor FlatParamStore::acquire_params(int unit) {
  const Range& r = units_.at(unit);
  return (compute_.defined() ? compute_ : params_).view(r.begin, {r.size()});
}

void FlatParamStore::params_updated() {
  if (compute_.defined() && total_ > 0) ops::cast({.out = compute_, .inp = params_.view(0, {total_})}, Stream{});
}

Tensor FlatParamStore::acquire_grads(int unit) {
  const Range& r = units_.at(unit);
  notify_grads(unit, false);
  return grads_.view(r.begin, {r.size()});
}

void FlatParamStore::set_full_params(const Tensor& full) {
  params_.view(0, {total_}).copy_from(full);
  params_updated();
}

void FlatParamStore::get_full_params(const Tensor& out) {
  if (!out.defined()) return;
  Tensor o = out;
  o.copy_from(params_.view(0, {total_}));
}

}  // namespace ds
