// Pure parts of restarts and elastic runs (docs/dsrun.md, "Restarts and
// elastic training"): what dsrun reads from the program's command line and
// config (checkpoint directories, the `elasticity` section), which hosts an
// elastic attempt runs on, and the bookkeeping of hosts that fail.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/elasticity.h"

namespace ds::launch {

// What dsrun knows of the program it may restart.
struct ProgramCheckpoint {
  bool is_dstrain = false;   // PROGRAM's file name is dstrain
  std::string load_dir;      // --load DIR, else the config's training.load ("" none)
  std::string save_dir;      // --save DIR, else the config's training.save
  std::string config_path;   // --config / --deepspeed_config FILE
  std::optional<ElasticityConfig> elasticity;  // the config's section, when enabled
};

// Reads PROGRAM's arguments and the config file they name. A file that is not
// JSON is left to the program; a bad `elasticity` section is a UserError naming it.
ProgramCheckpoint inspect_program(const std::string& program, const std::vector<std::string>& args);

// The iteration that DIR/latest points at (`global_stepN`), or -1.
int64_t latest_iteration(const std::string& dir);

// Elastic limits: nodes in [min_nodes, max_nodes]; with an elasticity
// section also a world size W with W % model_parallel == 0 and W /
// model_parallel among the section's valid data-parallel sizes.
struct ElasticLimits {
  int min_nodes = 1;
  int max_nodes = 1 << 30;
  std::optional<ElasticityConfig> elasticity;
};

// The hosts of one attempt: the first k usable hosts (hostfile order) for the
// largest k that the limits allow. `slots[i]` is host i's slot count, usable[i]
// whether it can be used now. Empty with *why set when no k works.
std::vector<int> choose_elastic_hosts(const std::vector<int>& slots, const std::vector<bool>& usable,
                                      const ElasticLimits& limits, std::string* why);

// "world 3" or, with an elasticity section, "world 3 = DP 3, global batch 12
// = micro batch 2 x gradient accumulation 2 x DP 3".
std::string describe_layout(int64_t world, const std::optional<ElasticityConfig>& e);

// Failure bookkeeping per host. A host is dropped when it stops answering
// (lost heartbeat, unreachable), or when it causes kMaxHostFailures failed
// attempts in a row; a dropped host is tried again at every later restart.
inline constexpr int kMaxHostFailures = 2;
struct HostHealth {
  int failures_in_a_row = 0;
  bool dropped = false;
  std::string why;  // why it was dropped
};

// Records that host `h` ended an attempt (lost: it went silent). Every other
// host that took part gets its count cleared. Returns true when h is dropped now.
bool record_host_failure(std::vector<HostHealth>& hosts, const std::vector<int>& took_part, int h, bool lost,
                         const std::string& cause);

}  // namespace ds::launch
