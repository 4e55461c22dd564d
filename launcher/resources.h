// Selecting the active resources: --include/--exclude filters, --num_nodes,
// --num_gpus and the local fallback pool. Pure functions over ResourcePool.
#pragma once
#include <string>
#include <vector>

#include "launcher/hostfile.h"

namespace ds::launch {

// One active node: its name and the slot (GPU) indices used on it, sorted.
struct NodeSlots {
  std::string host;
  std::vector<int> slots;
  bool operator==(const NodeSlots&) const = default;
};
using ActiveResources = std::vector<NodeSlots>;

// All slots of every host, in hostfile order.
ActiveResources all_slots(const ResourcePool& pool);

// DeepSpeed's NODE_SPEC[@NODE_SPEC...] filter, NODE_SPEC = NAME[:SLOT[,SLOT...]].
// Exactly one of include/exclude may be non-empty. A bare NAME selects (or removes)
// all of its slots. Unknown hosts or slots and an empty result are ds::UserError
// naming them. The result keeps hostfile order with sorted, unique slots.
ActiveResources filter_resources(const ResourcePool& pool, const std::string& include,
                                 const std::string& exclude);

// --num_nodes N keeps the first N nodes, --num_gpus G uses slots 0..G-1 on each
// (values <= 0 mean "not given"). Asking for more than the pool has is an error.
ActiveResources limit_resources(const ActiveResources& active, const ResourcePool& pool,
                                int num_nodes, int num_gpus);

// The pool used without a hostfile: one node "localhost". With GPUs its slots are
// the GPUs; without, the slots are virtual: --num_gpus if given, else enough to
// cover the localhost slots named in `include`, else 1.
ResourcePool local_pool(int gpu_count, int num_gpus, const std::string& include);

// Highest slot index named for `host` in an include spec, or -1.
int max_slot_named(const std::string& spec, const std::string& host);

}  // namespace ds::launch
