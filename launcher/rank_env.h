// What each rank receives: its rendezvous environment, its argv (with DeepSpeed's
// --local_rank=N) and its share of CPU cores. Pure; used by the agent and by --dry_run.
#pragma once
#include <string>
#include <vector>

#include "launcher/env_export.h"
#include "launcher/resources.h"

namespace ds::launch {

// One rank's place in the job.
struct RankInfo {
  int rank = 0;        // global, numbered node by node in world-info order
  int local_rank = 0;  // index on its node
  int world_size = 0;
  int local_size = 0;
  int node_rank = 0;   // CROSS_RANK
  int num_nodes = 0;   // CROSS_SIZE
  std::string host;
  std::vector<int> node_slots;  // the node's slots -> CUDA_VISIBLE_DEVICES
};

// Rendezvous settings shared by every rank of a job.
struct Rendezvous {
  std::string master_addr;
  int master_port = 29500;
  std::string job_token;
};

// The token of restart attempt `attempt` (0 = the first launch) of a job with
// --max_restarts: hex of HMAC-SHA256(job_token, "dsrun attempt <attempt>").
// Every rank of one attempt gets the same one; a token seen in one attempt
// says nothing about another's, nor about the job's secret.
std::string attempt_token(const std::string& job_token, int attempt);

// The ranks that run on node `node_rank`.
std::vector<RankInfo> ranks_of_node(const ActiveResources& active, int node_rank);

// Variables dsrun sets for a rank (they override inherited ones). omp_threads > 0
// adds OMP_NUM_THREADS (core binding).
EnvList rank_env(const RankInfo& r, const Rendezvous& rv, int omp_threads);

// PROGRAM --local_rank=N ARGS... (DeepSpeed's order), or PROGRAM ARGS... with no_local_rank.
std::vector<std::string> rank_argv(const std::string& program, const std::vector<std::string>& args,
                                   int local_rank, bool no_local_rank);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; a malformed list is a ds::UserError.
std::vector<int> parse_core_list(const std::string& list);
// Rank `local_rank`'s contiguous share of `cores` (DeepSpeed's split: len/local_size each).
std::vector<int> cores_for_rank(const std::vector<int>& cores, int local_size, int local_rank);
// {0,1,2,5} -> "0-2,5"
std::string format_core_list(const std::vector<int>& cores);

}  // namespace ds::launch
