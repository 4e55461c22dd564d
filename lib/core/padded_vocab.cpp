// Megatron's vocabulary padding rule (see padded_vocab.h).
#include "lib/core/padded_vocab.h"

#include <cstdint>

#include "lib/core/error.h"

namespace ds {

int padded_vocab(int vocab, int divisible_by, int tp) {
  DS_USER_CHECK(vocab > 0 && divisible_by > 0 && tp > 0,
                "padded vocab: vocab {}, make_vocab_size_divisible_by {} and tp {} must be positive", vocab,
                divisible_by, tp);
  const int64_t multiple = static_cast<int64_t>(divisible_by) * tp;
  return static_cast<int>((vocab + multiple - 1) / multiple * multiple);
}

}  // namespace ds
