// The 1-bit optimizers' shared part (onebit_family.h).
#include "lib/optim/onebit_family.h"

#include <utility>


namespace ds {

OneBitFamily::OneBitFamily(const ModelLayout& layout, Device dev, int64_t begin, int64_t end, bool per_group)
    : Optimizer(layout, begin, end) {
  segs_ = segments_in(begin, end);
  if (!segs_.empty()) seg_table_ = segment_table(segs_, dev);
  if (!per_group) {
    for (const Segment& s : segs_) units_.push_back({s});
    return;
  }
  // Megatron's parameter groups: the tensors that decay first, then the rest.
  for (bool decay : {true, false}) {
    std::vector<Segment> unit;
    for (const Segment& s : segs_)
      if (s.decay == decay) unit.push_back(s);
    if (!unit.empty()) units_.push_back(std::move(unit));
  }
}

void OneBitFamily::exchange_units(const Tensor& x) {
  if (ranks() <= 1) return;
  errors_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const std::vector<Segment>& unit = units_[u];
    if (unit.size() == 1) {  // contiguous: in place
      onebit_all_reduce(*dp_, x.view(unit[0].begin, {unit[0].end - unit[0].begin}), errors_[u]);
      continue;
    }
    int64_t n = 0;
    for (const Segment& s : unit) n += s.end - s.begin;
    if (gathered_.numel() < n) gathered_ = Tensor::empty({n}, DType::F32, x.device());
    int64_t at = 0;
    for (const Segment& s : unit) {
      gathered_.view(at, {s.end - s.begin}).copy_from(x.view(s.begin, {s.end - s.begin}));
      at += s.end - s.begin;
    }
    onebit_all_reduce(*dp_, gathered_.view(0, {n}), errors_[u]);
    at = 0;
    for (const Segment& s : unit) {
      x.view(s.begin, {s.end - s.begin}).copy_from(gathered_.view(at, {s.end - s.begin}));
      at += s.end - s.begin;
    }
  }
}

void OneBitFamily::exchange_whole(const Tensor& x) {
  if (ranks() <= 1) return;
  errors_.resize(1);
  onebit_all_reduce(*dp_, x, errors_[0]);
}

}  // namespace ds
