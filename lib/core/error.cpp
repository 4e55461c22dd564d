// Implementation of the error helpers: origin string (host, rank) and throw.
#include "lib/core/error.h"

#include <unistd.h>

#include <cstdlib>

namespace ds {

std::string error_origin() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  const char* rank = std::getenv("RANK");
  return fmt::format("host={} rank={}", host, rank ? rank : "-");
}

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{}:{} [{}] {}", file, line, error_origin(), msg));
}

}  // namespace ds
