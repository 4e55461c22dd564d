// Logging implementation (line-buffered, one write per line so ranks interleave cleanly).
#include "lib/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ds {
namespace {
int g_rank = -1;
std::mutex g_mu;
}  // namespace

void log_set_rank(int rank) { g_rank = rank; }

int log_rank() {
  if (g_rank < 0) {
    const char* r = std::getenv("RANK");
    g_rank = r ? std::atoi(r) : 0;
  }
  return g_rank;
}

void log_line(bool all_ranks, const std::string& s) {
  if (!all_ranks && log_rank() != 0) return;
  std::lock_guard<std::mutex> lk(g_mu);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void warn_line(const std::string& s) {
  std::lock_guard<std::mutex> lk(g_mu);
  // Under dsrun the agent prefixes each line with the rank already.
  static const bool prefixed = [] {
    const char* v = std::getenv("DS_OUTPUT_RANK_PREFIXED");
    return v && std::string(v) == "1";
  }();
  std::string line =
      prefixed ? fmt::format("warning: {}\n", s) : fmt::format("[rank {}] warning: {}\n", log_rank(), s);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace ds
