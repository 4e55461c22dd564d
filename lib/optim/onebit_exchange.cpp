// The error-compensated 1-bit all-reduce (onebit_exchange.h).
#include "lib/optim/onebit_exchange.h"

#include <numeric>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

int64_t onebit_padded_size(int64_t n, int world) {
  const int64_t divider = static_cast<int64_t>(world) * 8 / std::gcd(world, 8);  // lcm(world, 8)
  const int64_t unit = world * divider;
  return (n + unit - 1) / unit * unit;
}

int64_t onebit_bytes_sent(int64_t n, int world) {
  if (world <= 1) return 0;
  const int64_t np = onebit_padded_size(n, world), chunk_bytes = np / world / 8;
  return (world - 1) * chunk_bytes            // all-to-all: the other ranks' chunks of this rank's signs
         + (world - 1) * chunk_bytes          // all-gather: this rank's server signs to every other rank
         + 2 * (world - 1) * int64_t{4};      // the worker and server scales
}

void onebit_all_reduce(Communicator& c, const Tensor& x, OneBitErrors& e) {
  const int W = c.size();
  if (W <= 1) return;
  const int64_t n = x.numel(), np = onebit_padded_size(n, W), chunk = np / W, chunk_bytes = chunk / 8;
  const Device dev = x.device();
  DS_CHECK(x.dtype() == DType::F32, "1-bit all-reduce of {} elements", dtype_name(x.dtype()));
  if (!e.worker.defined() || e.worker.numel() != np) e.worker = Tensor::zeros({np}, DType::F32, dev);
  if (!e.server.defined() || e.server.numel() != chunk) e.server = Tensor::zeros({chunk}, DType::F32, dev);
  auto scale_of = [&](const Tensor& v) {  // the sum of squares the pack turns into a scale
    Tensor ss = Tensor::zeros({1}, DType::F32, dev);
    ops::sum_squares({.out = ss, .x = v}, Stream{});
    return ss;
  };
  // Worker: the input plus its last error (the padding adds nothing),
  // compressed; the buffer is left holding the new error b - s sign(b).
  const Tensor b = e.worker;
  if (n > 0) ops::add({.out = b.view(0, {n}), .a = b.view(0, {n}), .b = x}, Stream{});
  Tensor signs = Tensor::empty({np / 8}, DType::U8, dev), recv = Tensor::empty({np / 8}, DType::U8, dev);
  Tensor worker_scale = Tensor::empty({1}, DType::F32, dev), scales = Tensor::empty({W}, DType::F32, dev);
  ops::onebit_pack({.bits = signs, .scale = worker_scale, .x = b, .sumsq = scale_of(b)}, Stream{});
  c.all_to_all(signs.raw(), recv.raw(), chunk_bytes, DType::U8);
  c.all_gather(worker_scale.raw(), scales.raw(), 1, DType::F32);
  // Server: this rank's chunk, the mean of the ranks' compressed values plus
  // its error, compressed in place (leaving the new error).
  ops::onebit_server({.x = e.server, .bits = recv, .scales = scales}, Stream{});
  Tensor server_signs = Tensor::empty({chunk_bytes}, DType::U8, dev), server_scale = Tensor::empty({1}, DType::F32, dev);
  ops::onebit_pack({.bits = server_signs, .scale = server_scale, .x = e.server, .sumsq = scale_of(e.server)},
                   Stream{});
  // Every chunk's signs and scale to every rank.
  c.all_gather(server_signs.raw(), signs.raw(), chunk_bytes, DType::U8);
  c.all_gather(server_scale.raw(), scales.raw(), 1, DType::F32);
  if (n > 0) ops::onebit_unpack({.out = x, .bits = signs, .scales = scales, .chunk = chunk}, Stream{});
}

void onebit_all_reduce(Communicator& c, float* x, int64_t n, OneBitErrors& e) {
  onebit_all_reduce(c, Tensor::from_blob(x, {n}, DType::F32, Device::cpu()), e);
}

}  // namespace ds
