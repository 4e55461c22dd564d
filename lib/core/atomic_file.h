// Files that appear whole or not at all: a temporary beside the final name,
// written in full and fsynced, then renamed into place (and the directory
// fsynced). Errors are one line naming the path, with "no space left on
// device" spelled out. Below lib/ckpt so that every tool can use them.
#pragma once
#include <string>
#include <string_view>

namespace ds {

class Progress;  // lib/core/progress.h

// Throws the UserError for a failed write of `path` with errno `err`:
// "no space left on device writing 'PATH'" for ENOSPC / EDQUOT, else
// "cannot write 'PATH': <strerror>".
[[noreturn]] void throw_write_error(const std::string& path, int err);

// Writes all n bytes to fd, retrying short writes; returns 0 or the errno of
// the failure. The bytes written are added to `progress` (when given).
int write_all_fd(int fd, const char* p, size_t n, Progress* progress = nullptr);

// Writes `bytes` to PATH.tmp.<pid>, fsyncs it, renames it to `path` and
// fsyncs the directory. On failure nothing is left at either name. The bytes
// written are added to `progress` (when given) as they go.
void write_file_atomic(const std::string& path, std::string_view bytes, Progress* progress = nullptr);

}  // namespace ds
