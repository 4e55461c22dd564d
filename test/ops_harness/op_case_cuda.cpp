// The CUDA modes of the op-test harness (see op_case_cuda.h).
#include "test/ops_harness/op_case_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/cuda_api.h"
#include "lib/core/rng.h"
#include "test/skip.h"

namespace ds::test {

bool gpu_or_skip() {
  static int state = -1;  // -1 unknown, 0 skip, 1 available
  if (state < 0) {
    if (ds::cuda::device_available()) {
      ds::cuda::init_device(0);
      std::printf("CUDA device: %s\n", ds::cuda::device_name().c_str());
      state = 1;
    } else {
      state = 0;
    }
  }
  if (state == 0) note_skip("no CUDA device (" + ds::cuda::unavailable_reason() + ")");
  return state == 1;
}

Tensor randn(const Shape& shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(normal_at(seed, 17, uint64_t(i))) * scale;
  return t;
}

Tensor randint(const Shape& shape, uint64_t seed, int lo, int hi) {
  Tensor t = Tensor::empty(shape, DType::I32);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = lo + int(rng.below(hi - lo));
  return t;
}

namespace {

float round_one(float x, DType dt) {
  if (dt == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
  if (dt == DType::F16) return f16_to_f32(f32_to_f16(x));
  return x;
}

Tensor to_dtype_host(const Tensor& f32, DType dt) {
  if (dt == DType::F32) return f32.clone();
  Tensor t = Tensor::empty(f32.shape(), dt);
  auto* o = t.data<uint16_t>();
  const float* in = f32.data<float>();
  for (int64_t i = 0; i < f32.numel(); ++i)
    o[i] = dt == DType::BF16 ? f32_to_bf16(in[i]) : f32_to_f16(in[i]);
  return t;
}

}  // namespace

Tensor round_to(const Tensor& f32, DType dt) {
  Tensor t = f32.clone();
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = round_one(t.data<float>()[i], dt);
  return t;
}

Tensor upload(const Tensor& host, DType dt) {
  if (host.dtype() != DType::F32) return host.to(Device::cuda(0));
  return to_dtype_host(host, dt).to(Device::cuda(0));
}

Tensor download_f32(const Tensor& dev) {
  Tensor h = dev.to(Device::cpu());
  if (h.dtype() == DType::F32 || h.dtype() == DType::I32) return h;
  Tensor t = Tensor::empty(h.shape(), DType::F32);
  const auto* in = h.data<uint16_t>();
  for (int64_t i = 0; i < h.numel(); ++i)
    t.data<float>()[i] = h.dtype() == DType::BF16 ? bf16_to_f32(in[i]) : f16_to_f32(in[i]);
  return t;
}

double rel_err(const Tensor& a, const Tensor& ref) {
  REQUIRE(a.numel() == ref.numel());
  // f32, or i32 outputs (ids, slots, counts) compared as their values.
  auto value = [](const Tensor& t, int64_t i) {
    return t.dtype() == DType::I32 ? double(t.data<int32_t>()[i]) : double(t.data<float>()[i]);
  };
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = value(a, i), y = value(ref, i);
    if (!std::isfinite(x)) return INFINITY;
    num = std::max(num, std::fabs(x - y));
    den = std::max(den, std::fabs(y));
  }
  return den == 0 ? num : num / den;
}

namespace {

// Host f32 copies of all fields, Act fields rounded through dt when `round`.
TensorMap rounded_copies(const Fields& fields, DType dt, bool round) {
  TensorMap m;
  for (auto& [name, f] : fields)
    m[name] = (round && f.kind == Kind::Act) ? round_to(f.host, dt) : f.host.clone();
  return m;
}

// Device copies; with offset > 0 each Act/F32 field is a view starting
// `offset` elements (Staggered: offset times the field's position in the
// list) into a larger allocation, as parameters are views into one flat
// buffer; odd offsets break 16-byte alignment.
TensorMap device_copies(const Fields& fields, DType dt, int64_t offset = 0,
                        OffsetMode mode = OffsetMode::Same) {
  TensorMap m;
  int64_t k = 0;
  for (auto& [name, f] : fields) {
    Tensor t = upload(f.host, f.kind == Kind::Act ? dt : DType::F32);
    const int64_t off = mode == OffsetMode::Same ? offset : offset * ++k;
    if (off > 0 && f.kind != Kind::Int) {
      Tensor big = Tensor::zeros({t.numel() + off}, t.dtype(), t.device());
      Tensor v = big.view(off, t.shape());
      v.copy_from(t);
      t = v;
    }
    m[name] = t;
  }
  return m;
}

}  // namespace

void check_cuda_vs_cpu(const OpCase& c, DType dt, int64_t offset, OffsetMode mode) {
  TensorMap ref = rounded_copies(c.fields, dt, false);
  c.run(ref);
  TensorMap base;
  if (dt != DType::F32) {
    base = rounded_copies(c.fields, dt, true);
    (c.baseline ? c.baseline : c.run)(base);
  }
  TensorMap dev = device_copies(c.fields, dt, offset, mode);
  c.run(dev);
  ds::cuda::synchronize();
  for (auto& [name, f] : c.fields) {
    if (!f.output) continue;
    Tensor got = download_f32(dev[name]);
    double err = rel_err(got, ref[name]);
    INFO(c.name << " [" << dtype_name(dt) << "] offset " << offset
                << (mode == OffsetMode::Staggered ? " staggered" : "") << " field " << name << ": rel err "
                << err);
    if (dt == DType::F32) {
      CHECK(err <= c.f32_tol);
    } else {
      Tensor b = f.kind == Kind::Act ? round_to(base[name], dt) : base[name];
      double berr = rel_err(b, ref[name]);
      INFO("naive " << dtype_name(dt) << " baseline rel err " << berr);
      CHECK(err <= 2.0 * berr + 1e-6);
    }
  }
}

void check_cuda_vs_cpu_offsets(const OpCase& c, DType dt) {
  for (int64_t off : {0, 1, 3, 8}) check_cuda_vs_cpu(c, dt, off);
  check_cuda_vs_cpu(c, dt, 1, OffsetMode::Staggered);
}

double time_cuda(const OpCase& c, DType dt, int iters) {
  TensorMap dev = device_copies(c.fields, dt);
  c.run(dev);  // warm-up
  ds::cuda::synchronize();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> us;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(e0);
    c.run(dev);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    us.push_back(ms * 1e3f);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(us.begin(), us.end());
  return us.empty() ? 0.0 : us[us.size() / 2];
}

}  // namespace ds::test
