// Minimal logging: info lines go to stdout (by default only from rank 0),
// warnings and errors to stderr from every rank, prefixed with the rank.
#pragma once
#include <fmt/format.h>

#include <string>

namespace ds {

void log_set_rank(int rank);  // which rank this process is (default: $RANK or 0)
int log_rank();
void log_line(bool all_ranks, const std::string& s);
void warn_line(const std::string& s);

}  // namespace ds

#define DS_LOG(...) ::ds::log_line(false, ::fmt::format(__VA_ARGS__))
#define DS_LOG_ALL(...) ::ds::log_line(true, ::fmt::format(__VA_ARGS__))
#define DS_WARN(...) ::ds::warn_line(::fmt::format(__VA_ARGS__))
