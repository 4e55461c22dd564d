// Rank environment (and each restart attempt's job token), argv and
// core-share computation (pure).
#include "launcher/rank_env.h"

#include <algorithm>

#include "lib/core/crypto.h"
#include "lib/core/error.h"
#include "launcher/world_info.h"

namespace ds::launch {

std::vector<RankInfo> ranks_of_node(const ActiveResources& active, int node_rank) {
  DS_CHECK(node_rank >= 0 && node_rank < static_cast<int>(active.size()), "node rank {} of {}",
           node_rank, active.size());
  std::vector<RankInfo> out;
  const NodeSlots& node = active[node_rank];
  int first = first_rank_of_node(active, node_rank);
  int local_size = static_cast<int>(node.slots.size());
  for (int l = 0; l < local_size; ++l) {
    RankInfo r;
    r.rank = first + l;
    r.local_rank = l;
    r.world_size = world_size(active);
    r.local_size = local_size;
    r.node_rank = node_rank;
    r.num_nodes = static_cast<int>(active.size());
    r.host = node.host;
    r.node_slots = node.slots;
    out.push_back(std::move(r));
  }
  return out;
}

std::string attempt_token(const std::string& job_token, int attempt) {
  return crypto::to_hex(crypto::hmac_sha256(job_token, "dsrun attempt " + std::to_string(attempt)));
}

EnvList rank_env(const RankInfo& r, const Rendezvous& rv, int omp_threads) {
  std::string cvd;
  for (size_t i = 0; i < r.node_slots.size(); ++i) {
    if (i) cvd += ',';
    cvd += std::to_string(r.node_slots[i]);
  }
  EnvList env = {
      {"RANK", std::to_string(r.rank)},
      {"LOCAL_RANK", std::to_string(r.local_rank)},
      {"WORLD_SIZE", std::to_string(r.world_size)},
      {"LOCAL_SIZE", std::to_string(r.local_size)},
      {"CROSS_RANK", std::to_string(r.node_rank)},
      {"CROSS_SIZE", std::to_string(r.num_nodes)},
      {"MASTER_ADDR", rv.master_addr},
      {"MASTER_PORT", std::to_string(rv.master_port)},
      {"CUDA_VISIBLE_DEVICES", cvd},
      {"DS_JOB_TOKEN", rv.job_token},
  };
  if (omp_threads > 0) env.emplace_back("OMP_NUM_THREADS", std::to_string(omp_threads));
  return env;
}

std::vector<std::string> rank_argv(const std::string& program, const std::vector<std::string>& args,
                                   int local_rank, bool no_local_rank) {
  std::vector<std::string> argv = {program};
  if (!no_local_rank) argv.push_back("--local_rank=" + std::to_string(local_rank));
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<int> parse_core_list(const std::string& list) {
  std::vector<int> cores;
  size_t start = 0;
  auto number = [&](const std::string& w) {
    bool ok = !w.empty() && w.size() < 6 &&
              std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
    DS_USER_CHECK(ok, "--bind_core_list '{}': '{}' is not a core number", list, w);
    return std::stoi(w);
  };
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string part = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = part.find('-');
    if (dash == std::string::npos) {
      cores.push_back(number(part));
    } else {
      int a = number(part.substr(0, dash)), b = number(part.substr(dash + 1));
      DS_USER_CHECK(a <= b, "--bind_core_list '{}': range '{}' is reversed", list, part);
      for (int c = a; c <= b; ++c) cores.push_back(c);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return cores;
}

std::vector<int> cores_for_rank(const std::vector<int>& cores, int local_size, int local_rank) {
  int per = local_size > 0 ? static_cast<int>(cores.size()) / local_size : 0;
  DS_USER_CHECK(per >= 1, "core binding: {} cores cannot be shared by {} ranks (need at least one each)",
                cores.size(), local_size);
  return std::vector<int>(cores.begin() + per * local_rank, cores.begin() + per * (local_rank + 1));
}

std::string format_core_list(const std::vector<int>& cores) {
  std::string out;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j > i ? fmt::format("{}-{}", cores[i], cores[j]) : std::to_string(cores[i]);
    i = j + 1;
  }
  return out;
}

}  // namespace ds::launch
