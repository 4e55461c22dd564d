// The order in which DeepSpeed-Chat's steps visit their examples. Its
// main.py files draw batches through PyTorch's DistributedSampler (every
// launch through the deepspeed runner passes --local_rank, which selects it)
// with its defaults: shuffle on, seed 0, drop_last off, and set_epoch never
// called, so every epoch visits the examples in the same order. The
// permutation is torch.randperm on the CPU generator, reproduced exactly:
// MT19937 seeded by init_genrand(seed mod 2^32); below n = (2^32 - 1) / 20,
// Fisher-Yates from the front with each swap partner drawn as
// random() % (n - i); at and above it, the inside-out variant with 64-bit
// draws (two 32-bit outputs, the first the high word) modulo i + 1 (checked
// by hand against torch 2.15 at n = 214748364; the test covers the first).
#pragma once
#include <cstdint>
#include <vector>

namespace ds::chat {

// torch.Generator().manual_seed(seed), then torch.randperm(n, generator=g).
std::vector<int64_t> torch_randperm(uint64_t seed, int64_t n);

// DistributedSampler(dataset of n examples, num_replicas=replicas, rank=rank,
// shuffle=True, seed=seed, drop_last=False) after set_epoch(epoch): the
// permutation of n by seed + epoch, padded to a multiple of `replicas` by
// repeating it from its start, and every replicas-th index from `rank`.
// Each rank gets ceil(n / replicas) indices. n >= 1.
std::vector<int64_t> distributed_sampler_indices(int64_t n, int replicas, int rank, uint64_t seed = 0,
                                                 int64_t epoch = 0);

}  // namespace ds::chat
