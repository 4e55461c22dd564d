// dsrun against a live one-node SLURM cluster. As root the test starts munged,
// slurmctld and slurmd (Debian's munge and slurm-wlm) in a temp dir with their
// own key, socket, config, state, logs and free ports, waits for the node to be
// idle, then launches through `--launcher slurm` inside a salloc allocation and
// submits scripts/slurm/*.sbatch with `sbatch --wait` (pretrain_gpt_3d.sbatch
// with the real dstrain as TP2 x PP2 on a tiny dsprep dataset). Checks rank env,
// exit codes, SIGTERM, the 3D job's losses, and that no process of a job or of
// the daemons is left.
// Without root or the packages it is skipped (exit 77) with the reason.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "test/launcher/test_util.h"
#include "test/skip.h"

using namespace ds::launch::test;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

std::string short_hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  std::string h = buf;
  return h.substr(0, h.find('.'));
}

std::string tail_of(const std::string& path, size_t n = 1500) {
  std::string s = read_file(path);
  return s.size() > n ? "..." + s.substr(s.size() - n) : s;
}

// munged + slurmctld + slurmd for one node named after this machine, all under
// one temp dir. Every daemon gets PR_SET_PDEATHSIG so a crashed test takes them
// along; shutdown() stops them by pid and sweeps anything that still carries
// the temp dir's path (every job process inherits SLURM_CONF=<dir>/slurm.conf).
class SlurmLab {
 public:
  SlurmLab() {
    if (getuid() != 0) {
      error_ = "the SLURM test needs root (slurmd starts job steps as their user)";
      return;
    }
    for (const char* b : {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun",
                          "/usr/bin/salloc", "/usr/bin/sbatch", "/usr/bin/sinfo"})
      if (access(b, X_OK) != 0) {
        error_ = std::string(b) + " is not installed (packages munge, slurm-wlm)";
        return;
      }
    char tmpl[] = "/tmp/dsrun_slurm_XXXXXX";
    if (!mkdtemp(tmpl)) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);  // munged wants its socket's directories searchable by all
    node_ = short_hostname();
    conf_ = dir_ + "/slurm.conf";
    for (const char* d : {"/munge", "/state", "/spool", "/jobs"}) mkdir((dir_ + d).c_str(), 0755);
    chmod((dir_ + "/munge").c_str(), 0700);
    if (!start_munge() || !write_conf()) return;
    Env env = {{"SLURM_CONF", conf_}};
    ctld_ = spawn({"/usr/sbin/slurmctld", "-D", "-i"}, dir_ + "/slurmctld.out", env);
    slurmd_ = spawn({"/usr/sbin/slurmd", "-D", "-N", node_}, dir_ + "/slurmd.out", env);
    wait_idle();
  }
  ~SlurmLab() { shutdown(); }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& node() const { return node_; }
  const std::string& dir() const { return dir_; }
  Env env(const std::string& token) const { return {{"SLURM_CONF", conf_}, {"DS_JOB_TOKEN", token}}; }

  // Stops the daemons (slurmd, slurmctld, munged) by pid, then kills and
  // returns whatever still refers to the temp dir. Idempotent.
  std::vector<pid_t> shutdown() {
    for (pid_t* p : {&slurmd_, &ctld_, &munged_}) stop(p);
    std::vector<pid_t> left;
    if (!dir_.empty()) {
      left = pids_with_token(dir_);
      for (pid_t p : left) kill(p, SIGKILL);
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
    return left;
  }

  static SlurmLab& get() {
    static SlurmLab lab;
    return lab;
  }

 private:
  pid_t spawn(const std::vector<std::string>& argv, const std::string& log, const Env& env) {
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> a;
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
    return pid;
  }

  static void stop(pid_t* pid) {
    if (*pid <= 0) return;
    kill(*pid, SIGTERM);
    int st;
    for (int i = 0; i < 200; ++i) {
      if (waitpid(*pid, &st, WNOHANG) == *pid) {
        *pid = -1;
        return;
      }
      usleep(25000);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, &st, 0);
    *pid = -1;
  }

  bool alive(pid_t* pid, const char* name, const std::string& log) {
    int st;
    if (*pid > 0 && waitpid(*pid, &st, WNOHANG) == *pid) {
      *pid = -1;
      error_ = std::string(name) + " exited at start; its log:\n" + tail_of(log);
      return false;
    }
    return true;
  }

  bool start_munge() {
    std::string key = dir_ + "/munge/munge.key";
    {
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::string bytes(1024, '\0');
      rnd.read(bytes.data(), bytes.size());
      write_file(key, bytes);
    }
    chmod(key.c_str(), 0400);
    socket_ = dir_ + "/munge/socket";
    std::string m = dir_ + "/munge/";
    munged_ = spawn({"/usr/sbin/munged", "--foreground", "--force", "--socket=" + socket_, "--key-file=" + key,
                     "--pid-file=" + m + "munged.pid", "--seed-file=" + m + "munged.seed",
                     "--log-file=" + m + "munged.log"},
                    dir_ + "/munged.out", {});
    for (int i = 0; i < 200; ++i) {
      if (!alive(&munged_, "munged", dir_ + "/munged.out")) return false;
      if (access(socket_.c_str(), F_OK) == 0) return true;
      usleep(25000);
    }
    error_ = "munged did not create its socket; its log:\n" + tail_of(dir_ + "/munged.out");
    return false;
  }

  bool write_conf() {
    int ctld_port = free_port(), slurmd_port = free_port();
    for (int i = 0; i < 20 && slurmd_port == ctld_port; ++i) slurmd_port = free_port();
    std::ostringstream c;
    c << "ClusterName=dsruntest\n"
      << "SlurmctldHost=" << node_ << "(127.0.0.1)\n"
      << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << slurmd_port << "\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket_ << "\n"
      << "StateSaveLocation=" << dir_ << "/state\nSlurmdSpoolDir=" << dir_ << "/spool\n"
      << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\nSlurmdPidFile=" << dir_ << "/slurmd.pid\n"
      << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\nSlurmdLogFile=" << dir_ << "/slurmd.log\n"
      << "PlugStackConfig=" << dir_ << "/plugstack.conf\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      << "MpiDefault=none\nReturnToService=2\nMailProg=/bin/true\n"
      << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
      << "JobCompType=jobcomp/none\nSchedulerType=sched/builtin\n"
      << "SlurmctldDebug=info\nSlurmdDebug=info\n"
      << "NodeName=" << node_ << " NodeHostname=" << node_ << " NodeAddr=127.0.0.1 CPUs="
      << std::thread::hardware_concurrency() << " State=UNKNOWN\n"
      << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
    write_file(conf_, c.str());
    write_file(dir_ + "/plugstack.conf", "");  // not the system's /etc/slurm/plugstack.conf
    return true;
  }

  void wait_idle() {
    for (int i = 0; i < 300; ++i) {  // 30 s
      if (!alive(&ctld_, "slurmctld", dir_ + "/slurmctld.out") ||
          !alive(&slurmd_, "slurmd", dir_ + "/slurmd.out"))
        return;
      auto r = run_cmd({"sinfo", "-h", "-n", node_, "-o", "%T"}, {{"SLURM_CONF", conf_}}, 5);
      if (r.code == 0 && r.out.rfind("idle", 0) == 0) return;
      usleep(100000);
    }
    error_ = "node " + node_ + " did not become idle within 30 s; slurmctld:\n" +
             tail_of(dir_ + "/slurmctld.out") + "\nslurmd:\n" + tail_of(dir_ + "/slurmd.out");
  }

  std::string dir_, node_, conf_, socket_, error_;
  pid_t munged_ = -1, ctld_ = -1, slurmd_ = -1;
};

#define REQUIRE_SLURM(lab) \
  if (!(lab).ok()) DS_SKIP("SLURM test: " << (lab).error())

// A fresh per-job directory under the lab (ranks write their env files there).
std::string job_dir(const SlurmLab& lab, const std::string& name) {
  std::string d = lab.dir() + "/jobs/" + name;
  mkdir(d.c_str(), 0755);
  return d;
}

void check_rank_env(const std::string& dir, int world, const std::string& master, const std::string& node,
                    const std::string& token) {
  for (int rank = 0; rank < world; ++rank) {
    std::string e = read_file(dir + "/rank_" + std::to_string(rank) + ".env");
    INFO("rank " << rank << ":\n" << e);
    CHECK(env_value(e, "RANK") == std::to_string(rank));
    CHECK(env_value(e, "LOCAL_RANK") == std::to_string(rank));
    CHECK(env_value(e, "WORLD_SIZE") == std::to_string(world));
    CHECK(env_value(e, "LOCAL_SIZE") == std::to_string(world));
    CHECK(env_value(e, "CROSS_RANK") == "0");
    CHECK(env_value(e, "CROSS_SIZE") == "1");
    CHECK(env_value(e, "MASTER_ADDR") == master);
    CHECK(env_value(e, "DS_JOB_TOKEN") == token);
    CHECK(env_value(e, "argv1") == "--local_rank=" + std::to_string(rank));
    CHECK(env_value(e, "SLURMD_NODENAME") == node);  // the rank runs inside a SLURM job
  }
}

}  // namespace

TEST_CASE("slurm: --launcher slurm inside salloc starts the agent with srun", "[launcher]") {
  SlurmLab& lab = SlurmLab::get();
  REQUIRE_SLURM(lab);
  std::string hostfile = lab.dir() + "/hosts";
  write_file(hostfile, lab.node() + " slots=2\n");
  // One local node runs in-process unless --force_multi: force it through srun.
  std::vector<std::string> head = {"salloc", "-N1", "-w", lab.node(), "--job-name=dsrun-salloc",
                                   dsrun_bin(), "--hostfile", hostfile, "--launcher", "slurm", "--force_multi",
                                   "--master_addr", "127.0.0.1", "--master_port", "29641"};

  std::string token = new_token(), out = job_dir(lab, "salloc_env");
  Env env = lab.env(token);
  env.emplace_back("DS_TEST_EXPORT", "it's $(exported) through srun");
  auto argv = head;
  argv.insert(argv.end(), {probe_bin(), "env", out});
  auto r = run_cmd(argv, env, 60);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[rank 0] hello from rank 0"));
  CHECK_THAT(r.out, Catch::Contains("[rank 1] hello from rank 1"));
  check_rank_env(out, 2, "127.0.0.1", lab.node(), token);
  std::string e0 = read_file(out + "/rank_0.env");
  CHECK(env_value(e0, "SLURM_STEP_ID") == "0");  // started by srun, as the first step of the job
  CHECK(env_value(e0, "DS_TEST_EXPORT") == "it's $(exported) through srun");
  CHECK(env_value(e0, "CUDA_VISIBLE_DEVICES") == "0,1");
  CHECK(env_value(e0, "cwd") == std::filesystem::current_path().string());
  CHECK(kill_leftovers(token, 10).empty());

  // Ranks meet at MASTER_ADDR:MASTER_PORT.
  token = new_token();
  argv = head;
  argv.insert(argv.end(), {probe_bin(), "barrier"});
  r = run_cmd(argv, lab.env(token), 60);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[rank 1] barrier ok rank 1 world 2"));
  CHECK(kill_leftovers(token, 10).empty());

  // The exact exit code of the failing rank comes back through srun and salloc.
  token = new_token();
  argv = head;
  argv.insert(argv.end(), {probe_bin(), "exit", "7", "1"});
  r = run_cmd(argv, lab.env(token), 60);
  INFO(r.out << r.err);
  CHECK(r.code == 7);
  CHECK_THAT(r.err, Catch::Contains("rank 1 (host " + lab.node() + ", local rank 1) exit code 7"));
  CHECK(kill_leftovers(token, 10).empty());

  // A crash is 128+signal.
  token = new_token();
  argv = head;
  argv.insert(argv.end(), {probe_bin(), "crash", "0"});
  r = run_cmd(argv, lab.env(token), 60);
  INFO(r.out << r.err);
  CHECK(r.code == 139);
  CHECK(kill_leftovers(token, 10).empty());
}

// Runs `salloc dsrun --launcher slurm ... launch_probe hang`, sends `sig` to
// dsrun (salloc's child) once both ranks run, and returns salloc's result.
RunResult signal_dsrun_in_salloc(SlurmLab& lab, const std::string& token, int sig) {
  std::string hostfile = lab.dir() + "/hosts";
  write_file(hostfile, lab.node() + " slots=2\n");
  std::vector<std::string> argv = {"salloc", "-N1", "-w", lab.node(), "--job-name=dsrun-signal", dsrun_bin(),
                                   "--hostfile", hostfile, "--launcher", "slurm", "--force_multi",
                                   "--master_addr", "127.0.0.1", "--teardown_grace", "2",
                                   probe_bin(), "hang"};
  return run_cmd(argv, lab.env(token), 60, [&](pid_t salloc) {
    size_t ranks = 0;
    for (int i = 0; i < 300 && ranks < 2; ++i) {
      ranks = 0;
      for (pid_t p : pids_with_token(token))
        if (read_file("/proc/" + std::to_string(p) + "/cmdline").rfind(probe_bin(), 0) == 0) ++ranks;
      if (ranks < 2) usleep(50000);
    }
    REQUIRE(ranks == 2);
    pid_t dsrun = -1;
    for (pid_t p : pids_with_token(token))
      if (parent_of(p) == salloc) dsrun = p;
    REQUIRE(dsrun > 0);
    kill(dsrun, sig);
  });
}

TEST_CASE("slurm: SIGTERM or SIGKILL of dsrun stops the srun step and every rank", "[launcher]") {
  SlurmLab& lab = SlurmLab::get();
  REQUIRE_SLURM(lab);
  std::string token = new_token();
  auto r = signal_dsrun_in_salloc(lab, token, SIGTERM);
  INFO(r.out << r.err);
  CHECK(r.code == 143);
  CHECK_THAT(r.err, Catch::Contains("dsrun: received SIGTERM; stopping all nodes"));
  CHECK(r.seconds < 20);
  CHECK(kill_leftovers(token, 10).empty());

  // dsrun killed outright: srun dies with it (parent-death signal), salloc
  // gives the allocation back, and SLURM ends the step's ranks. (salloc 22.05
  // reports a command killed by a signal as 0, so only the teardown is checked.)
  token = new_token();
  r = signal_dsrun_in_salloc(lab, token, SIGKILL);
  INFO(r.out << r.err);
  CHECK(kill_leftovers(token, 10).empty());
}

TEST_CASE("slurm: sbatch --wait runs scripts/slurm/pretrain_gpt.sbatch", "[launcher]") {
  SlurmLab& lab = SlurmLab::get();
  REQUIRE_SLURM(lab);
  const char* src = std::getenv("DS_SOURCE_DIR");
  REQUIRE(src);
  std::string script = std::string(src) + "/scripts/slurm/pretrain_gpt.sbatch";
  std::string submit = job_dir(lab, "sbatch"), out = job_dir(lab, "sbatch_env");
  std::string token = new_token();
  Env env = lab.env(token);
  for (const auto& kv : Env{{"DSRUN", dsrun_bin()}, {"DSTRAIN", probe_bin()}, {"GPUS_PER_NODE", "2"},
                            {"CONFIG", "configs/probe.json"}, {"MASTER_PORT", "29642"},
                            {"DSRUN_ARGS", "--force_multi"}})
    env.push_back(kv);
  // The script's #SBATCH lines ask for 2 nodes with 8 GPUs each; the command
  // line wins (this cluster has no GPU GRES). env -C: the submit directory.
  std::vector<std::string> head = {"env", "-C", submit, "sbatch", "--wait", "--nodes=1", "--gpus-per-node=0",
                                   "--output=" + submit + "/job-%j.out", script};
  auto argv = head;
  argv.insert(argv.end(), {"env", out});
  auto r = run_cmd(argv, env, 60);
  std::string job_out;
  for (const auto& f : std::filesystem::directory_iterator(submit))
    if (f.path().filename().string().rfind("job-", 0) == 0) job_out += read_file(f.path().string());
  INFO(r.out << r.err << "\njob output:\n" << job_out);
  REQUIRE(r.code == 0);
  CHECK_THAT(job_out, Catch::Contains("hosts: " + lab.node() + " "));
  CHECK_THAT(job_out, Catch::Contains("master: " + lab.node() + ":29642"));
  CHECK_THAT(job_out, Catch::Contains("[rank 1] hello from rank 1"));
  check_rank_env(out, 2, lab.node(), lab.node(), token);
  std::string e1 = read_file(out + "/rank_1.env");
  CHECK(env_value(e1, "SLURM_STEP_ID") == "0");  // dsrun went through srun (--force_multi)
  CHECK(env_value(e1, "argv2") == "--config");
  CHECK(env_value(e1, "argv3") == "configs/probe.json");
  CHECK(env_value(e1, "MASTER_PORT") == "29642");
  CHECK(env_value(e1, "cwd") == submit);
  CHECK(kill_leftovers(token, 10).empty());

  // The failing rank's exit code is the job's exit code.
  token = new_token();
  env[1].second = token;
  argv = head;
  argv.insert(argv.end(), {"exit", "5", "0"});
  r = run_cmd(argv, env, 60);
  INFO(r.out << r.err);
  CHECK(r.code == 5);
  CHECK(kill_leftovers(token, 10).empty());
}

TEST_CASE("slurm: sbatch --wait runs scripts/slurm/pretrain_gpt_srun.sbatch", "[launcher]") {
  SlurmLab& lab = SlurmLab::get();
  REQUIRE_SLURM(lab);
  const char* src = std::getenv("DS_SOURCE_DIR");
  REQUIRE(src);
  std::string script = std::string(src) + "/scripts/slurm/pretrain_gpt_srun.sbatch";
  std::string submit = job_dir(lab, "sbatch_srun"), out = job_dir(lab, "sbatch_srun_env");
  std::string token = new_token();
  Env env = lab.env(token);
  for (const auto& kv : Env{{"DSRUN", dsrun_bin()}, {"DSTRAIN", probe_bin()}, {"GPUS_PER_NODE", "2"},
                            {"CONFIG", "configs/probe.json"}, {"MASTER_PORT", "29643"}})
    env.push_back(kv);
  std::vector<std::string> head = {"env", "-C", submit, "sbatch", "--wait", "--nodes=1", "--gpus-per-node=0",
                                   "--output=" + submit + "/job-%j.out", script};
  auto argv = head;
  argv.insert(argv.end(), {"env", out});
  auto r = run_cmd(argv, env, 60);
  std::string job_out;
  for (const auto& f : std::filesystem::directory_iterator(submit))
    if (f.path().filename().string().rfind("job-", 0) == 0) job_out += read_file(f.path().string());
  INFO(r.out << r.err << "\njob output:\n" << job_out);
  REQUIRE(r.code == 0);
  CHECK_THAT(job_out, Catch::Contains("[rank 0] hello from rank 0"));
  check_rank_env(out, 2, lab.node(), lab.node(), token);
  CHECK(env_value(read_file(out + "/rank_0.env"), "SLURM_STEP_ID") == "0");
  CHECK(kill_leftovers(token, 10).empty());

  token = new_token();
  env[1].second = token;
  argv = head;
  argv.insert(argv.end(), {"exit", "3", "1"});
  r = run_cmd(argv, env, 60);
  INFO(r.out << r.err);
  CHECK(r.code == 3);
  CHECK(kill_leftovers(token, 10).empty());
}

// Column 4 (loss) of a dstrain CSV monitor file (header: iteration,consumed_samples,lr,loss,...).
std::vector<double> csv_losses(const std::string& path) {
  std::istringstream in(read_file(path));
  std::string line;
  std::vector<double> out;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string cell;
    for (int i = 0; i < 4 && std::getline(ss, cell, ','); ++i) {
    }
    if (!cell.empty()) out.push_back(std::stod(cell));
  }
  return out;
}

std::string job_output(const std::string& submit) {
  std::string s;
  for (const auto& f : std::filesystem::directory_iterator(submit))
    if (f.path().filename().string().rfind("job-", 0) == 0) s += read_file(f.path().string());
  return s;
}

// The 3D example with the real trainer: a tiny dataset made with dsprep, then
// dstrain as TP2 x PP2 (4 ranks, DP 1) on the one node, 10 iterations.
TEST_CASE("slurm: sbatch --wait runs scripts/slurm/pretrain_gpt_3d.sbatch with dstrain TP2 x PP2", "[launcher]") {
  SlurmLab& lab = SlurmLab::get();
  REQUIRE_SLURM(lab);
  const char* src = std::getenv("DS_SOURCE_DIR");
  REQUIRE(src);
  const std::string script = std::string(src) + "/scripts/slurm/pretrain_gpt_3d.sbatch";
  const std::string dsprep = binary_dir() + "/apps/dsprep/dsprep", dstrain = binary_dir() + "/apps/dstrain/dstrain";
  REQUIRE(access(dsprep.c_str(), X_OK) == 0);
  REQUIRE(access(dstrain.c_str(), X_OK) == 0);

  const std::string data = job_dir(lab, "gpt3d_data"), submit = job_dir(lab, "sbatch_3d");
  for (const auto& cmd : std::vector<std::vector<std::string>>{
           {dsprep, "--generate-corpus", data + "/corpus.txt", "--size-mb", "0.2", "--seed", "5"},
           {dsprep, "--train-tokenizer", "--input", data + "/corpus.txt", "--vocab-size", "300", "--output-dir",
            data + "/tok"},
           {dsprep, "--input", data + "/corpus.txt", "--output-prefix", data + "/c", "--vocab-file",
            data + "/tok/vocab.json", "--merge-file", data + "/tok/merges.txt"}}) {
    auto r = run_cmd(cmd, {}, 60);
    INFO(cmd[1] << ": " << r.out << r.err);
    REQUIRE(r.code == 0);
  }
  const std::string config = data + "/gpt3d.json";
  write_file(config, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2,\n"
                     " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" + data +
                         "/csv\", \"job_name\": \"gpt3d\"}}\n");

  std::string token = new_token();
  Env env = lab.env(token);
  for (const auto& kv : Env{{"DSRUN", dsrun_bin()}, {"DSTRAIN", dstrain}, {"GPUS_PER_NODE", "4"},
                            {"TP", "2"}, {"PP", "2"}, {"CONFIG", config}, {"DATA_PATH", data + "/c"},
                            {"VOCAB_FILE", data + "/tok/vocab.json"}, {"MERGE_FILE", data + "/tok/merges.txt"},
                            {"MASTER_PORT", std::to_string(free_port())}, {"DSRUN_ARGS", "--force_multi"},
                            {"OMP_NUM_THREADS", "1"}})
    env.push_back(kv);
  // Like the other scripts: the command line overrides the #SBATCH request
  // for 2 nodes with 8 GPUs each (this cluster has one node and no GPU GRES).
  std::vector<std::string> argv = {"env", "-C", submit, "sbatch", "--wait", "--nodes=1", "--gpus-per-node=0",
                                   "--output=" + submit + "/job-%j.out", script,
                                   "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                   "--seq-length", "32", "--max-position-embeddings", "32", "--train-iters", "10",
                                   "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
                                   "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1"};
  auto r = run_cmd(argv, env, 120);
  std::string job_out = job_output(submit);
  INFO(r.out << r.err << "\njob output:\n" << job_out);
  REQUIRE(r.code == 0);
  CHECK_THAT(job_out, Catch::Contains("master: " + lab.node() + ":"));
  CHECK_THAT(job_out, Catch::Contains("layout: world 4 = TP 2 x PP 2 x DP 1"));
  CHECK_THAT(job_out, Catch::Contains("tensor parallel: 2 ranks"));
  CHECK_THAT(job_out, Catch::Contains("pipeline parallel: 2 stages (1F1B), this is stage 0"));
  std::vector<double> losses = csv_losses(data + "/csv/gpt3d/train.csv");
  std::string shown;
  for (double l : losses) shown += std::to_string(l) + " ";
  INFO("losses: " << shown);
  REQUIRE(losses.size() == 10);
  double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[7] + losses[8] + losses[9]) / 3;
  CHECK(last < first);
  CHECK(losses[9] < losses[0]);
  CHECK(kill_leftovers(token, 10).empty());

  // A world size that is not a multiple of TP x PP is refused by the script
  // before any rank starts.
  token = new_token();
  env[1].second = token;
  for (auto& kv : env)
    if (kv.first == "TP") kv.second = "3";
  std::string submit_bad = job_dir(lab, "sbatch_3d_bad");
  argv = {"env", "-C", submit_bad, "sbatch", "--wait", "--nodes=1", "--gpus-per-node=0",
          "--output=" + submit_bad + "/job-%j.out", script};
  r = run_cmd(argv, env, 60);
  job_out = job_output(submit_bad);
  INFO(r.out << r.err << "\njob output:\n" << job_out);
  CHECK(r.code == 2);
  CHECK_THAT(job_out, Catch::Contains("world size 4 (1 nodes x 4) is not a multiple of TP x PP = 3 x 2"));
  CHECK(kill_leftovers(token, 10).empty());
}

// Runs last (Catch keeps declaration order): the daemons stop and nothing that
// refers to the lab's directory may survive them.
TEST_CASE("slurm: stopping the daemons leaves no process behind", "[launcher]") {
  SlurmLab& lab = SlurmLab::get();
  REQUIRE_SLURM(lab);
  std::vector<pid_t> left = lab.shutdown();
  CHECK(left.empty());
}
