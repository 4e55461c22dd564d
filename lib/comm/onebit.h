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
// Norms are accumulated in double and rounded to f32.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/comm/communicator.h"

namespace ds {

// One tensor's error-feedback buffers (zeros at first; DeepSpeed resets
// them when a checkpoint is loaded).
struct OneBitErrors {
  std::vector<float> worker;  // n' elements
  std::vector<float> server;  // n' / W elements
};

// n' for n elements over `world` ranks.
int64_t onebit_padded_size(int64_t n, int world);

// The bytes one rank sends in onebit_all_reduce of n elements over `world` ranks.
int64_t onebit_bytes_sent(int64_t n, int world);

// x (host f32, n elements) <- the compressed mean over c's ranks; e is sized
// on first use and must stay with this tensor. One rank: x is unchanged and
// nothing is compressed. Collective: every rank calls it with the same n.
void onebit_all_reduce(Communicator& c, float* x, int64_t n, OneBitErrors& e);

}  // namespace ds
