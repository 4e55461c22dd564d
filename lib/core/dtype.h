// Element types and devices shared by tensors, ops and checkpoints.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ds {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U16, U8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);      // "f32", "bf16", ...
DType dtype_from_name(const std::string& s);  // throws UserError on unknown

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};
std::string device_name(Device d);

// bf16 / fp16 conversions on the host (round to nearest even).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace ds
