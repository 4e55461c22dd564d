// The byte-pair merge loop shared by the GPT-2 BPE (vocab.json + merges.txt)
// and the tokenizer.json BPE: a merge table keyed by the adjacent id pair, and
// the loop that merges one pre-token's symbols with it.
#pragma once
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

namespace ds::data {

struct BpeMerge {
  int32_t rank;    // position in the merge list: lower merges first
  int32_t result;  // id of the merged token
};
using BpeMergeTable = std::unordered_map<uint64_t, BpeMerge>;  // bpe_pair_key(left, right) -> merge

inline uint64_t bpe_pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

// Repeatedly merges every occurrence (left to right) of the adjacent pair with
// the lowest merge rank, until no adjacent pair has a merge.
inline void bpe_merge(std::vector<int32_t>& sym, const BpeMergeTable& merges) {
  std::vector<int32_t> next;
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), best_result = -1;
    uint64_t best_key = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      const uint64_t key = bpe_pair_key(sym[k], sym[k + 1]);
      auto it = merges.find(key);
      if (it != merges.end() && it->second.rank < best_rank)
        best_rank = it->second.rank, best_result = it->second.result, best_key = key;
    }
    if (best_result < 0) break;
    const auto left = static_cast<int32_t>(best_key >> 32);
    const auto right = static_cast<int32_t>(best_key & 0xffffffffu);
    next.clear();
    for (size_t k = 0; k < sym.size();) {
      if (k + 1 < sym.size() && sym[k] == left && sym[k + 1] == right) {
        next.push_back(best_result);
        k += 2;
      } else {
        next.push_back(sym[k++]);
      }
    }
    sym.swap(next);
  }
}

}  // namespace ds::data
