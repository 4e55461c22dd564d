// Megatron's vocabulary padding (_vocab_size_with_padding): the embedding
// table has a row count that is a multiple of --make-vocab-size-divisible-by
// times the tensor-parallel size. Here in lib/core because the model
// (ModelConfig) and dsprep's data analysis (its vocabulary histogram has
// padded + 1 bins) both use it.
#pragma once

namespace ds {

// Megatron rule: the smallest multiple of divisible_by * tp that is >= vocab.
// Throws UserError unless all three are positive.
int padded_vocab(int vocab, int divisible_by, int tp);

}  // namespace ds
