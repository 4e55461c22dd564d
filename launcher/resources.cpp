// Resource selection: include/exclude filtering with DeepSpeed's syntax and named errors.
#include "launcher/resources.h"

#include <algorithm>
#include <map>
#include <set>

#include "lib/core/error.h"

namespace ds::launch {
namespace {

struct NodeSpec {
  std::string host;
  std::vector<int> slots;  // empty: the whole host
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

int parse_slot(const std::string& word, const std::string& flag, const std::string& spec) {
  bool digits = !word.empty() && word.size() < 7 &&
                std::all_of(word.begin(), word.end(), [](char c) { return c >= '0' && c <= '9'; });
  DS_USER_CHECK(digits, "{} '{}': slot '{}' is not a non-negative integer", flag, spec, word);
  const int s = std::stoi(word);
  DS_USER_CHECK(s < kMaxSlotsPerHost, "{} '{}': slot {} is beyond the {} slots a host may have", flag, spec, s,
                kMaxSlotsPerHost);
  return s;
}

std::vector<NodeSpec> parse_specs(const std::string& spec, const std::string& flag) {
  std::vector<NodeSpec> out;
  for (const auto& part : split(spec, '@')) {
    DS_USER_CHECK(!part.empty(), "{} '{}': empty node spec (expected NAME[:SLOT,...]@...)", flag,
                  spec);
    NodeSpec ns;
    size_t colon = part.find(':');
    ns.host = part.substr(0, colon);
    DS_USER_CHECK(!ns.host.empty(), "{} '{}': node spec '{}' has no host name", flag, spec, part);
    check_host_name(ns.host, flag);
    if (colon != std::string::npos)
      for (const auto& w : split(part.substr(colon + 1), ',')) ns.slots.push_back(parse_slot(w, flag, spec));
    out.push_back(std::move(ns));
  }
  return out;
}

const HostSlots& find_host(const ResourcePool& pool, const std::string& host,
                           const std::string& flag) {
  for (const auto& h : pool)
    if (h.host == host) return h;
  DS_USER_ERROR("{}: host '{}' is not in the hostfile (known hosts: {})", flag, host, [&] {
    std::string names;
    for (const auto& h : pool) names += (names.empty() ? "" : ", ") + h.host;
    return names;
  }());
}

void check_slots(const HostSlots& h, const std::vector<int>& slots, const std::string& flag) {
  for (int s : slots)
    DS_USER_CHECK(s < h.slots, "{}: host '{}' has no slot {} (it has slots 0..{})", flag, h.host,
                  s, h.slots - 1);
}

}  // namespace

ActiveResources all_slots(const ResourcePool& pool) {
  ActiveResources out;
  for (const auto& h : pool) {
    NodeSlots n{h.host, {}};
    for (int i = 0; i < h.slots; ++i) n.slots.push_back(i);
    out.push_back(std::move(n));
  }
  return out;
}

ActiveResources filter_resources(const ResourcePool& pool, const std::string& include,
                                 const std::string& exclude) {
  DS_USER_CHECK(include.empty() || exclude.empty(),
                "--include and --exclude are mutually exclusive; give only one");
  if (include.empty() && exclude.empty()) return all_slots(pool);
  const bool inc = !include.empty();
  const std::string flag = inc ? "--include" : "--exclude";
  std::map<std::string, std::set<int>> chosen;
  if (!inc)
    for (const auto& n : all_slots(pool)) chosen[n.host].insert(n.slots.begin(), n.slots.end());
  for (const auto& spec : parse_specs(inc ? include : exclude, flag)) {
    const HostSlots& h = find_host(pool, spec.host, flag);
    check_slots(h, spec.slots, flag);
    std::vector<int> slots = spec.slots;
    if (slots.empty())
      for (int i = 0; i < h.slots; ++i) slots.push_back(i);
    for (int s : slots) {
      if (inc) chosen[h.host].insert(s);
      else chosen[h.host].erase(s);
    }
  }
  ActiveResources out;
  for (const auto& h : pool) {
    auto it = chosen.find(h.host);
    if (it == chosen.end() || it->second.empty()) continue;
    out.push_back({h.host, std::vector<int>(it->second.begin(), it->second.end())});
  }
  DS_USER_CHECK(!out.empty(), "{} '{}' leaves no slots to run on", flag, inc ? include : exclude);
  return out;
}

ActiveResources limit_resources(const ActiveResources& active, const ResourcePool& pool,
                                int num_nodes, int num_gpus) {
  ActiveResources out = active;
  if (num_nodes > 0) {
    DS_USER_CHECK(num_nodes <= static_cast<int>(out.size()),
                  "--num_nodes {} asks for more nodes than the {} available", num_nodes,
                  out.size());
    out.resize(num_nodes);
  }
  if (num_gpus > 0) {
    for (auto& n : out) {
      for (const auto& h : pool)
        if (h.host == n.host)
          DS_USER_CHECK(num_gpus <= h.slots, "--num_gpus {} exceeds the {} slots of host '{}'",
                        num_gpus, h.slots, h.host);
      n.slots.clear();
      for (int i = 0; i < num_gpus; ++i) n.slots.push_back(i);
    }
  }
  return out;
}

int max_slot_named(const std::string& spec, const std::string& host) {
  int best = -1;
  if (spec.empty()) return best;
  for (const auto& ns : parse_specs(spec, "--include"))
    if (ns.host == host)
      for (int s : ns.slots) best = std::max(best, s);
  return best;
}

ResourcePool local_pool(int gpu_count, int num_gpus, const std::string& include) {
  DS_USER_CHECK(num_gpus <= kMaxSlotsPerHost, "--num_gpus {}: at most {} ranks per host", num_gpus,
                kMaxSlotsPerHost);
  if (gpu_count > 0) return {{"localhost", std::min(gpu_count, kMaxSlotsPerHost)}};
  int slots = 1;
  if (num_gpus > 0) slots = num_gpus;
  else slots = std::max(1, max_slot_named(include, "localhost") + 1);
  return {{"localhost", slots}};
}

}  // namespace ds::launch
