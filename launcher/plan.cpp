// make_plan: resource selection, transport choice, master address, and the
// per-node / per-rank commands, all without touching the machine.
#include "launcher/plan.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "launcher/shell.h"
#include "launcher/world_info.h"

namespace ds::launch {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string host_list(const ActiveResources& active, const char* suffix) {
  std::string out;
  for (const auto& n : active) out += (out.empty() ? "" : ",") + n.host + suffix;
  return out;
}

// Resources without a hostfile: the local node, honouring CUDA_VISIBLE_DEVICES like DeepSpeed.
ResourcePool no_hostfile_pool(const PlanInputs& in, std::string* include, std::vector<std::string>* notes) {
  const Options& o = in.opts;
  const auto& cvd = in.cuda_visible_devices;
  if (cvd && !cvd->empty()) {
    if (!o.include.empty() || !o.exclude.empty() || o.num_nodes > 1 || o.num_gpus > 0) {
      notes->push_back(fmt::format("CUDA_VISIBLE_DEVICES={} ignored because --include/--exclude/"
                                   "--num_gpus/--num_nodes was given", *cvd));
    } else {
      *include = "localhost:" + *cvd;
      notes->push_back(fmt::format("CUDA_VISIBLE_DEVICES={} -> --include {}", *cvd, *include));
    }
  }
  DS_USER_CHECK(o.num_nodes <= 1, "--num_nodes {} needs a hostfile, but '{}' was not found",
                o.num_nodes, o.hostfile);
  return local_pool(in.gpu_count, o.num_gpus, *include);
}

void choose_transport(LaunchPlan& p, const PlanInputs& in) {
  const Options& o = in.opts;
  if (o.no_ssh) {
    DS_USER_CHECK(o.node_rank < static_cast<int>(p.active.size()),
                  "--node_rank {} is out of range: {} nodes are active", o.node_rank, p.active.size());
    p.transport = Transport::Local;
    p.local_node_rank = o.node_rank;
    p.multi_node = p.active.size() > 1;
    return;
  }
  p.multi_node = o.force_multi || p.active.size() > 1 ||
                 !is_local_host(p.active[0].host, in.local_names);
  p.transport = p.multi_node ? parse_transport(o.launcher) : Transport::Local;
}

void choose_master(LaunchPlan& p, const PlanInputs& in) {
  const Options& o = in.opts;
  if (!o.master_addr.empty()) {
    check_host_name(o.master_addr, "--master_addr");
    p.master_addr = o.master_addr;
  } else if (p.transport == Transport::Local && !o.no_ssh) {
    p.master_addr = "127.0.0.1";
  } else if (p.transport == Transport::Ssh || p.transport == Transport::Pdsh) {
    p.master_addr = p.active[0].host;
    p.discover_master = true;
  } else {
    p.master_addr = p.active[0].host;
    p.notes.push_back(fmt::format("master address: first host name '{}' (give --master_addr to override)",
                                  p.master_addr));
  }
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// "cd CWD && [. VENV && ]exec ", to be followed by the quoted agent argv. No
// variable values: those reach the agent outside its command line (agent_env).
std::string remote_shell_prefix(const PlanInputs& in) {
  std::string cmd = "cd " + shell_quote(in.cwd);
  if (!in.opts.venv_script.empty()) cmd += " && . " + shell_quote(in.opts.venv_script);
  return cmd + " && exec ";
}

std::vector<std::string> head_command(const LaunchPlan& p, const PlanInputs& in,
                                      const std::vector<std::string>& base,
                                      const std::vector<std::string>& tail, EnvList* head_env) {
  const Options& o = in.opts;
  std::vector<std::string> extra = shell_split(o.launcher_args, "--launcher_args");
  std::string n = std::to_string(p.active.size());
  std::vector<std::string> cmd;
  switch (p.transport) {
    case Transport::Pdsh: {
      cmd = concat({"pdsh", "-S", "-f", "1024", "-w", host_list(p.active, "")}, extra);
      // pdsh forwards neither an environment nor stdin: the exports and the
      // token are in private files the head writes (--env_file, docs/dsrun.md).
      cmd.push_back(remote_shell_prefix(in) + shell_join(concat(concat(base, {"--node_name=%h"}), tail)));
      head_env->emplace_back("PDSH_RCMD_TYPE", "ssh");
      // pdsh's default ssh arguments with "--" before the host (host names are
      // validated too); a PDSH_SSH_ARGS of the user's own is left alone.
      bool own_args = false;
      for (const auto& e : in.environ_entries) own_args = own_args || e.rfind("PDSH_SSH_ARGS=", 0) == 0;
      if (!own_args) head_env->emplace_back("PDSH_SSH_ARGS", "-2 -a -x -- %h");
      if (o.ssh_port > 0) {
        std::string prev;
        for (const auto& e : in.environ_entries)
          if (e.rfind("PDSH_SSH_ARGS_APPEND=", 0) == 0) prev = e.substr(21) + " ";
        head_env->emplace_back("PDSH_SSH_ARGS_APPEND", prev + "-p " + std::to_string(o.ssh_port));
      }
      return cmd;
    }
    case Transport::Slurm:
      cmd = {"srun", "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1",
             "--nodelist=" + host_list(p.active, ""), "--kill-on-bad-exit=1", "--chdir=" + in.cwd};
      if (!o.slurm_comment.empty()) cmd.push_back("--comment=" + o.slurm_comment);
      if (!o.slurm_account.empty()) cmd.push_back("--account=" + o.slurm_account);
      *head_env = p.agent_env;  // srun passes the whole environment (--export=ALL)
      return concat(concat(concat(cmd, extra), concat(base, {"--node_name_env=SLURMD_NODENAME"})), tail);
    case Transport::OpenMpi:
      cmd = {"mpirun", "-n", n, "--host", host_list(p.active, ":1"), "--bind-to", "none", "--wdir", in.cwd};
      *head_env = p.agent_env;  // values from mpirun's environment, only names in argv
      for (const auto& kv : *head_env) cmd.insert(cmd.end(), {"-x", kv.first});
      return concat(concat(concat(cmd, extra), concat(base, {"--node_rank_env=OMPI_COMM_WORLD_RANK"})), tail);
    case Transport::Mpich:
      cmd = {"mpirun", "-n", n, "-ppn", "1", "-hosts", host_list(p.active, ""), "-wdir", in.cwd};
      *head_env = p.agent_env;  // values from mpirun's environment, only names in argv
      {
        std::string names;
        for (const auto& kv : *head_env) names += (names.empty() ? "" : ",") + kv.first;
        cmd.insert(cmd.end(), {"-genvlist", names});
      }
      return concat(concat(concat(cmd, extra), concat(base, {"--node_rank_env=PMI_RANK"})), tail);
    default:
      return {};
  }
}

}  // namespace

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::Local: return "local";
    case Transport::Ssh: return "ssh";
    case Transport::Pdsh: return "pdsh";
    case Transport::Slurm: return "slurm";
    case Transport::OpenMpi: return "openmpi";
    case Transport::Mpich: return "mpich";
  }
  return "?";
}

Transport parse_transport(const std::string& name) {
  std::string n = lower(name);
  if (n == "ssh") return Transport::Ssh;
  if (n == "pdsh") return Transport::Pdsh;
  if (n == "slurm") return Transport::Slurm;
  if (n == "openmpi") return Transport::OpenMpi;
  if (n == "mpich") return Transport::Mpich;
  DS_USER_ERROR("--launcher '{}' is unknown; use ssh, pdsh, slurm, openmpi or mpich", name);
}

bool is_local_host(const std::string& host, const std::vector<std::string>& local_names) {
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  return std::find(local_names.begin(), local_names.end(), host) != local_names.end();
}

LaunchPlan make_plan(const PlanInputs& in) {
  const Options& o = in.opts;
  DS_USER_CHECK((o.num_nodes <= 0 && o.num_gpus <= 0) || (o.include.empty() && o.exclude.empty()),
                "--num_nodes/--num_gpus cannot be combined with --include/--exclude");
  LaunchPlan p;
  std::string include = o.include;
  ResourcePool pool = in.hostfile_pool ? *in.hostfile_pool : no_hostfile_pool(in, &include, &p.notes);
  p.active = limit_resources(filter_resources(pool, include, o.exclude), pool, o.num_nodes, o.num_gpus);
  choose_transport(p, in);
  choose_master(p, in);
  p.master_port = o.master_port;
  // With restarts each attempt has its own token, so a token seen in one
  // attempt cannot log in to the next one's store.
  p.job_token = o.max_restarts > 0 ? attempt_token(in.job_token, in.attempt) : in.job_token;
  p.exports = exported_env(in.environ_entries);
  for (const auto& [k, v] : in.env_file_vars) env_set(p.exports, k, v);
  // The token travels as itself (agent_env), never as a copy of dsrun's variable.
  p.exports.erase(std::remove_if(p.exports.begin(), p.exports.end(),
                                 [](const auto& kv) { return kv.first == "DS_JOB_TOKEN"; }),
                  p.exports.end());
  build_commands(p, in);
  return p;
}

void build_commands(LaunchPlan& p, const PlanInputs& in) {
  const Options& o = in.opts;
  p.world_info = encode_world_info(p.active);
  AgentOptions& a = p.agent;
  a.world_info = p.world_info;
  a.master_addr = p.master_addr;
  a.master_port = p.master_port;
  a.job_token = p.job_token;
  a.no_local_rank = o.no_local_rank;
  a.each_rank_log = o.each_rank_log;
  a.bind_cores_to_rank = o.bind_cores_to_rank;
  a.bind_core_list = o.bind_core_list;
  a.save_pid = o.save_pid ? in.head_pid : 0;
  a.teardown_grace = o.teardown_grace;
  // Over the built-in ssh the head stops a node by closing its channel (sshd
  // may refuse signal requests): the agent stops on end of input.
  a.stop_on_stdin_eof = p.transport == Transport::Ssh;
  a.env_from_stdin = p.transport == Transport::Ssh;
  p.env_file = p.transport == Transport::Pdsh ? in.private_env_file : "";
  a.env_file = p.env_file;
  // With restarts the head must tell a silent node (cut link, hung host) from
  // a slow one: its agent writes a heartbeat line four times per timeout
  // (at most once a second).
  a.heartbeat = p.transport == Transport::Ssh && o.max_restarts > 0 && o.heartbeat_timeout > 0
                    ? std::min(1.0, o.heartbeat_timeout / 4)
                    : 0;
  // Every agent, whatever the transport, watches its own ranks (liveness.h).
  a.heartbeat_timeout = o.heartbeat_timeout;
  p.agent_env = p.exports;
  env_set(p.agent_env, "DS_JOB_TOKEN", p.job_token);
  a.program = o.program;
  a.args = o.args;
  p.agent_argv = concat({in.dsrun_path, "--agent"}, agent_flags(a));
  p.agent_tail = concat({"--", o.program}, o.args);
  p.remote_prefix = p.transport == Transport::Ssh ? remote_shell_prefix(in) : "";
  p.agent_stdin = p.transport == Transport::Ssh ? encode_env_lines(p.agent_env) : "";
  p.nodes.clear();
  for (int n = 0; n < static_cast<int>(p.active.size()); ++n) p.nodes.push_back({p.active[n].host, n});
  p.head_env.clear();
  p.head_command = head_command(p, in, p.agent_argv, p.agent_tail, &p.head_env);
  p.ranks.clear();
  Rendezvous rv{p.master_addr, p.master_port, p.job_token};
  for (int n = 0; n < static_cast<int>(p.active.size()); ++n) {
    for (const auto& info : ranks_of_node(p.active, n)) {
      int omp = 0;
      if (o.bind_cores_to_rank && !o.bind_core_list.empty())
        omp = static_cast<int>(cores_for_rank(parse_core_list(o.bind_core_list), info.local_size, 0).size());
      p.ranks.push_back({info, rank_argv(o.program, o.args, info.local_rank, o.no_local_rank),
                         rank_env(info, rv, omp)});
    }
  }
}

std::vector<std::string> node_agent_argv(const LaunchPlan& p, int node_rank) {
  const std::string selector = node_rank < 0 ? "<node_rank>" : std::to_string(node_rank);
  return concat(concat(p.agent_argv, {"--node_rank=" + selector}), p.agent_tail);
}

std::string node_remote_command(const LaunchPlan& p, int node_rank) {
  return p.remote_prefix + shell_join(node_agent_argv(p, node_rank));
}

std::string plan_to_json(const LaunchPlan& p) {
  using J = nlohmann::ordered_json;
  auto env_json = [](const EnvList& env) {
    J j = J::object();
    for (const auto& [k, v] : env) j[k] = v;
    return j;
  };
  J j;
  j["launcher"] = transport_name(p.transport);
  j["multi_node"] = p.multi_node;
  J hosts = J::array();
  for (const auto& n : p.active) hosts.push_back({{"host", n.host}, {"slots", n.slots}});
  j["hosts"] = hosts;
  j["world_info"] = p.world_info;
  j["world_size"] = world_size(p.active);
  j["master_addr"] = p.master_addr;
  j["master_addr_discovered_at_launch"] = p.discover_master;
  j["master_port"] = p.master_port;
  j["job_token"] = p.job_token;
  j["exports"] = env_json(p.exports);
  if (!p.env_file.empty()) j["agent_env_file"] = p.env_file + ".<node_rank>";
  J nodes = J::array();
  for (const auto& n : p.nodes) nodes.push_back({{"host", n.host}, {"node_rank", n.node_rank}});
  j["nodes"] = nodes;
  // Once, with the node's rank as "<node_rank>": every node's command holds
  // the whole world info, so one per node would grow as hosts x ranks.
  if (p.transport == Transport::Local || p.transport == Transport::Ssh) j["agent_argv"] = node_agent_argv(p, -1);
  if (p.transport == Transport::Ssh) j["remote_command"] = node_remote_command(p, -1);
  if (!p.head_command.empty()) {
    j["launcher_command"] = p.head_command;
    j["launcher_env"] = env_json(p.head_env);
  }
  J ranks = J::array();
  for (const auto& r : p.ranks)
    ranks.push_back({{"rank", r.info.rank}, {"host", r.info.host}, {"node_rank", r.info.node_rank},
                     {"local_rank", r.info.local_rank}, {"argv", r.argv}, {"env", env_json(r.env)}});
  j["ranks"] = ranks;
  j["notes"] = p.notes;
  return j.dump(2);
}

}  // namespace ds::launch
