// DeepSpeed-Chat's data phases: `--data_split 2,4,4` gives each of the three
// training steps (SFT, reward model, PPO) its own part of every dataset, and
// `--seed` shuffles which examples fall in which part. A user moving a run
// from DeepSpeed-Chat expects the same examples in each phase, so the split
// boundaries and the shuffle are reproduced exactly: numpy's legacy
// RandomState(seed).shuffle of arange(n) (MT19937 seeded by init_genrand,
// Fisher-Yates from the end with masked rejection sampling), and the
// boundaries int(round(w_i / sum(w) * n)) accumulated, shifted so the last is n
// (Python's round: half to even).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds::chat {

// "2,4,4" -> {2, 4, 4}: comma-separated finite numbers >= 0, not all zero,
// at most 16. `what` names the input in the one-line UserError.
std::vector<double> parse_data_split(const std::string& text, const std::string& what);

// The phase boundaries of n examples: b[0] = 0, b[k + 1] = b[k] +
// round(w_k / sum(w) * n), then every b[k >= 1] shifted so that b.back() == n.
std::vector<int64_t> split_boundaries(const std::vector<double>& weights, int64_t n);

// numpy.random.RandomState(seed) then shuffle(arange(n)): the permutation.
std::vector<int64_t> numpy_shuffled_range(uint32_t seed, int64_t n);

// The examples of phase `phase` (0-based) of n: the shuffled indices in
// [b[phase], b[phase + 1]), as DeepSpeed-Chat's get_raw_dataset_split_index.
std::vector<int64_t> phase_indices(const std::vector<double>& weights, int phase, uint32_t seed, int64_t n);

}  // namespace ds::chat
