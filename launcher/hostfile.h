// MPI-style hostfile parsing ("worker-0 slots=8"), pure: text in, ordered hosts out.
// Kept free of I/O (except read_hostfile) so every rule is table-tested.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace ds::launch {

// One hostfile entry: a host name and its slot (GPU) count, in file order.
struct HostSlots {
  std::string host;
  int slots = 0;
  bool operator==(const HostSlots&) const = default;
};
using ResourcePool = std::vector<HostSlots>;

// Parses hostfile text. `source` names the file in error messages.
// Rules: blank lines and whole-line '#' comments are skipped, a trailing
// '# comment' is allowed; every other line must be `HOST slots=N` with N >= 1.
// Malformed lines, duplicate hosts and files without hosts are ds::UserError
// naming the source and line number.
ResourcePool parse_hostfile(const std::string& text, const std::string& source);

// Reads and parses `path`. Returns nullopt when the file does not exist and
// `must_exist` is false (DeepSpeed falls back to the local node then).
std::optional<ResourcePool> read_hostfile(const std::string& path, bool must_exist);

}  // namespace ds::launch
