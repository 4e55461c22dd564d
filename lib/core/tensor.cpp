// Tensor storage, views and copies; the built-in CPU allocator.
#include "lib/core/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "lib/core/error.h"
#include "lib/core/mem_tag.h"

namespace ds {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* alloc(size_t bytes, int) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    // Out of memory is the configuration's doing (a model, batch or sequence
    // too large for this machine), not a bug: one line, no source location.
    DS_USER_CHECK(p != nullptr, "out of host memory: allocating {} bytes ({:.1f} GiB) failed; the model, micro "
                  "batch or sequence length is too large for this machine", bytes, bytes / 1073741824.0);
    advise_huge_pages(p, bytes);
    return p;
  }
  // A large buffer is backed by 2 MiB pages where the kernel allows it
  // (transparent huge pages in "madvise" or "always" mode): one page fault
  // per 2 MiB instead of per 4 KiB when it is first written. On the
  // development VM a 4 KiB fault costs ~10 us of system time, which made
  // loading a 2.4 GB checkpoint (staging buffers, then the destination)
  // take 7 s; docs/benchmarks.md, "Checkpoint I/O". Only whole 2 MiB pages
  // inside the buffer are advised, so nothing outside it is committed.
  static void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__)
    constexpr size_t kHuge = size_t(2) << 20, kMin = size_t(16) << 20;
    if (bytes < kMin) return;
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) / kHuge * kHuge;
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
  }
  void free(void* p, int) override { std::free(p); }
  void zero(void* p, size_t bytes, int) override { std::memset(p, 0, bytes); }
  void to_host(void* d, const void* s, size_t n, int) override { std::memcpy(d, s, n); }
  void from_host(void* d, const void* s, size_t n, int) override { std::memcpy(d, s, n); }
  void copy(void* d, const void* s, size_t n, int) override { std::memmove(d, s, n); }
};

Allocator* g_allocators[2] = {nullptr, nullptr};
CpuAllocator g_cpu_allocator;

}  // namespace

void register_allocator(DeviceType t, Allocator* a) { g_allocators[static_cast<int>(t)] = a; }

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return g_allocators[0] ? *g_allocators[0] : g_cpu_allocator;
  Allocator* a = g_allocators[static_cast<int>(d.type)];
  DS_CHECK(a != nullptr, "no allocator for device {} (built without CUDA or not initialised)",
           device_name(d));
  return *a;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device dev) {
  for (int64_t d : shape) DS_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = dev;
  Allocator& a = allocator_for(dev);
  size_t bytes = t.nbytes();
  void* p = a.alloc(bytes == 0 ? 1 : bytes, dev.index);
  int idx = dev.index;
  // A tagged allocation (lib/core/mem_tag.h) is counted while its storage lives.
  const MemTag tag = current_mem_tag();
  const auto counted = static_cast<int64_t>(bytes);
  count_tagged_bytes(tag, dev.type, counted);
  t.storage_ = std::shared_ptr<void>(p, [&a, idx, tag, dev, counted](void* q) {
    a.free(q, idx);
    count_tagged_bytes(tag, dev.type, -counted);
  });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device dev) {
  Tensor t = empty(shape, dtype, dev);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device dev) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = dev;
  t.data_ = data;
  return t;
}

Tensor Tensor::view(int64_t offset, const Shape& shape) const {
  DS_CHECK(offset >= 0 && offset + shape_numel(shape) <= numel(),
           "view [{}, +{}) out of range of tensor {}", offset, shape_numel(shape), shape_str(shape_));
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_ = shape;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  DS_CHECK(shape_numel(shape) == numel(), "reshape {} -> {} changes the element count",
           shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::to(Device dev) const {
  Tensor t = empty(shape_, dtype_, dev);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (numel() > 0) allocator_for(device_).zero(data_, nbytes(), device_.index);
}

void Tensor::copy_from(const Tensor& src) {
  DS_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: {} {} <- {} {}",
           dtype_name(dtype_), shape_str(shape_), dtype_name(src.dtype()), shape_str(src.shape()));
  size_t n = nbytes();
  if (n == 0) return;
  if (device_ == src.device_) {
    allocator_for(device_).copy(data_, src.data_, n, device_.index);
  } else if (device_.is_cpu()) {
    allocator_for(src.device_).to_host(data_, src.data_, n, src.device_.index);
  } else if (src.device_.is_cpu()) {
    allocator_for(device_).from_host(data_, src.data_, n, device_.index);
  } else {
    Tensor host = src.to(Device::cpu());
    copy_from(host);
  }
}

void copy_rows(const Tensor& dst, int64_t doff, int64_t ds, const Tensor& src, int64_t soff, int64_t ss, int64_t rows,
               int64_t row) {
  if (ds == row && ss == row) {  // contiguous: one copy
    row *= rows;
    rows = 1;
    ds = ss = row;
  }
  const size_t es = dtype_size(dst.dtype()), bytes = static_cast<size_t>(row) * es;
  char* d = static_cast<char*>(dst.raw()) + doff * es;
  const char* s = static_cast<const char*>(src.raw()) + soff * es;
  if (dst.device().is_cpu()) {
    for (int64_t i = 0; i < rows; ++i) std::memcpy(d + i * ds * es, s + i * ss * es, bytes);
    return;
  }
  allocator_for(dst.device()).copy_2d(d, ds * es, s, ss * es, bytes, rows, dst.device().index);  // one strided copy
}

}  // namespace ds
