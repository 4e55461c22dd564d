// Small file helpers for checkpoint writing and verification: atomic writes
// (lib/core/atomic_file.h), removal of the temporaries killed writers left,
// whole-file CRC-32C, and bounded reads of small text files (`latest`,
// state.json).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/atomic_file.h"
#include "lib/core/file_read.h"  // read_small_file: bounded reads of `latest`, state.json

namespace ds {

class Progress;  // lib/core/progress.h

// Removes what killed writers left in `dir`: entries (files or directories)
// named NAME.tmp.<pid> (write_file_atomic's temporary files) or
// NAME.tmp-<pid> (export_hf's temporary directory) whose <pid> names no
// process on this host (kill(pid, 0) fails with ESRCH). A live process's
// temporaries are never touched. With a `stem`, only STEM.tmp.<pid> /
// STEM.tmp-<pid> (for a directory that is not ours, such as an export's
// parent); without one, every such entry, also inside the temporary step
// directories (`.tmp-*`) of `dir`. Best effort: what cannot be removed stays.
// Call it before a save writes, in one process only (dstrain: rank 0, then a
// barrier): another host's pids cannot be checked here. Returns the paths
// removed.
std::vector<std::string> remove_stale_temporaries(const std::string& dir, const std::string& stem = "");

// CRC-32C of a whole file. UserError naming the file if it cannot be read.
// The bytes read are added to `progress` (when given).
uint32_t file_crc32c(const std::string& path, Progress* progress = nullptr);
// The same pass, with the CRC-32C of each `chunk` bytes of the file as well
// (the last chunk may be shorter): chunks[i] covers [i * chunk, (i + 1) * chunk).
uint32_t file_crc32c(const std::string& path, uint64_t chunk, std::vector<uint32_t>& chunks,
                     Progress* progress = nullptr);

// Checks, before any work, that an output directory (`--save DIR`,
// `--export-hf DIR`) can be written: it is a directory, or the nearest
// existing one above it is a writable directory. `what` names the input
// ("--save") in the UserError.
void check_output_dir(const std::string& path, const std::string& what);
// An output directory as an absolute, normalised path without a trailing
// separator ("out/" and "out" are the same directory).
std::string output_dir_path(const std::string& path);

}  // namespace ds
