// Small file helpers for checkpoint writing and verification: atomic writes
// (lib/core/atomic_file.h), whole-file CRC-32C, and bounded reads of small
// text files (`latest`, state.json).
#pragma once
#include <cstdint>
#include <string>

#include "lib/core/atomic_file.h"

namespace ds {

class Progress;  // lib/core/progress.h

// CRC-32C of a whole file. UserError naming the file if it cannot be read.
// The bytes read are added to `progress` (when given).
uint32_t file_crc32c(const std::string& path, Progress* progress = nullptr);

// The contents of a regular file of at most max_bytes; a larger or unreadable
// file is a UserError naming `what` (e.g. "checkpoint file 'DIR/latest'").
std::string read_small_file(const std::string& path, size_t max_bytes, const std::string& what);

// Checks, before any work, that an output directory (`--save DIR`,
// `--export-hf DIR`) can be written: it is a directory, or the nearest
// existing one above it is a writable directory. `what` names the input
// ("--save") in the UserError.
void check_output_dir(const std::string& path, const std::string& what);
// An output directory as an absolute, normalised path without a trailing
// separator ("out/" and "out" are the same directory).
std::string output_dir_path(const std::string& path);

}  // namespace ds
