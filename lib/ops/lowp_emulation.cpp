// bf16 / f16 emulation for the CPU backend: grouping of aliased fields,
// exact upcast into per-thread f32 scratch and round-to-nearest-even write-back,
// both through the CPU backend's cast op (fixed chunks: independent of the
// thread count).
#include "lib/ops/lowp_emulation.h"

#include <cstdint>

#include "lib/core/error.h"
#include "lib/ops/op_table.h"

namespace ds::ops {
namespace {

// f32 scratch of group `g` of the calling thread: at least n floats, 64-byte
// aligned, contents undefined, never null. Grows, never shrinks.
float* group_scratch(size_t g, size_t n) {
  thread_local std::vector<std::vector<float>> bufs;
  if (bufs.size() <= g) bufs.resize(g + 1);
  std::vector<float>& v = bufs[g];
  if (v.size() < n + 16) v.resize(n + 16);
  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

void LowpEmulation::add(Tensor& t, const char* name, Role role) {
  DS_CHECK(t.device().is_cpu(), "{}: tensor '{}' is on {}, expected cpu", op_, name,
           device_name(t.device()));
  int group = -1;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Tensor& o = groups_[g].orig;
    if (o.raw() == t.raw() && o.numel() == t.numel() && o.dtype() == t.dtype()) {
      group = static_cast<int>(g);
      break;
    }
    DS_CHECK(!overlaps(o, t),
             "{}: low-precision tensors '{}' ({} {}) and '{}' ({} {}) overlap without being "
             "the same tensor; only identical aliases are supported",
             op_, groups_[g].name, dtype_name(o.dtype()), shape_str(o.shape()), name,
             dtype_name(t.dtype()), shape_str(t.shape()));
  }
  if (group < 0) {
    group = static_cast<int>(groups_.size());
    groups_.push_back({t, name});
  }
  groups_[group].out |= role != Role::In;  // Out, Accum and Stat fields are written
  fields_.push_back({&t, group});
}

void LowpEmulation::upcast() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& gr = groups_[g];
    const int64_t n = gr.orig.numel();
    float* dst = group_scratch(g, static_cast<size_t>(n));  // (n)
    cpu_op_table().cast({Tensor::from_blob(dst, {n}, DType::F32), gr.orig.reshape({n})}, Stream{});  // exact
    gr.f32 = dst;
  }
  for (const Field& f : fields_)
    *f.slot = Tensor::from_blob(groups_[f.group].f32, f.slot->shape(), DType::F32);
}

void LowpEmulation::write_back() {
  for (const Group& gr : groups_) {
    if (!gr.out) continue;
    const int64_t n = gr.orig.numel();
    cpu_op_table().cast({gr.orig.reshape({n}), Tensor::from_blob(gr.f32, {n}, DType::F32)},
                        Stream{});  // nearest even
  }
}

}  // namespace ds::ops
