// Command lines of dsrun (DeepSpeed runner flags plus ours) and of its hidden
// per-node agent mode. Parsing only; meaning is given by plan.cpp and agent.cpp.
#pragma once
#include <string>
#include <vector>

namespace ds::launch {

// Everything `dsrun [options] PROGRAM [ARGS...]` accepts.
struct Options {
  std::string hostfile = "/job/hostfile";
  bool hostfile_given = false;
  std::string include, exclude;
  int num_nodes = -1;
  int num_gpus = -1;
  std::string master_addr;
  int master_port = 29500;
  std::string launcher = "ssh";
  std::string launcher_args;
  bool no_ssh_check = false;
  bool force_multi = false;
  bool no_local_rank = false;
  bool save_pid = false;
  std::string each_rank_log;  // --enable_each_rank_log DIR
  bool bind_cores_to_rank = false;
  std::string bind_core_list;
  int ssh_port = 0;  // 0: the default (22 or ~/.ssh/config)
  bool no_ssh = false;
  int node_rank = -1;
  std::string venv_script;
  std::string slurm_comment, slurm_account;
  // Our own flags.
  bool dry_run = false;
  std::string ssh_user;
  std::string ssh_identity;
  std::string ssh_known_hosts;
  bool ssh_no_host_key_check = false;
  int ssh_timeout = 10;  // seconds for connect + authentication
  double teardown_grace = 5.0;  // seconds between SIGTERM and SIGKILL
  std::string autotuning;  // --autotuning tune|run (launcher/autotune/)
  // Restarts and elastic runs (restart.cpp, elastic.h).
  int max_restarts = 0;          // torchrun's --max-restarts
  bool elastic_training = false;
  int min_elastic_nodes = -1;    // -1: 1
  int max_elastic_nodes = -1;    // -1: every active host
  // Seconds without a word from a node's agent (ssh, with restarts), and that a
  // rank may stay stopped or, once it opted in, leave its heartbeat file
  // untouched (every transport); 0: off.
  double heartbeat_timeout = 30;
  std::string program;
  std::vector<std::string> args;
};

// What the per-node agent (`dsrun --agent ...`) is told by the head.
struct AgentOptions {
  std::string world_info;
  int node_rank = -1;           // explicit node rank, or:
  std::string node_name;        // the node's name in the world info (pdsh: %h), or:
  std::string node_rank_env;    // a variable holding the node rank (mpirun)
  std::string node_name_env;    // a variable holding the node name (srun: SLURMD_NODENAME)
  std::string master_addr;
  int master_port = 29500;
  std::string job_token;
  bool no_local_rank = false;
  std::string each_rank_log;
  bool bind_cores_to_rank = false;
  std::string bind_core_list;
  long save_pid = 0;            // write /tmp/<save_pid>.deepspeed
  double teardown_grace = 5.0;
  // Built-in ssh transport: end of input on stdin (the head closed the
  // channel: Ctrl-C, a failure elsewhere) starts the teardown at once.
  bool stop_on_stdin_eof = false;
  // Built-in ssh transport: the exported variables and DS_JOB_TOKEN arrive as
  // the first lines on stdin (encode_env_lines), never in the command line.
  bool env_from_stdin = false;
  // pdsh transport: the same lines are in the private file <env_file>.<node
  // rank> written by the head; the agent reads and deletes it.
  std::string env_file;
  // Seconds between the heartbeat lines (kHeartbeatLine) the agent writes to
  // stdout for the head (0: none); set with restarts over the built-in ssh.
  double heartbeat = 0;
  // Seconds a rank may stay stopped or leave its heartbeat file untouched
  // (launcher/liveness.h); 0: not watched.
  double heartbeat_timeout = 0;
  std::string program;
  std::vector<std::string> args;
};

// The line an agent writes on stdout as a heartbeat. Rank output always
// carries a "[rank N] " prefix, so no rank can produce it.
inline constexpr const char* kHeartbeatLine = "dsrun: heartbeat\n";

// Parse argv. Returns false when help was printed (exit 0). Bad flags are ds::UserError.
bool parse_options(int argc, char** argv, Options* out);
bool parse_agent_options(int argc, char** argv, AgentOptions* out);

// The agent flags shared by all nodes (without the dsrun path, "--agent", the
// node selector and the program); see plan.cpp for the full command.
std::vector<std::string> agent_flags(const AgentOptions& a);

}  // namespace ds::launch
