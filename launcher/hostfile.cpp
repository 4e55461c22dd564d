// Hostfile parsing: the MPI "host slots=N" format DeepSpeed uses, with line-numbered errors.
#include "launcher/hostfile.h"

#include <fstream>
#include <sstream>

#include "lib/core/error.h"

namespace ds::launch {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool parse_positive_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 6) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return v >= 1;
}

}  // namespace

ResourcePool parse_hostfile(const std::string& text, const std::string& source) {
  ResourcePool pool;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line = trim(line.substr(0, hash));
    std::istringstream words(line);
    std::string host, slots_word, extra;
    words >> host >> slots_word >> extra;
    int slots = 0;
    bool ok = !host.empty() && slots_word.rfind("slots=", 0) == 0 && extra.empty() &&
              parse_positive_int(slots_word.substr(6), &slots);
    DS_USER_CHECK(ok, "{}:{}: bad hostfile line '{}': expected 'HOSTNAME slots=N' with N >= 1",
                  source, line_no, trim(raw));
    for (const auto& h : pool)
      DS_USER_CHECK(h.host != host, "{}:{}: host '{}' is listed twice in the hostfile", source,
                    line_no, host);
    pool.push_back({host, slots});
  }
  DS_USER_CHECK(!pool.empty(), "{}: hostfile has no hosts (expected lines 'HOSTNAME slots=N')",
                source);
  return pool;
}

std::optional<ResourcePool> read_hostfile(const std::string& path, bool must_exist) {
  std::ifstream f(path);
  if (!f) {
    DS_USER_CHECK(!must_exist, "hostfile '{}' cannot be read (check the path given to --hostfile)",
                  path);
    return std::nullopt;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_hostfile(ss.str(), path);
}

}  // namespace ds::launch
