// Bounded reads of input files the user names (tokenizer files, checkpoint
// metadata): only a regular file of at most a stated size is read, so that a
// directory, a FIFO, a device (/dev/zero: an unbounded read) or an oversized
// file is one UserError naming the input, never a hang or an exhausted host.
#pragma once
#include <cstddef>
#include <string>

namespace ds {

// The contents of the regular file `path` of at most max_bytes. Anything
// else (missing, unreadable, not a regular file, larger) is a UserError
// beginning with `what` (e.g. "--vocab-file 'x/vocab.json'"). A FIFO is
// refused without waiting for a writer.
std::string read_small_file(const std::string& path, size_t max_bytes, const std::string& what);

}  // namespace ds
