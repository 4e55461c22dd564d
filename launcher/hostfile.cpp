// Hostfile parsing: the MPI "host slots=N" format DeepSpeed uses, with line-numbered errors.
#include "launcher/hostfile.h"

#include <arpa/inet.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

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

bool valid_label(const std::string& l) {
  if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-') return false;
  for (char c : l)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace

bool valid_host_name(const std::string& host) {
  unsigned char buf[16];
  if (::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1)
    return host.find('\0') == std::string::npos;
  if (host.empty() || host.size() > 253) return false;
  size_t at = 0;
  while (true) {
    const size_t dot = host.find('.', at);
    if (!valid_label(host.substr(at, dot == std::string::npos ? std::string::npos : dot - at))) return false;
    if (dot == std::string::npos) return true;
    at = dot + 1;
  }
}

void check_host_name(const std::string& host, const std::string& where) {
  DS_USER_CHECK(valid_host_name(host),
                "{}: '{}' is not a valid host name (expected an RFC 1123 name of letters, digits, '-' and '.', "
                "or an IPv4/IPv6 address)", where, printable(host));
}

ResourcePool parse_hostfile(const std::string& text, const std::string& source) {
  ResourcePool pool;
  std::unordered_set<std::string> seen;  // linear in the number of hosts
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
                  source, line_no, printable(trim(raw)));
    check_host_name(host, fmt::format("{}:{}", source, line_no));
    DS_USER_CHECK(slots <= kMaxSlotsPerHost, "{}:{}: host '{}' has slots={}; at most {} per host", source, line_no,
                  host, slots, kMaxSlotsPerHost);
    DS_USER_CHECK(seen.insert(host).second, "{}:{}: host '{}' is listed twice in the hostfile", source,
                  line_no, host);
    pool.push_back({host, slots});
  }
  DS_USER_CHECK(!pool.empty(), "{}: hostfile has no hosts (expected lines 'HOSTNAME slots=N')",
                source);
  return pool;
}

std::optional<ResourcePool> read_hostfile(const std::string& path, bool must_exist) {
  std::error_code ec;
  DS_USER_CHECK(!std::filesystem::is_directory(path, ec), "hostfile '{}' is a directory (give the file to "
                "--hostfile)", path);
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
