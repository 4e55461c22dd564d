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

// Slots (ranks) one host may run: hostfiles, --include slot numbers and
// --num_gpus above this are errors, which keeps every plan small.
inline constexpr int kMaxSlotsPerHost = 1024;

// A host name as dsrun accepts it anywhere (hostfile, --include/--exclude,
// --master_addr): an RFC 1123 name (labels of letters, digits and '-', not
// starting or ending with '-', 1-63 characters, 253 in all), an IPv4 or an
// IPv6 address. Nothing else reaches ssh, pdsh, srun or mpirun, so a name can
// never be read as an option (a leading '-') or as shell syntax.
bool valid_host_name(const std::string& host);
// UserError "<where>: '<host>' is not a valid host name (...)" unless valid;
// control characters are shown escaped, so the message stays one line.
void check_host_name(const std::string& host, const std::string& where);

// Parses hostfile text. `source` names the file in error messages.
// Rules: blank lines and whole-line '#' comments are skipped, a trailing
// '# comment' is allowed; every other line must be `HOST slots=N` with a valid
// host name and 1 <= N <= kMaxSlotsPerHost.
// Malformed lines, duplicate hosts and files without hosts are ds::UserError
// naming the source and line number.
ResourcePool parse_hostfile(const std::string& text, const std::string& source);

// Reads and parses `path`. Returns nullopt when the file does not exist and
// `must_exist` is false (DeepSpeed falls back to the local node then).
std::optional<ResourcePool> read_hostfile(const std::string& path, bool must_exist);

}  // namespace ds::launch
