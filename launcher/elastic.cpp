// Restart and elastic-run rules that need no process (elastic.h).
#include "launcher/elastic.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds::launch {
namespace {

// The value of `--name V` or `--name=V` among args (last wins, as argparse); "" when absent.
std::string flag_value(const std::vector<std::string>& args, const std::vector<std::string>& names) {
  std::string v;
  for (size_t i = 0; i < args.size(); ++i)
    for (const auto& n : names) {
      if (args[i] == n && i + 1 < args.size()) v = args[i + 1];
      else if (args[i].rfind(n + "=", 0) == 0) v = args[i].substr(n.size() + 1);
    }
  return v;
}

std::string json_string(const nlohmann::json& j, const char* section, const char* key) {
  if (!j.contains(section) || !j.at(section).is_object()) return "";
  const auto& s = j.at(section);
  return s.contains(key) && s.at(key).is_string() ? s.at(key).get<std::string>() : "";
}

}  // namespace

ProgramCheckpoint inspect_program(const std::string& program, const std::vector<std::string>& args) {
  ProgramCheckpoint pc;
  pc.is_dstrain = std::filesystem::path(program).filename() == "dstrain";
  pc.load_dir = flag_value(args, {"--load"});
  pc.save_dir = flag_value(args, {"--save"});
  pc.config_path = flag_value(args, {"--config", "--deepspeed_config"});
  if (pc.config_path.empty()) return pc;
  nlohmann::json j;
  try {
    j = load_json_file(pc.config_path);
  } catch (const UserError&) {
    return pc;  // not a JSON config (another program's format): the program reads it, not dsrun
  }
  if (!j.is_object()) return pc;
  if (pc.load_dir.empty()) pc.load_dir = json_string(j, "training", "load");
  if (pc.save_dir.empty()) pc.save_dir = json_string(j, "training", "save");
  if (j.contains("elasticity") && j.at("elasticity").is_object()) {
    JsonSection s(j.at("elasticity"), "elasticity");
    try {
      ElasticityConfig e = read_elasticity_section(s);
      if (e.enabled) pc.elasticity = e;
    } catch (const UserError& e) {
      throw UserError(fmt::format("{}: {}", pc.config_path, e.what()));
    }
  }
  return pc;
}

int64_t latest_iteration(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "latest");
  std::string name;
  if (!f || !(f >> name) || name.rfind("global_step", 0) != 0 || name.size() == 11) return -1;
  int64_t it = 0;
  for (char c : name.substr(11)) {
    if (c < '0' || c > '9' || it > (INT64_MAX - 9) / 10) return -1;
    it = it * 10 + (c - '0');
  }
  return it;
}

std::vector<int> choose_elastic_hosts(const std::vector<int>& slots, const std::vector<bool>& usable,
                                      const ElasticLimits& limits, std::string* why) {
  std::vector<int> order;
  for (size_t i = 0; i < slots.size(); ++i)
    if (usable[i]) order.push_back(static_cast<int>(i));
  const int64_t mp = limits.elasticity ? limits.elasticity->model_parallel_size : 1;
  std::vector<int64_t> v01;  // version 0.1's valid sizes do not depend on the size asked about
  if (limits.elasticity && limits.elasticity->version != 0.2) v01 = compute_elastic_config(*limits.elasticity).valid_sizes;
  auto valid_world = [&](int64_t world) {
    if (!limits.elasticity) return true;
    if (world % mp != 0) return false;
    if (limits.elasticity->version != 0.2) return std::binary_search(v01.begin(), v01.end(), world / mp);
    try {
      compute_elastic_config(*limits.elasticity, world / mp);
      return true;
    } catch (const UserError&) {
      return false;
    }
  };
  const int most = std::min<int>(limits.max_nodes, static_cast<int>(order.size()));
  for (int k = most; k >= limits.min_nodes && k >= 1; --k) {
    int64_t world = 0;
    for (int i = 0; i < k; ++i) world += slots[order[i]];
    if (valid_world(world)) return {order.begin(), order.begin() + k};
  }
  if (static_cast<int>(order.size()) < limits.min_nodes) {
    *why = fmt::format("{} usable host(s), fewer than --min_elastic_nodes {}", order.size(), limits.min_nodes);
  } else {
    std::string valid = "depends on the size (version 0.2)";
    if (limits.elasticity && limits.elasticity->version != 0.2) valid = fmt::format("[{}]", join_sizes(v01));
    *why = fmt::format("no count of the {} usable host(s) within the node limits gives a world size whose "
                       "data-parallel size (world / model_parallel_size {}) is valid for the elasticity section: {}",
                       order.size(), mp, valid);
  }
  return {};
}

std::string describe_layout(int64_t world, const std::optional<ElasticityConfig>& e) {
  if (!e) return fmt::format("world {}", world);
  const int64_t mp = e->model_parallel_size, dp = world / mp;
  const ElasticBatch b = compute_elastic_config(*e, dp);
  const int64_t gas = b.train_batch_size / (b.micro_batch_size * dp);
  return fmt::format("world {} = DP {}{}, global batch {} = micro batch {} x gradient accumulation {} x DP {}", world,
                     dp, mp > 1 ? fmt::format(" x model parallel {}", mp) : "", b.train_batch_size,
                     b.micro_batch_size, gas, dp);
}

bool record_host_failure(std::vector<HostHealth>& hosts, const std::vector<int>& took_part, int h, bool lost,
                         const std::string& cause) {
  for (int i : took_part)
    if (i != h) hosts[i].failures_in_a_row = 0;
  if (h < 0 || h >= static_cast<int>(hosts.size())) return false;
  HostHealth& r = hosts[h];
  ++r.failures_in_a_row;
  if (!lost && r.failures_in_a_row < kMaxHostFailures) return false;
  r.dropped = true;
  r.failures_in_a_row = 0;
  r.why = lost ? cause : fmt::format("{} failed attempts in a row, the last: {}", kMaxHostFailures, cause);
  return true;
}

}  // namespace ds::launch
