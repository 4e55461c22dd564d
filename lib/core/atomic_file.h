// Files that appear whole or not at all: a temporary beside the final name,
// written in full and fsynced, then renamed into place (and the directory
// fsynced). Errors are one line naming the path, with "No space left on
// device" spelled out. StagedFiles put several files in place as a set: all
// are written before any is renamed, and a failed rename puts the old ones
// back. Used by checkpoints (lib/ckpt/file_io.h), dsprep's tokenizer files,
// dsplot's outputs and the CSV monitor.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

class Progress;  // lib/core/progress.h

// Throws the UserError for a failed write of `path` with errno `err`:
// "cannot write 'PATH': No space left on device (free some space and
// retry)" for ENOSPC / EDQUOT, else "cannot write 'PATH': <strerror>".
[[noreturn]] void throw_write_error(const std::string& path, int err);

// Writes all n bytes to fd, retrying short writes; returns 0 or the errno of
// the failure. The bytes written are added to `progress` (when given).
int write_all_fd(int fd, const char* p, size_t n, Progress* progress = nullptr);

// Writes `bytes` to PATH.tmp.<pid>, fsyncs it, renames it to `path` and
// fsyncs the directory. On failure nothing is left at either name. The bytes
// written are added to `progress` (when given) as they go.
void write_file_atomic(const std::string& path, std::string_view bytes, Progress* progress = nullptr);
// The same for a file made of `pieces` written one after the other (no copy
// of the whole file in memory: safetensors header, then each tensor).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces,
                       Progress* progress = nullptr);
// The same for a file whose bytes `produce` hands to its sink in order, as
// they are made (a checkpoint's weights gathered one tensor at a time). A
// write error stops the writing but not `produce`, which runs to its end
// (its collectives stay in step with the other ranks'); then the error is
// thrown and nothing is left at either name.
using ByteSink = std::function<void(std::string_view)>;
void write_file_atomic_stream(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                              Progress* progress = nullptr);

// Several files put in place together. stage() writes and fsyncs each
// PATH.tmp.<pid> (a failure removes every temporary and throws); commit()
// then renames them in the order staged. Before the first rename each
// existing file is hard-linked to PATH.old.<pid>; if a rename fails, the
// files already renamed get their old contents back (or are removed when
// there was none), the backups and temporaries are removed, and the error
// says the old files are kept. A crash between two renames leaves the files
// renamed so far new, the rest old, and their .old.<pid> / .tmp.<pid> files
// beside them. Destruction without commit() removes the temporaries.
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles();
  void stage(const std::string& path, std::string_view bytes);
  void commit();

 private:
  struct Entry {
    std::string path, tmp, backup;  // backup: empty when there was no old file
  };
  void discard();
  bool restore(size_t renamed);  // undoes the first `renamed` renames; false if one could not be undone
  std::vector<Entry> files_;
};

}  // namespace ds
