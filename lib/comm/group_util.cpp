// Group formation helpers shared by the Gloo and NCCL communicators.
#include "lib/comm/group_util.h"

#include <set>

#include "lib/comm/tcp_store.h"
#include "lib/core/error.h"

namespace ds {

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

int validate_group(const std::vector<int>& ranks, const std::string& tag, int my_rank,
                   int parent_size, const std::string& parent_name) {
  DS_CHECK(!tag.empty(), "split of '{}' needs a non-empty tag", parent_name);
  DS_CHECK(!ranks.empty(), "split '{}' of '{}': empty member list", tag, parent_name);
  std::set<int> seen;
  int me = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    int r = ranks[i];
    DS_CHECK(r >= 0 && r < parent_size, "split '{}' of '{}': member {} outside [0, {})", tag,
             parent_name, r, parent_size);
    DS_CHECK(seen.insert(r).second, "split '{}' of '{}': member {} listed twice in {}", tag,
             parent_name, r, ranks_str(ranks));
    if (r == my_rank) me = static_cast<int>(i);
  }
  DS_CHECK(me >= 0, "split '{}' of '{}': rank {} called it but is not among the members {}", tag,
           parent_name, my_rank, ranks_str(ranks));
  return me;
}

void agree_on_members(TcpStore& store, const std::string& name, int group_rank,
                      const std::vector<int>& world_members) {
  std::string mine = ranks_str(world_members);
  std::string key = "group/" + name + "/members";
  if (group_rank == 0) store.set(key, mine);
  try {
    store.barrier("group/" + name, group_rank, static_cast<int>(world_members.size()));
  } catch (const Error& e) {
    DS_THROW("forming group '{}' (world ranks {}; listed ranks are group ranks): {}", name, mine,
             e.what());
  }
  std::string first = store.get(key);
  DS_CHECK(first == mine,
           "group '{}': this rank was given the members {} but group rank 0 was given {}; every "
           "member must pass the same list", name, mine, first);
}

void even_chunks(int64_t count, int n, std::vector<int64_t>& offsets, std::vector<int64_t>& lens) {
  offsets.assign(n, 0);
  lens.assign(n, 0);
  int64_t base = count / n, extra = count % n, off = 0;
  for (int i = 0; i < n; ++i) {
    offsets[i] = off;
    lens[i] = base + (i < extra ? 1 : 0);
    off += lens[i];
  }
}

}  // namespace ds
