// CLI11 definitions of dsrun's flags (DeepSpeed runner names and defaults) and of the agent mode.
#include "launcher/options.h"

#include <CLI/CLI.hpp>

#include "launcher/plan.h"
#include "launcher/rank_env.h"
#include "lib/core/error.h"

namespace ds::launch {
namespace {

// Runs the CLI11 parse; converts parse errors into one-line ds::UserError.
bool run_parse(CLI::App& app, int argc, char** argv, std::string* program,
               std::vector<std::string>* args) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    app.exit(e);
    return false;
  } catch (const CLI::ParseError& e) {
    DS_USER_ERROR("{} (see {} --help)", e.what(), app.get_name());  // main adds "dsrun: error: "
  }
  std::vector<std::string> rest = app.remaining();
  bool dashdash = !rest.empty() && rest[0] == "--";
  if (dashdash) rest.erase(rest.begin());
  DS_USER_CHECK(rest.empty() || dashdash || rest[0].empty() || rest[0][0] != '-',
                "unknown option '{}' (see {} --help)", rest.empty() ? "" : rest[0], app.get_name());
  DS_USER_CHECK(!rest.empty(), "no PROGRAM given (usage: dsrun [options] PROGRAM [ARGS...])");
  *program = rest[0];
  args->assign(rest.begin() + 1, rest.end());
  return true;
}

void check_restart_options(const Options& o) {
  DS_USER_CHECK(o.max_restarts >= 0 && o.max_restarts <= 10000, "--max_restarts {} must be between 0 and 10000",
                o.max_restarts);
  DS_USER_CHECK(o.heartbeat_timeout == 0 || (o.heartbeat_timeout >= 1 && o.heartbeat_timeout <= 86400),
                "--heartbeat_timeout {} must be 0 (off) or between 1 and 86400 seconds", o.heartbeat_timeout);
  DS_USER_CHECK(o.max_restarts == 0 || !o.no_ssh, "--max_restarts cannot be combined with --no_ssh (each node's "
                "dsrun would restart on its own)");
  const bool bounds = o.min_elastic_nodes != -1 || o.max_elastic_nodes != -1;
  DS_USER_CHECK(o.elastic_training || !bounds, "--{}_elastic_nodes needs --elastic_training",
                o.min_elastic_nodes != -1 ? "min" : "max");
  if (!o.elastic_training) return;
  DS_USER_CHECK(o.max_restarts > 0, "--elastic_training needs --max_restarts N > 0 (how many times the job may be "
                "restarted on the hosts that remain)");
  DS_USER_CHECK(o.min_elastic_nodes == -1 || o.min_elastic_nodes >= 1, "--min_elastic_nodes {} must be at least 1",
                o.min_elastic_nodes);
  DS_USER_CHECK(o.max_elastic_nodes == -1 || o.max_elastic_nodes >= 1, "--max_elastic_nodes {} must be at least 1",
                o.max_elastic_nodes);
  DS_USER_CHECK(o.max_elastic_nodes == -1 || o.min_elastic_nodes <= o.max_elastic_nodes,
                "--min_elastic_nodes {} is larger than --max_elastic_nodes {}", o.min_elastic_nodes,
                o.max_elastic_nodes);
  DS_USER_CHECK(o.num_nodes < 0, "--num_nodes cannot be combined with --elastic_training (use --min_elastic_nodes "
                "and --max_elastic_nodes)");
}

}  // namespace

bool parse_options(int argc, char** argv, Options* o) {
  CLI::App app{"dsrun: launch PROGRAM on every selected slot of every selected host "
               "(DeepSpeed runner compatible). Options after PROGRAM belong to PROGRAM.",
               "dsrun"};
  app.prefix_command();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: last wins
  app.footer("Usage: dsrun [options] PROGRAM [ARGS...]   (see docs/dsrun.md)");
  auto* hf = app.add_option("-H,--hostfile", o->hostfile, "MPI-style hostfile (HOST slots=N)")
                 ->capture_default_str();
  app.add_option("-i,--include", o->include, "NODE_SPEC[@NODE_SPEC...], NODE_SPEC=NAME[:SLOT,...]");
  app.add_option("-e,--exclude", o->exclude, "hosts/slots to leave out (same syntax)");
  app.add_option("--num_nodes", o->num_nodes, "use the first N hosts");
  app.add_option("--num_gpus,--num_accelerators", o->num_gpus, "slots 0..N-1 on each host");
  app.add_option("--master_addr", o->master_addr, "rendezvous address (default: discovered)");
  app.add_option("--master_port", o->master_port, "rendezvous port")->capture_default_str();
  app.add_option("--launcher", o->launcher, "ssh (built-in), pdsh, slurm, openmpi, mpich")
      ->capture_default_str();
  app.add_option("--launcher_args", o->launcher_args, "extra arguments for the launcher command");
  app.add_flag("--no_ssh_check", o->no_ssh_check, "skip the ssh reachability check");
  app.add_flag("--force_multi", o->force_multi, "use the multi-node transport even for one node");
  app.add_flag("--no_local_rank", o->no_local_rank, "do not pass --local_rank=N to PROGRAM");
  app.add_flag("--save_pid", o->save_pid, "write /tmp/<dsrun pid>.deepspeed with the agent pid");
  app.add_option("--enable_each_rank_log", o->each_rank_log, "write each rank's output to DIR/rank_<RANK>.log");
  app.add_flag("--bind_cores_to_rank", o->bind_cores_to_rank, "pin each rank to its share of cores");
  app.add_option("--bind_core_list", o->bind_core_list, "cores to share out, e.g. 0-7,16-23");
  app.add_option("--ssh_port", o->ssh_port, "ssh port of every host");
  app.add_flag("--no_ssh", o->no_ssh, "start only this node's ranks (run dsrun on every node)");
  app.add_option("--node_rank", o->node_rank, "this node's rank with --no_ssh");
  app.add_option("--venv_script", o->venv_script, "script sourced on each node before the agent starts");
  app.add_option("--comment", o->slurm_comment, "srun --comment (slurm launcher)");
  app.add_option("--account", o->slurm_account, "srun --account (slurm launcher)");
  bool no_python = false;
  app.add_flag("--no_python", no_python, "accepted for compatibility (dsrun runs executables)");
  app.add_flag("--dry_run", o->dry_run, "print the resolved plan as JSON and start nothing");
  app.add_option("--ssh_user", o->ssh_user, "remote user (default: ~/.ssh/config or local user)");
  app.add_option("--ssh_identity", o->ssh_identity, "private key file (default: agent, ~/.ssh/id_*)");
  app.add_option("--ssh_known_hosts", o->ssh_known_hosts, "known_hosts file (default ~/.ssh/known_hosts)");
  app.add_flag("--ssh_no_host_key_check", o->ssh_no_host_key_check,
               "INSECURE: accept any host key (built-in ssh launcher)");
  app.add_option("--ssh_timeout", o->ssh_timeout, "seconds to connect and authenticate")
      ->capture_default_str();
  app.add_option("--teardown_grace", o->teardown_grace, "seconds between SIGTERM and SIGKILL at teardown")
      ->capture_default_str();
  app.add_option("--autotuning", o->autotuning, "tune: search the config's autotuning space; run: then train "
                 "with the best (docs/autotuning.md)")->check(CLI::IsMember({"tune", "run"}));
  app.add_option("--max_restarts", o->max_restarts, "relaunch the job up to N times after a failure")
      ->capture_default_str();
  app.add_flag("--elastic_training", o->elastic_training,
               "drop failing or silent hosts at a restart, take returning ones back");
  app.add_option("--min_elastic_nodes", o->min_elastic_nodes, "fewest hosts an elastic job may run on (default 1)");
  app.add_option("--max_elastic_nodes", o->max_elastic_nodes, "most hosts an elastic job may run on (default all)");
  app.add_option("--heartbeat_timeout", o->heartbeat_timeout,
                 "seconds a rank may stay stopped or without a heartbeat, and a node silent (ssh, with restarts); "
                 "0: off")
      ->capture_default_str();
  for (const char* bad : {"--module"}) {
    std::string name = bad;
    app.add_option_function<std::string>(
           name, [name](const std::string&) {
             DS_USER_ERROR("{} is a DeepSpeed (Python) feature that dsrun does not support", name);
           }, "not supported")
        ->group("")
        ->expected(0, 1);
  }
  if (!run_parse(app, argc, argv, &o->program, &o->args)) return false;
  o->hostfile_given = hf->count() > 0;
  DS_USER_CHECK(o->master_port > 0 && o->master_port < 65536, "--master_port {} is not a TCP port",
                o->master_port);
  DS_USER_CHECK(o->ssh_port >= 0 && o->ssh_port < 65536, "--ssh_port {} is not a TCP port", o->ssh_port);
  DS_USER_CHECK(o->teardown_grace >= 0 && o->teardown_grace <= 600,
                "--teardown_grace {} must be between 0 and 600 seconds", o->teardown_grace);
  parse_transport(o->launcher);  // an unknown name is an error even where a local launch would not use it
  if (!o->bind_core_list.empty()) parse_core_list(o->bind_core_list);  // here, not in each node's agent
  DS_USER_CHECK(!o->no_ssh || o->node_rank >= 0, "--no_ssh needs --node_rank N (this node's rank)");
  DS_USER_CHECK(o->node_rank < 0 || o->no_ssh, "--node_rank is only meaningful with --no_ssh");
  check_restart_options(*o);
  return true;
}

bool parse_agent_options(int argc, char** argv, AgentOptions* a) {
  CLI::App app{"dsrun per-node agent (started by dsrun, not by users)", "dsrun --agent"};
  app.prefix_command();
  bool agent = false;
  app.add_flag("--agent", agent);
  app.add_option("--world_info", a->world_info)->required();
  app.add_option("--node_rank", a->node_rank);
  app.add_option("--node_name", a->node_name);
  app.add_option("--node_rank_env", a->node_rank_env);
  app.add_option("--node_name_env", a->node_name_env);
  app.add_option("--master_addr", a->master_addr)->required();
  app.add_option("--master_port", a->master_port);
  app.add_option("--job_token", a->job_token);  // accepted; dsrun passes the token in the environment
  app.add_flag("--no_local_rank", a->no_local_rank);
  app.add_option("--enable_each_rank_log", a->each_rank_log);
  app.add_flag("--bind_cores_to_rank", a->bind_cores_to_rank);
  app.add_option("--bind_core_list", a->bind_core_list);
  app.add_option("--save_pid", a->save_pid);
  app.add_option("--teardown_grace", a->teardown_grace);
  app.add_flag("--stop_on_stdin_eof", a->stop_on_stdin_eof);
  app.add_flag("--env_from_stdin", a->env_from_stdin);
  app.add_option("--env_file", a->env_file);
  app.add_option("--heartbeat", a->heartbeat);
  app.add_option("--heartbeat_timeout", a->heartbeat_timeout);
  return run_parse(app, argc, argv, &a->program, &a->args);
}

std::vector<std::string> agent_flags(const AgentOptions& a) {
  // The job token is never an argument (it would show in ps on every node):
  // the transports put DS_JOB_TOKEN in the agent's environment.
  std::vector<std::string> f = {"--world_info=" + a.world_info, "--master_addr=" + a.master_addr,
                                "--master_port=" + std::to_string(a.master_port)};
  if (a.no_local_rank) f.push_back("--no_local_rank");
  if (!a.each_rank_log.empty()) f.push_back("--enable_each_rank_log=" + a.each_rank_log);
  if (a.bind_cores_to_rank) f.push_back("--bind_cores_to_rank");
  if (!a.bind_core_list.empty()) f.push_back("--bind_core_list=" + a.bind_core_list);
  if (a.save_pid > 0) f.push_back("--save_pid=" + std::to_string(a.save_pid));
  f.push_back(fmt::format("--teardown_grace={}", a.teardown_grace));
  if (a.stop_on_stdin_eof) f.push_back("--stop_on_stdin_eof");
  if (a.env_from_stdin) f.push_back("--env_from_stdin");
  if (!a.env_file.empty()) f.push_back("--env_file=" + a.env_file);
  if (a.heartbeat > 0) f.push_back(fmt::format("--heartbeat={}", a.heartbeat));
  if (a.heartbeat_timeout > 0) f.push_back(fmt::format("--heartbeat_timeout={}", a.heartbeat_timeout));
  return f;
}

}  // namespace ds::launch
