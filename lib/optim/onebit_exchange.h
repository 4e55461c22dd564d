// DeepSpeed's error-compensated 1-bit all-reduce, the exchange behind
// 1-bit Adam, 0/1 Adam and 1-bit Lamb (DeepSpeed: runtime/comm/nccl.py,
// compressed_allreduce): each rank sends one sign bit per element and one
// scale, and the compression errors are fed back into the next call.
//
// With W ranks, x (n f32 elements, the same n on every rank) is padded with
// zeros to n' (a multiple of W x lcm(W, 8), so that every rank's chunk of
// n'/W elements packs into whole bytes):
//   worker:  b = x + worker_error;  s = ||b|| / sqrt(n');
//            worker_error = b - s sign(b)           (sign(0) = +1)
//            rank j receives every rank's sign bits of chunk j (all-to-all)
//            and every rank's s (all-gather);
//   server:  c = sum_i s_i / W sign_i + server_error  (chunk j, n'/W elements);
//            t = ||c|| / sqrt(n'/W);  server_error = c - t sign(c)
//            every rank receives every chunk's sign bits and t (all-gather);
//   result:  x = t_j sign(c_j) on chunk j, the first n elements.
// The result is the same on every rank: the compressed mean of the inputs.
// Bytes a rank sends: (W-1)/W n'/8 signs + the chunk's n'/(8W) bits to W-1
// ranks + 2 (W-1) scales, against about 2 (W-1)/W 4n for a ring all-reduce of f32.
// Norms: the sum of squares (ops::sum_squares) rounded to f32, then the
// square root and the division by sqrt(n) in double, rounded to f32.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/tensor.h"

namespace ds {

// One tensor's error-feedback buffers (zeros at first; DeepSpeed resets
// them when a checkpoint is loaded), on the device of the exchange.
struct OneBitErrors {
  Tensor worker;  // n' f32 elements
  Tensor server;  // n' / W f32 elements
};

// n' for n elements over `world` ranks.
int64_t onebit_padded_size(int64_t n, int world);

// The bytes one rank sends in onebit_all_reduce of n elements over `world` ranks.
int64_t onebit_bytes_sent(int64_t n, int world);

// x (f32, n elements, on c's device: host memory with Gloo, the GPU with
// NCCL) <- the compressed mean over c's ranks; e is sized on first use and
// must stay with this tensor. The element-wise steps are ops (onebit_pack,
// onebit_server, onebit_unpack; the norms sum_squares), the packed signs and
// scales go through c's all-to-all and all-gathers. One rank: x is unchanged
// and nothing is compressed. Collective: every rank calls it with the same n.
void onebit_all_reduce(Communicator& c, const Tensor& x, OneBitErrors& e);
// The same on host memory (the CPU backend's optimizers).
void onebit_all_reduce(Communicator& c, float* x, int64_t n, OneBitErrors& e);

}  // namespace ds
