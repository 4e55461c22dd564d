// PyTorch's randperm and DistributedSampler order (torch_sampler.h).
#include "lib/chat/torch_sampler.h"

#include <random>
#include <utility>

#include "lib/core/error.h"

namespace ds::chat {

std::vector<int64_t> torch_randperm(uint64_t seed, int64_t n) {
  DS_CHECK(n >= 0, "torch_randperm: n {} < 0", n);
  std::vector<int64_t> r(static_cast<size_t>(n));
  std::mt19937 mt(static_cast<uint32_t>(seed));  // at::mt19937: init_genrand(seed & 0xffffffff)
  if (n < static_cast<int64_t>(UINT32_MAX / 20)) {
    for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int64_t z = static_cast<int64_t>(mt() % static_cast<uint64_t>(n - i));
      std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
    }
    return r;
  }
  for (int64_t i = 0; i < n; ++i) {  // inside-out, 64-bit draws
    const uint64_t hi = mt();
    const uint64_t draw = (hi << 32) | mt();
    const auto z = static_cast<size_t>(draw % static_cast<uint64_t>(i + 1));
    r[static_cast<size_t>(i)] = r[z];
    r[z] = i;
  }
  return r;
}

std::vector<int64_t> distributed_sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch) {
  DS_CHECK(n >= 1 && replicas >= 1 && rank >= 0 && rank < replicas,
           "distributed_sampler_indices: n {} replicas {} rank {}", n, replicas, rank);
  const std::vector<int64_t> perm = torch_randperm(seed + static_cast<uint64_t>(epoch), n);
  const int64_t per_rank = (n + replicas - 1) / replicas;
  std::vector<int64_t> out(static_cast<size_t>(per_rank));
  // Position rank + k * replicas of the permutation repeated from its start.
  for (int64_t k = 0; k < per_rank; ++k)
    out[static_cast<size_t>(k)] = perm[static_cast<size_t>((rank + k * replicas) % n)];
  return out;
}

}  // namespace ds::chat
