// Small file helpers for checkpoint writing and verification: atomic writes
// (temp file, fsync, rename, directory fsync) whose errors are one line naming
// the path ("no space left on device" spelled out), whole-file CRC-32C, and
// bounded reads of small text files (`latest`, state.json).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "lib/core/file_read.h"  // read_small_file: bounded reads of `latest`, state.json

namespace ds {

class Progress;  // lib/core/progress.h

// Throws the UserError for a failed write of `path` with errno `err`:
// "no space left on device writing 'PATH'" for ENOSPC / EDQUOT, else
// "cannot write 'PATH': <strerror>".
[[noreturn]] void throw_write_error(const std::string& path, int err);

// Writes `bytes` to PATH.tmp.<pid>, fsyncs it, renames it to `path` and
// fsyncs the directory. On failure nothing is left at either name. The bytes
// written are added to `progress` (when given) as they go.
void write_file_atomic(const std::string& path, std::string_view bytes, Progress* progress = nullptr);

// CRC-32C of a whole file. UserError naming the file if it cannot be read.
// The bytes read are added to `progress` (when given).
uint32_t file_crc32c(const std::string& path, Progress* progress = nullptr);

// Checks, before any work, that an output directory (`--save DIR`,
// `--export-hf DIR`) can be written: it is a directory, or the nearest
// existing one above it is a writable directory. `what` names the input
// ("--save") in the UserError.
void check_output_dir(const std::string& path, const std::string& what);
// An output directory as an absolute, normalised path without a trailing
// separator ("out/" and "out" are the same directory).
std::string output_dir_path(const std::string& path);

}  // namespace ds
