// Helpers shared by the backends when a group is formed: argument checks for
// split() and the store handshake in which the members meet and confirm they
// were all given the same member list. Internal to lib/comm.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds {

class TcpStore;

// Checks a split() call and returns this rank's index in `ranks`.
int validate_group(const std::vector<int>& ranks, const std::string& tag, int my_rank,
                   int parent_size, const std::string& parent_name);

// "[0, 2, 4]"
std::string ranks_str(const std::vector<int>& ranks);

// Members of group `name` meet at a store barrier and check that every member
// was given the same list (`world_members`, used in the messages).
void agree_on_members(TcpStore& store, const std::string& name, int group_rank,
                      const std::vector<int>& world_members);

// Splits count elements into n chunks, the first count % n one element longer.
void even_chunks(int64_t count, int n, std::vector<int64_t>& offsets, std::vector<int64_t>& lens);

}  // namespace ds
