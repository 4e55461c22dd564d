// Tensor: a typed, shaped, contiguous view of memory on one device.
// A tensor either owns its storage (shared, reference counted) or views part of
// another tensor's storage (flat parameter buffers hand out views per weight).
// Device memory comes from the Allocator registered for that device type; the
// CPU allocator is built in, the CUDA backend registers its caching allocator.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/dtype.h"

namespace ds {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// Memory provider for one device type.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* alloc(size_t bytes, int device_index) = 0;
  virtual void free(void* p, int device_index) = 0;
  virtual void zero(void* p, size_t bytes, int device_index) = 0;
  // Copies between this device and the host (blocking).
  virtual void to_host(void* dst_host, const void* src, size_t bytes, int device_index) = 0;
  virtual void from_host(void* dst, const void* src_host, size_t bytes, int device_index) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, int device_index) = 0;
  // `height` rows of `width` bytes, rows `dpitch` / `spitch` bytes apart, on
  // this device: one strided copy (the CUDA allocator queues a single 2D copy
  // instead of one per row). Default: a copy per row.
  virtual void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                       int device_index) {
    for (size_t i = 0; i < height; ++i)
      copy(static_cast<char*>(dst) + i * dpitch, static_cast<const char*>(src) + i * spitch, width, device_index);
  }
};

void register_allocator(DeviceType t, Allocator* a);
Allocator& allocator_for(Device d);  // throws if the device type has no allocator

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device dev = Device::cpu());
  // Non-owning wrapper around existing memory.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device dev = Device::cpu());

  bool defined() const { return data_ != nullptr; }
  void* raw() const { return data_; }
  template <class T> T* data() const { return static_cast<T*>(data_); }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // Contiguous sub-range [offset, offset + numel(shape)) in elements, new shape.
  Tensor view(int64_t offset_elems, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;  // same elements, new shape
  Tensor clone() const;                      // deep copy on the same device
  Tensor to(Device dev) const;               // deep copy to another device
  void zero_();
  void copy_from(const Tensor& src);         // same numel and dtype, any devices

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
};

// `rows` rows of `row` elements from src (element offset soff, row stride ss)
// to dst (doff, stride ds), on one device, both of one dtype: memcpy per row
// on the CPU, one strided copy on a GPU (packing for all-to-alls).
void copy_rows(const Tensor& dst, int64_t doff, int64_t ds, const Tensor& src, int64_t soff, int64_t ss, int64_t rows,
               int64_t row);

}  // namespace ds
