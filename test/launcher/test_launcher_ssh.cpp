// dsrun over real SSH: an OpenSSH server started by the test on loopback
// addresses (127.0.0.1 and 127.0.0.2 act as two hosts) with generated keys and
// its own known_hosts; the built-in libssh transport and pdsh both launch
// through it. Checks env across nodes, exported variables, exit codes, Ctrl-C,
// loss of the head, host-key refusal, and that no process of a job is left.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "test/launcher/test_util.h"
#include "test/skip.h"

using namespace ds::launch::test;

namespace {

// One sshd for the whole test binary.
struct SshLab {
  TempDir dir;
  int port = free_port();
  std::unique_ptr<Sshd> sshd;
  std::string hostfile;
  SshLab() {
    sshd = std::make_unique<Sshd>(dir.path(), std::vector<std::string>{"127.0.0.1", "127.0.0.2"}, port);
    hostfile = dir.path() + "/hosts";
    write_file(hostfile, "127.0.0.1 slots=2\n127.0.0.2 slots=2\n");
  }
  static SshLab& get() {
    static SshLab lab;
    return lab;
  }
  std::vector<std::string> ssh_flags(const std::string& known_hosts = "") const {
    return {"--ssh_port", std::to_string(port), "--ssh_identity", sshd->user_key(), "--ssh_known_hosts",
            known_hosts.empty() ? sshd->known_hosts() : known_hosts};
  }
};

#define REQUIRE_SSHD(lab) \
  if (!(lab).sshd->ok()) DS_SKIP("cannot start sshd: " << (lab).sshd->error())

struct Job {
  TempDir out;
  std::string token = new_token();
  std::vector<std::pair<std::string, std::string>> env() const { return {{"DS_JOB_TOKEN", token}}; }
  void check_no_leftovers(double wait_s = 0) const {
    CHECK(kill_leftovers(token, wait_s).empty());
  }
};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::function<void(pid_t)> signal_when_running(const std::string& token, size_t n, int sig) {
  return [=](pid_t pid) {
    REQUIRE(wait_for_token_procs(token, n, 15));
    usleep(200000);
    kill(pid, sig);
  };
}

void check_env_files(const std::string& dir, const std::string& token, const std::string& exported) {
  for (int rank = 0; rank < 4; ++rank) {
    std::string env = read_file(dir + "/rank_" + std::to_string(rank) + ".env");
    INFO("rank " << rank << ":\n" << env);
    CHECK(env_value(env, "RANK") == std::to_string(rank));
    CHECK(env_value(env, "LOCAL_RANK") == std::to_string(rank % 2));
    CHECK(env_value(env, "CROSS_RANK") == std::to_string(rank / 2));
    CHECK(env_value(env, "CROSS_SIZE") == "2");
    CHECK(env_value(env, "WORLD_SIZE") == "4");
    CHECK(env_value(env, "MASTER_ADDR") == "127.0.0.1");
    CHECK(env_value(env, "CUDA_VISIBLE_DEVICES") == "0,1");
    CHECK(env_value(env, "DS_JOB_TOKEN") == token);
    CHECK(env_value(env, "DS_TEST_EXPORT") == exported);
    CHECK(env_value(env, "FROM_ENV_FILE") == "yes it is");
    CHECK(env_value(env, "cwd") == std::filesystem::current_path().string());
  }
}

const std::string kNasty = "a 'b' \"c\" $(touch /tmp/dsrun_injected) `x`; y";

}  // namespace

TEST_CASE("ssh: two hosts get consistent ranks and the exported environment", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  std::string envfile = job.out.path() + "/ds_env";
  write_file(envfile, "# extra variables\nFROM_ENV_FILE=yes it is\n");
  auto env = job.env();
  env.push_back({"DS_TEST_EXPORT", kNasty});
  env.push_back({"DS_ENV_FILE", envfile});
  auto r = run_cmd(cat(cat({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1"}, lab.ssh_flags()),
                       {probe_bin(), "env", job.out.path()}),
                   env, 60);
  INFO(r.err);
  REQUIRE(r.code == 0);
  check_env_files(job.out.path(), job.token, kNasty);
  CHECK(!std::filesystem::exists("/tmp/dsrun_injected"));
  CHECK_THAT(r.out, Catch::Contains("[rank 3] hello from rank 3\n"));
  CHECK_THAT(r.err, Catch::Contains("[rank 2] stderr from rank 2\n"));
  job.check_no_leftovers(2);
}

TEST_CASE("ssh: a remote failure stops every node and names host and code", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  auto r = run_cmd(cat(cat({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1"}, lab.ssh_flags()),
                       {probe_bin(), "exit", "9", "3"}),
                   job.env(), 60);
  CHECK(r.code == 9);
  CHECK_THAT(r.err, Catch::Contains("rank 3 (host 127.0.0.2, local rank 1) exit code 9"));
  CHECK_THAT(r.err, Catch::Contains("node 127.0.0.2 (node rank 1) failed with exit code 9"));
  CHECK(r.seconds < 15);
  job.check_no_leftovers(2);
}

TEST_CASE("ssh: Ctrl-C and loss of the head stop every remote rank", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  for (int sig : {SIGINT, SIGKILL}) {
    Job job;
    auto r = run_cmd(cat(cat({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1"}, lab.ssh_flags()),
                         {probe_bin(), "hang"}),
                     job.env(), 60, signal_when_running(job.token, 1 + 2 + 4, sig));
    CHECK(r.code == 128 + sig);
    CHECK(r.seconds < 25);
    job.check_no_leftovers(10);  // every rank on every node gone within 10 s
  }
}

TEST_CASE("ssh: SIGKILL of a remote agent leaves nothing of the job on any node", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  auto r = run_cmd(cat(cat({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1"}, lab.ssh_flags()),
                       {probe_bin(), "family"}),
                   job.env(), 60, [&](pid_t) {
                     // head + 2 agents (guard and worker each) + 4 ranks with a child and a setsid grandchild
                     REQUIRE(wait_for_token_procs(job.token, 1 + 4 + 4 * 3, 15));
                     pid_t guard = 0;  // node 1's agent as sshd started it
                     for (pid_t p : pids_with_in_cmdline("--node_rank=1")) {
                       const std::string proc = "/proc/" + std::to_string(p);
                       const std::string parent = "/proc/" + std::to_string(parent_of(p));
                       if (read_file(proc + "/environ").find(job.token) != std::string::npos &&
                           read_file(parent + "/cmdline").find("--agent") == std::string::npos)
                         guard = p;
                     }
                     REQUIRE(guard > 0);
                     kill(guard, SIGKILL);
                   });
  CHECK(r.code != 0);
  CHECK(r.seconds < 20);
  job.check_no_leftovers(10);
}

TEST_CASE("ssh: Ctrl-C stops remote ranks at once, not after the teardown grace", "[launcher]") {
  // The test sshd refuses signal requests, so the head's only way to reach a
  // node is closing the channel's input: the agent must stop on that at once.
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  auto r = run_cmd(cat(cat({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1",
                            "--teardown_grace", "30"},
                           lab.ssh_flags()),
                       {probe_bin(), "hang"}),
                   job.env(), 90, signal_when_running(job.token, 1 + 2 + 4, SIGINT));
  CHECK(r.code == 128 + SIGINT);
  CHECK(r.seconds < 10);  // far below teardown_grace + 2 = 32 s
  job.check_no_leftovers(5);
}

TEST_CASE("ssh: the job token and the exported variables never appear in a command line", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  const std::string secret = "s3cret-" + job.token;
  std::vector<pid_t> token_seen, secret_seen;
  auto env = job.env();
  env.push_back({"DS_TEST_EXPORT", secret});  // exported to every rank (as in the test above)
  auto r = run_cmd(cat(cat({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1"}, lab.ssh_flags()),
                       {probe_bin(), "hang"}),
                   env, 60, [&](pid_t pid) {
                     REQUIRE(wait_for_token_procs(job.token, 1 + 2 + 4, 15));
                     token_seen = pids_with_in_cmdline(job.token);
                     secret_seen = pids_with_in_cmdline(secret);
                     kill(pid, SIGINT);
                   });
  CHECK(r.code == 128 + SIGINT);
  CHECK(token_seen.empty());
  CHECK(secret_seen.empty());
  job.check_no_leftovers(10);
}

TEST_CASE("ssh: host keys are verified", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  // A known_hosts whose entry for 127.0.0.2 holds another key.
  std::string bad_kh = job.out.path() + "/known_hosts";
  std::string other = job.out.path() + "/other";
  REQUIRE(sh("ssh-keygen -q -t ed25519 -N '' -f " + other) == 0);
  std::string pub = read_file(other + ".pub");
  pub = pub.substr(0, pub.find(' ', pub.find(' ') + 1));
  std::string good = read_file(lab.sshd->known_hosts());
  write_file(bad_kh, good.substr(0, good.find('\n') + 1) + "[127.0.0.2]:" + std::to_string(lab.port) + " " + pub + "\n");
  std::vector<std::string> head = {dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1"};
  auto r = run_cmd(cat(cat(head, lab.ssh_flags(bad_kh)), {probe_bin(), "env", job.out.path()}), job.env());
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("ssh 127.0.0.2: the host key does NOT match"));
  CHECK(!std::filesystem::exists(job.out.path() + "/rank_0.env"));  // nothing started anywhere
  // Unknown host: refused; accepted only with the explicit opt-out.
  write_file(bad_kh, "");
  r = run_cmd(cat(cat(head, lab.ssh_flags(bad_kh)), {probe_bin(), "exit", "0"}), job.env());
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("host key is not in"));
  r = run_cmd(cat(cat(cat(head, lab.ssh_flags(bad_kh)), {"--ssh_no_host_key_check"}), {probe_bin(), "exit", "0"}), job.env());
  CHECK(r.code == 0);
  job.check_no_leftovers(2);
}

TEST_CASE("ssh: an unreachable host is a clear error", "[launcher]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  Job job;
  auto r = run_cmd({dsrun_bin(), "--hostfile", lab.hostfile, "--master_addr", "127.0.0.1", "--ssh_port",
                    std::to_string(free_port()), "--ssh_timeout", "3", probe_bin(), "exit", "0"}, job.env());
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("ssh 127.0.0.1 port"));
  CHECK_THAT(r.err, Catch::Contains("cannot connect"));
}

TEST_CASE("pdsh: the real pdsh binary launches one agent per host", "[launcher][pdsh]") {
  SshLab& lab = SshLab::get();
  REQUIRE_SSHD(lab);
  if (access("/usr/bin/pdsh", X_OK) != 0) DS_SKIP("pdsh is not installed");
  Job job;
  std::string envfile = job.out.path() + "/ds_env";
  write_file(envfile, "FROM_ENV_FILE=yes it is\n");
  auto env = job.env();
  env.push_back({"DS_TEST_EXPORT", kNasty});
  env.push_back({"DS_ENV_FILE", envfile});
  env.push_back({"PDSH_SSH_ARGS_APPEND", "-i " + lab.sshd->user_key() + " -o UserKnownHostsFile=" +
                                             lab.sshd->known_hosts() + " -o StrictHostKeyChecking=yes"});
  std::vector<std::string> head = {dsrun_bin(), "--hostfile", lab.hostfile, "--launcher", "pdsh",
                                   "--ssh_port", std::to_string(lab.port)};
  auto r = run_cmd(cat(head, {"--master_addr", "127.0.0.1", probe_bin(), "env", job.out.path()}), env, 60);
  INFO(r.err);
  REQUIRE(r.code == 0);
  check_env_files(job.out.path(), job.token, kNasty);
  CHECK_THAT(r.out, Catch::Contains("127.0.0.2: [rank 3] hello from rank 3"));
  // Exit code through pdsh -S, and master discovery + ssh check through the same ssh options.
  r = run_cmd(cat(head, {probe_bin(), "exit", "5", "2"}), env, 60);
  CHECK(r.code == 5);
  CHECK_THAT(r.err, Catch::Contains("rank 2 (host 127.0.0.2, local rank 0) exit code 5"));
  job.check_no_leftovers(5);
  Job job2;
  env[0].second = job2.token;
  std::vector<pid_t> token_seen, secret_seen;
  r = run_cmd(cat(head, {"--master_addr", "127.0.0.1", probe_bin(), "hang"}), env, 60, [&](pid_t pid) {
    REQUIRE(wait_for_token_procs(job2.token, 1 + 2 + 4, 15));
    token_seen = pids_with_in_cmdline(job2.token);  // not on pdsh's, ssh's or an agent's command line
    secret_seen = pids_with_in_cmdline("$(touch /tmp/dsrun_injected)");
    kill(pid, SIGINT);
  });
  CHECK(r.code == 130);
  CHECK(token_seen.empty());
  CHECK(secret_seen.empty());
  job2.check_no_leftovers(10);
  // Each agent deleted its private environment file.
  for (const auto& e : std::filesystem::directory_iterator(std::string(getenv("HOME")) + "/.dsrun"))
    CHECK(e.path().filename().string().rfind("env-", 0) != 0);
}
