// Table-driven tests of dsrun's pure core: hostfile parsing, include/exclude,
// world info encoding, rank env, core shares, quoting, env files, the plan and
// the sweep of heartbeat directories that killed agents left.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "launcher/env_export.h"
#include "launcher/hostfile.h"
#include "launcher/liveness.h"
#include "launcher/plan.h"
#include "launcher/rank_env.h"
#include "launcher/resources.h"
#include "launcher/shell.h"
#include "launcher/world_info.h"
#include "lib/core/crypto.h"
#include "lib/core/error.h"

using namespace ds::launch;

namespace {

// The message of the ds::UserError `f` throws ("" when it does not throw).
template <class F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const ds::UserError& e) {
    return e.what();
  }
  return "";
}

ResourcePool pool3() { return {{"worker-0", 4}, {"worker-1", 4}, {"worker-2", 2}}; }

}  // namespace

TEST_CASE("hostfile: valid files parse in order", "[launcher]") {
  struct Case {
    const char* text;
    ResourcePool want;
  };
  std::vector<Case> cases = {
      {"worker-0 slots=8\nworker-1 slots=8\n", {{"worker-0", 8}, {"worker-1", 8}}},
      {"# cluster\n\n  worker-1   slots=2  \n\tworker-0 slots=1\n", {{"worker-1", 2}, {"worker-0", 1}}},
      {"localhost slots=4 # the only node\n", {{"localhost", 4}}},
      {"10.0.0.1 slots=1\r\n10.0.0.2 slots=3\r\n", {{"10.0.0.1", 1}, {"10.0.0.2", 3}}},
      {"a slots=1", {{"a", 1}}},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    CHECK(parse_hostfile(c.text, "hosts") == c.want);
  }
}

TEST_CASE("hostfile: errors name the file and line", "[launcher]") {
  struct Case {
    const char* text;
    const char* want;  // substring of the message
  };
  std::vector<Case> cases = {
      {"worker-0 slots=8\nworker-1\n", "hosts:2: bad hostfile line 'worker-1'"},
      {"worker-0 slots=x\n", "hosts:1: bad hostfile line"},
      {"worker-0 slots=0\n", "hosts:1:"},
      {"worker-0 slot=2\n", "hosts:1:"},
      {"worker-0 slots=2 extra\n", "hosts:1:"},
      {"# only comments\n\n", "hosts: hostfile has no hosts"},
      {"", "hostfile has no hosts"},
      {"a slots=1\nb slots=1\n\na slots=2\n", "hosts:4: host 'a' is listed twice"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    std::string msg = user_error([&] { parse_hostfile(c.text, "hosts"); });
    CHECK_THAT(msg, Catch::Contains(c.want));
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("include/exclude select slots in hostfile order", "[launcher]") {
  struct Case {
    const char* include;
    const char* exclude;
    ActiveResources want;
  };
  std::vector<Case> cases = {
      {"", "", {{"worker-0", {0, 1, 2, 3}}, {"worker-1", {0, 1, 2, 3}}, {"worker-2", {0, 1}}}},
      {"worker-1", "", {{"worker-1", {0, 1, 2, 3}}}},  // bare host = all slots
      {"worker-2:1@worker-0:3,1", "", {{"worker-0", {1, 3}}, {"worker-2", {1}}}},
      {"worker-0:2,2,0@worker-0:1", "", {{"worker-0", {0, 1, 2}}}},
      {"", "worker-1", {{"worker-0", {0, 1, 2, 3}}, {"worker-2", {0, 1}}}},
      {"", "worker-0:0,1@worker-2:0,1", {{"worker-0", {2, 3}}, {"worker-1", {0, 1, 2, 3}}}},
  };
  for (const auto& c : cases) {
    INFO("include=" << c.include << " exclude=" << c.exclude);
    CHECK(filter_resources(pool3(), c.include, c.exclude) == c.want);
  }
}

TEST_CASE("include/exclude errors name the host or slot", "[launcher]") {
  struct Case {
    const char* include;
    const char* exclude;
    const char* want;
  };
  std::vector<Case> cases = {
      {"worker-9", "", "--include: host 'worker-9' is not in the hostfile"},
      {"worker-2:2", "", "host 'worker-2' has no slot 2"},
      {"", "worker-7:0", "--exclude: host 'worker-7'"},
      {"worker-0:a", "", "slot 'a' is not a non-negative integer"},
      {"worker-0@", "", "empty node spec"},
      {"worker-0", "worker-1", "mutually exclusive"},
      {"", "worker-0@worker-1@worker-2", "leaves no slots"},
  };
  for (const auto& c : cases) {
    INFO("include=" << c.include << " exclude=" << c.exclude);
    CHECK_THAT(user_error([&] { filter_resources(pool3(), c.include, c.exclude); }), Catch::Contains(c.want));
  }
}

TEST_CASE("num_nodes / num_gpus and the local pool", "[launcher]") {
  auto all = all_slots(pool3());
  CHECK(limit_resources(all, pool3(), 2, -1) == ActiveResources{{"worker-0", {0, 1, 2, 3}}, {"worker-1", {0, 1, 2, 3}}});
  CHECK(limit_resources(all, pool3(), -1, 2) ==
        ActiveResources{{"worker-0", {0, 1}}, {"worker-1", {0, 1}}, {"worker-2", {0, 1}}});
  CHECK_THAT(user_error([&] { limit_resources(all, pool3(), 4, -1); }), Catch::Contains("--num_nodes 4"));
  CHECK_THAT(user_error([&] { limit_resources(all, pool3(), -1, 3); }), Catch::Contains("'worker-2'"));
  CHECK(local_pool(8, -1, "") == ResourcePool{{"localhost", 8}});
  CHECK(local_pool(0, -1, "") == ResourcePool{{"localhost", 1}});
  CHECK(local_pool(0, 3, "") == ResourcePool{{"localhost", 3}});
  CHECK(local_pool(0, -1, "localhost:0,5") == ResourcePool{{"localhost", 6}});
}

TEST_CASE("world info matches DeepSpeed's encoding", "[launcher]") {
  struct Case {
    ActiveResources active;
    const char* json;
    const char* b64;
  };
  std::vector<Case> cases = {
      {{{"localhost", {0, 1}}}, R"({"localhost": [0, 1]})", "eyJsb2NhbGhvc3QiOiBbMCwgMV19"},
      {{{"localhost", {0}}}, R"({"localhost": [0]})", "eyJsb2NhbGhvc3QiOiBbMF19"},
      {{{"worker-0", {0, 1}}, {"worker-1", {2}}}, R"({"worker-0": [0, 1], "worker-1": [2]})",
       "eyJ3b3JrZXItMCI6IFswLCAxXSwgIndvcmtlci0xIjogWzJdfQ=="},
  };
  for (const auto& c : cases) {
    CHECK(world_info_json(c.active) == c.json);
    CHECK(encode_world_info(c.active) == c.b64);
    CHECK(decode_world_info(c.b64) == c.active);
  }
  CHECK(base64_urlsafe_encode("\xfb\xff") == "-_8=");
  CHECK(base64_decode("-_8=") == "\xfb\xff");
  CHECK_THAT(user_error([] { decode_world_info("!!!"); }), Catch::Contains("not base64"));
}

TEST_CASE("rank env numbers ranks node by node", "[launcher]") {
  ActiveResources active = {{"a", {0, 2}}, {"b", {1, 3, 5}}};
  auto ranks = ranks_of_node(active, 1);
  REQUIRE(ranks.size() == 3);
  CHECK(ranks[0].rank == 2);
  CHECK(ranks[2].rank == 4);
  EnvList env = rank_env(ranks[1], {"10.1.1.1", 1234, "tok"}, 4);
  EnvList want = {{"RANK", "3"},         {"LOCAL_RANK", "1"},  {"WORLD_SIZE", "5"},
                  {"LOCAL_SIZE", "3"},   {"CROSS_RANK", "1"},  {"CROSS_SIZE", "2"},
                  {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "1234"},
                  {"CUDA_VISIBLE_DEVICES", "1,3,5"}, {"DS_JOB_TOKEN", "tok"}, {"OMP_NUM_THREADS", "4"}};
  CHECK(env == want);
  CHECK(rank_argv("prog", {"--x", "1"}, 2, false) == std::vector<std::string>{"prog", "--local_rank=2", "--x", "1"});
  CHECK(rank_argv("prog", {"--x"}, 2, true) == std::vector<std::string>{"prog", "--x"});
}

TEST_CASE("core lists and per-rank shares", "[launcher]") {
  CHECK(parse_core_list("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(format_core_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
  std::vector<int> cores = parse_core_list("0-7");
  CHECK(cores_for_rank(cores, 3, 0) == std::vector<int>{0, 1});
  CHECK(cores_for_rank(cores, 3, 2) == std::vector<int>{4, 5});
  CHECK_THAT(user_error([] { parse_core_list("0-x"); }), Catch::Contains("'x'"));
  CHECK_THAT(user_error([] { parse_core_list("5-2"); }), Catch::Contains("reversed"));
  CHECK_THAT(user_error([&] { cores_for_rank({0, 1}, 3, 0); }), Catch::Contains("2 cores"));
}

TEST_CASE("shell quoting round-trips and blocks injection", "[launcher]") {
  std::vector<std::pair<std::string, std::string>> cases = {
      {"plain", "plain"},
      {"", "''"},
      {"a b", "'a b'"},
      {"it's", "'it'\"'\"'s'"},
      {"$(rm -rf /)", "'$(rm -rf /)'"},
      {"x;y|z&`w`", "'x;y|z&`w`'"},
      {"--world_info=eyJ=", "--world_info=eyJ="},
  };
  for (const auto& [in, want] : cases) {
    CHECK(shell_quote(in) == want);
    CHECK(shell_split(shell_quote(in), "t") == std::vector<std::string>{in});
  }
  CHECK(shell_split(R"(-x "a b" 'c d' e\ f)", "t") == std::vector<std::string>{"-x", "a b", "c d", "e f"});
  CHECK_THAT(user_error([] { shell_split("'open", "--launcher_args"); }), Catch::Contains("--launcher_args"));
}

TEST_CASE("exported environment and .deepspeed_env files", "[launcher]") {
  EnvList got = exported_env({"PATH=/bin", "NCCL_DEBUG=INFO", "OMP_NUM_THREADS=2", "DS_X=1", "HOME=/root",
                              "PYTHONPATH=/p", "UCX_TLS=rc", "MV2_X=y", "CUDA_HOME=/c", "DSX=no"});
  EnvList want = {{"CUDA_HOME", "/c"}, {"DS_X", "1"}, {"MV2_X", "y"}, {"NCCL_DEBUG", "INFO"},
                  {"OMP_NUM_THREADS", "2"}, {"PYTHONPATH", "/p"}, {"UCX_TLS", "rc"}};
  CHECK(got == want);
  EnvList file = parse_env_file("# comment\n\nA=1\nB = x=y \nexport C='q'\n", "envf");
  CHECK(file == EnvList{{"A", "1"}, {"B", " x=y "}, {"C", "'q'"}});
  CHECK_THAT(user_error([] { parse_env_file("A=1\nnoequals\n", "envf"); }), Catch::Contains("envf:2"));
  CHECK_THAT(user_error([] { parse_env_file("A;rm=1\n", "envf"); }), Catch::Contains("envf:1"));
}

TEST_CASE("agent environment: lines and private files carry any value", "[launcher]") {
  const EnvList env = {{"DS_JOB_TOKEN", "tok"}, {"NASTY", std::string("a\n'b' $(x)\0\xff=", 13)}, {"EMPTY", ""}};
  char tmpl[] = "/tmp/dsrun_core_XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  const std::string dir = std::string(tmpl) + "/.dsrun", file = dir + "/env-1.0";
  write_private_env_file(file, env);
  struct stat st {};
  REQUIRE(stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK_THAT(user_error([&] { write_private_env_file(file, env); }), Catch::Contains("cannot create '" + file));
  CHECK(take_private_env_file(file) == env);
  CHECK(access(file.c_str(), F_OK) != 0);  // read once, then gone
  CHECK_THAT(user_error([&] { take_private_env_file(file); }), Catch::Contains(file));
  write_private_env_file(file, env);
  chmod(file.c_str(), 0644);  // readable by others: refused (and left alone)
  CHECK_THAT(user_error([&] { take_private_env_file(file); }), Catch::Contains("not a private file"));
  unlink(file.c_str());
  chmod(dir.c_str(), 0755);  // a directory others can enter is not used
  CHECK_THAT(user_error([&] { write_private_env_file(file, env); }), Catch::Contains("mode 0700"));
  rmdir(dir.c_str());
  rmdir(tmpl);
}

namespace {

PlanInputs base_inputs() {
  PlanInputs in;
  in.opts.program = "/bin/train";
  in.opts.args = {"--config", "c.json"};
  in.cwd = "/work dir";
  in.dsrun_path = "/opt/dsrun";
  in.job_token = "tok123";
  in.local_names = {"head-node"};
  in.private_env_file = "/home/u/.dsrun/env-1";
  return in;
}

}  // namespace

TEST_CASE("plan: local launch without hostfile", "[launcher]") {
  PlanInputs in = base_inputs();
  in.opts.include = "localhost:0,1";
  LaunchPlan p = make_plan(in);
  CHECK(p.transport == Transport::Local);
  CHECK(p.world_info == "eyJsb2NhbGhvc3QiOiBbMCwgMV19");
  CHECK(p.master_addr == "127.0.0.1");
  REQUIRE(p.ranks.size() == 2);
  CHECK(p.ranks[1].argv == std::vector<std::string>{"/bin/train", "--local_rank=1", "--config", "c.json"});
  auto j = nlohmann::json::parse(plan_to_json(p));
  CHECK(j["launcher"] == "local");
  CHECK(j["world_size"] == 2);
  CHECK(j["ranks"][1]["env"]["RANK"] == "1");
  CHECK(j["ranks"][1]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1");
  CHECK(j["hosts"][0]["slots"] == nlohmann::json::array({0, 1}));
}

TEST_CASE("plan: CUDA_VISIBLE_DEVICES becomes --include like DeepSpeed", "[launcher]") {
  PlanInputs in = base_inputs();
  in.gpu_count = 4;
  in.cuda_visible_devices = "1,3";
  LaunchPlan p = make_plan(in);
  CHECK(p.active == ActiveResources{{"localhost", {1, 3}}});
  in.opts.num_gpus = 2;  // another selector: CUDA_VISIBLE_DEVICES is ignored
  p = make_plan(in);
  CHECK(p.active == ActiveResources{{"localhost", {0, 1}}});
  CHECK_THAT(p.notes.at(0), Catch::Contains("ignored"));
}

TEST_CASE("plan: multi-node commands per transport", "[launcher]") {
  PlanInputs in = base_inputs();
  in.hostfile_pool = ResourcePool{{"w0", 2}, {"w1", 2}};
  in.environ_entries = {"NCCL_DEBUG=INFO", "HOME=/x"};
  in.env_file_vars = {{"FOO", "a b"}};
  in.opts.master_addr = "10.0.0.1";
  in.opts.ssh_port = 2222;

  LaunchPlan ssh = make_plan(in);
  CHECK(ssh.transport == Transport::Ssh);
  REQUIRE(ssh.nodes.size() == 2);
  CHECK(node_remote_command(ssh, 1) ==
        "cd '/work dir' && exec /opt/dsrun --agent "
        "--world_info=eyJ3MCI6IFswLCAxXSwgIncxIjogWzAsIDFdfQ== --master_addr=10.0.0.1 --master_port=29500 "
        "--teardown_grace=5 --stop_on_stdin_eof --env_from_stdin --heartbeat_timeout=30 --node_rank=1 -- /bin/train "
        "--config c.json");
  // The exports and the token travel on stdin, hex-encoded ("a b" = 612062).
  CHECK(ssh.agent_stdin == "NCCL_DEBUG=494e464f\nFOO=612062\nDS_JOB_TOKEN=746f6b313233\n\n");
  CHECK(ssh.ranks[3].env[0] == std::pair<std::string, std::string>{"RANK", "3"});

  in.opts.launcher = "pdsh";
  LaunchPlan pdsh = make_plan(in);
  REQUIRE(pdsh.head_command.size() == 7);
  CHECK(pdsh.head_command[0] == "pdsh");
  CHECK(pdsh.head_command[5] == "w0,w1");
  CHECK_THAT(pdsh.head_command[6], Catch::Contains("--node_name=%h -- /bin/train"));
  // No values on pdsh's command line: the agents read a private file.
  CHECK_THAT(pdsh.head_command[6], Catch::StartsWith("cd '/work dir' && exec /opt/dsrun --agent "));
  CHECK_THAT(pdsh.head_command[6], Catch::Contains(" --env_file=/home/u/.dsrun/env-1 "));
  for (const auto& w : pdsh.head_command) {
    CHECK(w.find("tok123") == std::string::npos);
    CHECK(w.find("INFO") == std::string::npos);
  }
  CHECK(pdsh.env_file == "/home/u/.dsrun/env-1");
  CHECK(pdsh.agent_env == EnvList{{"NCCL_DEBUG", "INFO"}, {"FOO", "a b"}, {"DS_JOB_TOKEN", "tok123"}});
  CHECK(pdsh.head_env == EnvList{{"PDSH_RCMD_TYPE", "ssh"}, {"PDSH_SSH_ARGS", "-2 -a -x -- %h"},
                                  {"PDSH_SSH_ARGS_APPEND", "-p 2222"}});
  in.environ_entries.push_back("PDSH_SSH_ARGS=-l%u %h");  // the user's own: left alone
  CHECK(make_plan(in).head_env == EnvList{{"PDSH_RCMD_TYPE", "ssh"}, {"PDSH_SSH_ARGS_APPEND", "-p 2222"}});
  in.environ_entries.pop_back();

  in.opts.launcher = "slurm";
  in.opts.launcher_args = "--partition=gpu";
  LaunchPlan slurm = make_plan(in);
  std::vector<std::string> want_head = {"srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                        "--nodelist=w0,w1", "--kill-on-bad-exit=1", "--chdir=/work dir",
                                        "--partition=gpu", "/opt/dsrun", "--agent"};
  CHECK(std::vector<std::string>(slurm.head_command.begin(), slurm.head_command.begin() + 10) == want_head);
  CHECK(std::find(slurm.head_command.begin(), slurm.head_command.end(), "--node_name_env=SLURMD_NODENAME") !=
        slurm.head_command.end());
  for (const auto& w : slurm.head_command) CHECK(w.find("--include") == std::string::npos);

  in.opts.launcher = "openmpi";
  in.opts.launcher_args = "";
  LaunchPlan ompi = make_plan(in);
  CHECK(std::vector<std::string>(ompi.head_command.begin(), ompi.head_command.begin() + 5) ==
        std::vector<std::string>{"mpirun", "-n", "2", "--host", "w0:1,w1:1"});
  // Only names on mpirun's command line; the values are in its environment.
  CHECK(std::find(ompi.head_command.begin(), ompi.head_command.end(), "FOO") != ompi.head_command.end());
  for (const auto& w : ompi.head_command) CHECK(w.find("tok123") == std::string::npos);
  CHECK(std::find(ompi.head_env.begin(), ompi.head_env.end(), std::pair<std::string, std::string>{"DS_JOB_TOKEN", "tok123"}) !=
        ompi.head_env.end());

  in.opts.launcher = "mpich";
  LaunchPlan mpich = make_plan(in);
  CHECK(std::find(mpich.head_command.begin(), mpich.head_command.end(), "NCCL_DEBUG,FOO,DS_JOB_TOKEN") !=
        mpich.head_command.end());
  for (const auto& w : mpich.head_command) CHECK(w.find("tok123") == std::string::npos);
  CHECK(std::find(mpich.head_command.begin(), mpich.head_command.end(), "--node_rank_env=PMI_RANK") !=
        mpich.head_command.end());

  in.opts.launcher = "torchrun";
  CHECK_THAT(user_error([&] { make_plan(in); }), Catch::Contains("--launcher 'torchrun'"));
}

TEST_CASE("plan: with --max_restarts every attempt has its own job token", "[launcher]") {
  PlanInputs in = base_inputs();
  in.hostfile_pool = ResourcePool{{"w0", 2}, {"w1", 2}};
  in.opts.master_addr = "10.0.0.1";
  in.environ_entries = {"DS_JOB_TOKEN=tok123", "NCCL_DEBUG=INFO"};  // the job's secret, from dsrun's environment
  in.opts.max_restarts = 3;
  const std::string hex_secret = "746f6b313233";  // "tok123"
  for (const char* launcher : {"ssh", "pdsh", "slurm", "openmpi"}) {
    INFO(launcher);
    in.opts.launcher = launcher;
    std::vector<std::string> tokens;
    for (int attempt = 0; attempt < 3; ++attempt) {
      in.attempt = attempt;
      const LaunchPlan p = make_plan(in);
      CHECK(p.job_token == attempt_token("tok123", attempt));
      CHECK(p.job_token.size() == 64);
      CHECK(p.job_token.find("tok123") == std::string::npos);
      // Every rank and agent of the attempt gets it; the secret goes nowhere.
      for (const auto& r : p.ranks)
        CHECK(std::find(r.env.begin(), r.env.end(), std::pair<std::string, std::string>{"DS_JOB_TOKEN", p.job_token}) !=
              r.env.end());
      CHECK(p.agent_env.back() == std::pair<std::string, std::string>{"DS_JOB_TOKEN", p.job_token});
      for (const auto& [k, v] : p.agent_env) CHECK(v != "tok123");
      for (const auto& [k, v] : p.head_env) CHECK(v != "tok123");
      CHECK(p.agent_stdin.find(hex_secret) == std::string::npos);
      if (p.transport == Transport::Ssh)
        CHECK_THAT(p.agent_stdin, Catch::Contains("DS_JOB_TOKEN=" + ds::crypto::to_hex(p.job_token)));
      if (p.transport == Transport::Slurm || p.transport == Transport::OpenMpi)
        CHECK(std::find(p.head_env.begin(), p.head_env.end(),
                        std::pair<std::string, std::string>{"DS_JOB_TOKEN", p.job_token}) != p.head_env.end());
      CHECK(plan_to_json(p).find("tok123") == std::string::npos);
      tokens.push_back(p.job_token);
    }
    CHECK(tokens[0] != tokens[1]);
    CHECK(tokens[1] != tokens[2]);
    CHECK(tokens[0] != tokens[2]);
  }
  // The same secret gives the same tokens (every node of an attempt agrees);
  // another secret gives others.
  CHECK(attempt_token("tok123", 1) == attempt_token("tok123", 1));
  CHECK(attempt_token("tok124", 1) != attempt_token("tok123", 1));
  // Without restarts the ranks get the job's token itself, as before.
  in.opts.max_restarts = 0;
  in.attempt = 0;
  in.opts.launcher = "ssh";
  CHECK(make_plan(in).job_token == "tok123");
}

TEST_CASE("plan: size is linear in ranks, with many hosts or many slots", "[launcher]") {
  struct Case {
    int hosts, slots;
  };
  for (const Case c : {Case{4000, 1}, Case{4, 1024}, Case{64, 64}}) {
    INFO(c.hosts << " hosts x " << c.slots << " slots");
    PlanInputs in = base_inputs();
    in.hostfile_pool = ResourcePool{};
    for (int h = 0; h < c.hosts; ++h) in.hostfile_pool->push_back({fmt::format("w{}", h), c.slots});
    in.opts.master_addr = "10.0.0.1";
    const LaunchPlan p = make_plan(in);
    const size_t ranks = p.ranks.size(), json = plan_to_json(p).size();
    CHECK(ranks == static_cast<size_t>(c.hosts * c.slots));
    // Per rank: argv and env (CUDA_VISIBLE_DEVICES lists the node's slots),
    // plus the world info a constant number of times.
    CHECK(json < ranks * (1024 + 6 * static_cast<size_t>(c.slots)) + 4 * p.world_info.size());
  }
}

TEST_CASE("plan: single-node and selector rules", "[launcher]") {
  PlanInputs in = base_inputs();
  in.hostfile_pool = ResourcePool{{"head-node", 2}, {"w1", 2}};
  in.opts.include = "head-node";
  CHECK(make_plan(in).transport == Transport::Local);  // one local node: no ssh
  in.opts.force_multi = true;
  CHECK(make_plan(in).transport == Transport::Ssh);
  in.opts.force_multi = false;
  in.opts.include = "w1";
  LaunchPlan remote = make_plan(in);
  CHECK(remote.transport == Transport::Ssh);  // one remote node still goes over ssh
  CHECK(remote.discover_master);
  in.opts.num_gpus = 1;
  CHECK_THAT(user_error([&] { make_plan(in); }), Catch::Contains("cannot be combined"));
  in.opts.include = "";
  in.opts.num_gpus = -1;
  in.opts.no_ssh = true;
  in.opts.node_rank = 1;
  LaunchPlan nossh = make_plan(in);
  CHECK(nossh.transport == Transport::Local);
  CHECK(nossh.local_node_rank == 1);
  CHECK(nossh.master_addr == "head-node");
  in.opts.node_rank = 2;
  CHECK_THAT(user_error([&] { make_plan(in); }), Catch::Contains("--node_rank 2"));
}

TEST_CASE("host names: RFC 1123 names and IP addresses only, everywhere", "[launcher]") {
  for (const char* ok : {"worker-0", "localhost", "node7.cluster.example", "a", "10.0.0.12", "::1", "fe80::1",
                         "2001:db8::42", "X-1.Y-2"})
    CHECK(valid_host_name(ok));
  const std::string long_label(64, 'a');
  for (const std::string& bad : std::vector<std::string>{
           "-oProxyCommand=touch${IFS}/tmp/x", "host;reboot", "a b", "tab\there", "new\nline", "bell\x07",
           "-", "host-", ".lead", "trail.", "two..dots", "under_score", "$(id)", "`id`", "a/b", long_label, ""})
    CHECK_FALSE(valid_host_name(bad));
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {"-oProxyCommand=sh slots=1\n", "hosts:1: '-oProxyCommand=sh' is not a valid host name"},
      {"ok slots=1\nbad;rm slots=1\n", "hosts:2: 'bad;rm' is not a valid host name"},
      {std::string("ctl\x01x slots=1\n"), "hosts:1: 'ctl\\x01x' is not a valid host name"},
      {"big slots=999999\n", "hosts:1: host 'big' has slots=999999; at most 1024 per host"},
      {"edge slots=1025\n", "at most 1024"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    const std::string msg = user_error([&] { parse_hostfile(c.text, "hosts"); });
    CHECK_THAT(msg, Catch::Contains(c.want));
    CHECK(msg.find('\n') == std::string::npos);
  }
  CHECK(parse_hostfile("edge slots=1024\n", "hosts")[0].slots == 1024);
  const ResourcePool pool = parse_hostfile("w0 slots=2\n", "hosts");
  CHECK_THAT(user_error([&] { filter_resources(pool, "-oX=1:0", ""); }),
             Catch::Contains("--include: '-oX=1' is not a valid host name"));
  CHECK_THAT(user_error([&] { local_pool(0, 0, "localhost:999999"); }), Catch::Contains("beyond the 1024 slots"));
  CHECK_THAT(user_error([&] { local_pool(0, 200000, ""); }), Catch::Contains("--num_gpus 200000"));
  PlanInputs in = base_inputs();
  in.opts.include = "localhost:0";
  in.opts.master_addr = "-oProxyCommand=x";
  CHECK_THAT(user_error([&] { make_plan(in); }), Catch::Contains("--master_addr: '-oProxyCommand=x'"));
}


TEST_CASE("heartbeat directories of dead agents untouched for long are swept, nothing else", "[launcher]") {
  namespace fs = std::filesystem;
  char templ[] = "/tmp/hb_sweep_XXXXXX";
  REQUIRE(mkdtemp(templ) != nullptr);
  const fs::path base = templ;
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  setenv("TMPDIR", base.c_str(), 1);  // one of the bases the sweep looks in
  const pid_t child = fork();  // a pid that exists no more once reaped
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  waitpid(child, nullptr, 0);
  auto make = [&](pid_t pid, const std::string& tag, bool old) {
    const fs::path d = base / ("dsrun-hb-" + std::to_string(pid) + "-" + tag);
    fs::create_directories(d);
    std::ofstream(d / "rank_0") << "";
    if (old) {
      const auto then = fs::file_time_type::clock::now() - std::chrono::hours(2);
      fs::last_write_time(d / "rank_0", then);
      fs::last_write_time(d, then);
    }
    return d;
  };
  const fs::path dead_old = make(child, "a", true), dead_recent = make(child, "b", false),
                 live_old = make(getpid(), "c", true);
  const fs::path other = base / "dsrun-hb-notapid";
  fs::create_directories(other);
  remove_stale_heartbeat_dirs(600);
  CHECK_FALSE(fs::exists(dead_old));  // its agent is gone and nobody touched it for 2 hours
  CHECK(fs::exists(dead_recent));     // touched within the quiet time
  CHECK(fs::exists(live_old));        // its agent lives
  CHECK(fs::exists(other));           // not a heartbeat directory name
  if (old_tmpdir)
    setenv("TMPDIR", saved.c_str(), 1);
  else
    unsetenv("TMPDIR");
  fs::remove_all(base);
}
