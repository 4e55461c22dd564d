// The launch plan: from parsed options and a snapshot of the machine (hostfile,
// environment, GPU count, names of this host) to the active resources, the
// transport, every per-node command and every rank's environment. Pure, so
// --dry_run and the tests see exactly what a real launch would do.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "launcher/env_export.h"
#include "launcher/hostfile.h"
#include "launcher/options.h"
#include "launcher/rank_env.h"
#include "launcher/resources.h"

namespace ds::launch {

enum class Transport { Local, Ssh, Pdsh, Slurm, OpenMpi, Mpich };
const char* transport_name(Transport t);
// "ssh" | "pdsh" | "slurm" | "openmpi" | "mpich" (case-insensitive); else ds::UserError.
Transport parse_transport(const std::string& name);

// Everything make_plan reads, gathered by the caller (see gather_inputs in head.cpp).
struct PlanInputs {
  Options opts;
  std::optional<ResourcePool> hostfile_pool;  // nullopt: no hostfile
  int gpu_count = 0;
  std::optional<std::string> cuda_visible_devices;
  std::vector<std::string> environ_entries;  // NAME=value
  EnvList env_file_vars;                     // from .deepspeed_env files
  std::string cwd;
  std::string dsrun_path;                    // path of dsrun on every node
  std::string job_token;                     // the job's secret (DS_JOB_TOKEN or random)
  int attempt = 0;                           // --max_restarts: which attempt this plan launches
  std::vector<std::string> local_names;      // names and addresses of this machine
  std::string private_env_file;              // pdsh: base path of the agents' 0600 env files
  long head_pid = 0;
};

// One node. Its agent command is built on demand (node_agent_argv,
// node_remote_command): each holds the whole world info, so storing one per
// node would make the plan hosts x ranks instead of linear in ranks.
struct NodePlan {
  std::string host;
  int node_rank = 0;
};

// One rank: where it runs, its argv, and the variables dsrun sets for it.
struct RankPlan {
  RankInfo info;
  std::vector<std::string> argv;
  EnvList env;
};

struct LaunchPlan {
  Transport transport = Transport::Local;
  bool multi_node = false;
  int local_node_rank = 0;  // the node run in-process when transport == Local
  ActiveResources active;
  std::string world_info;
  std::string master_addr;
  bool discover_master = false;  // master_addr is a placeholder until `hostname -I`
  int master_port = 29500;
  // What the ranks get as DS_JOB_TOKEN: the job's secret, or with
  // --max_restarts this attempt's own token (attempt_token).
  std::string job_token;
  EnvList exports;  // sent to remote nodes
  // What remote agents get outside any command line: the exports and
  // DS_JOB_TOKEN (ssh: on stdin; pdsh: in env_file.<node rank>; srun/mpirun:
  // in the launcher's environment, with only names on mpirun's command line).
  EnvList agent_env;
  std::string env_file;  // pdsh: the head writes env_file.<node rank> (0600)
  AgentOptions agent;
  std::vector<NodePlan> nodes;
  std::vector<std::string> agent_argv;  // dsrun --agent FLAGS (every node; no node selector)
  std::vector<std::string> agent_tail;  // -- PROGRAM ARGS
  std::string remote_prefix;            // ssh: "cd CWD && [. VENV && ]exec " (no secrets)
  std::string agent_stdin;              // ssh: encode_env_lines(agent_env), for every agent's stdin
  std::vector<std::string> head_command;  // pdsh / srun / mpirun argv
  EnvList head_env;                       // extra variables for head_command
  std::vector<RankPlan> ranks;
  std::vector<std::string> notes;         // decisions worth telling the user
};

// True for localhost, 127.x.y.z, ::1 and the names in `local_names`.
bool is_local_host(const std::string& host, const std::vector<std::string>& local_names);

// Selects resources and transport, then builds commands (build_commands).
LaunchPlan make_plan(const PlanInputs& in);
// (Re)builds nodes, head_command and ranks; call again after master discovery.
void build_commands(LaunchPlan& plan, const PlanInputs& in);
// dsrun --agent FLAGS --node_rank=N -- PROGRAM ARGS (node_rank < 0: the text
// "--node_rank=<node_rank>", for the --dry_run document).
std::vector<std::string> node_agent_argv(const LaunchPlan& plan, int node_rank);
// ssh: the shell command a node's channel runs (cd, exec the agent).
std::string node_remote_command(const LaunchPlan& plan, int node_rank);
// The --dry_run document.
std::string plan_to_json(const LaunchPlan& plan);

}  // namespace ds::launch
