// Real local launches through the dsrun binary: rank environment, output
// prefixes and logs, exact exit codes, crashes, hangs, Ctrl-C / SIGTERM /
// SIGKILL of dsrun, core binding, user errors -- and after every launch a
// /proc scan proving that no process of the job is left.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "test/launcher/test_util.h"

using namespace ds::launch::test;

namespace {

// A single-node hostfile named "localhost" keeps the tests independent of GPUs and /job/hostfile.
struct LocalJob {
  TempDir dir;
  std::string token = new_token();
  std::string hostfile;
  explicit LocalJob(int slots = 4) {
    hostfile = dir.path() + "/hosts";
    write_file(hostfile, "# test node\nlocalhost slots=" + std::to_string(slots) + "\n");
  }
  std::vector<std::string> dsrun(std::vector<std::string> flags, std::vector<std::string> prog) const {
    std::vector<std::string> argv = {dsrun_bin(), "--hostfile", hostfile};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(probe_bin());
    argv.insert(argv.end(), prog.begin(), prog.end());
    return argv;
  }
  RunResult run(std::vector<std::string> flags, std::vector<std::string> prog, double timeout = 30,
                std::function<void(pid_t)> during = nullptr) const {
    return run_cmd(dsrun(flags, prog), {{"DS_JOB_TOKEN", token}}, timeout, during);
  }
  // No process of this job may survive dsrun's exit (or, with wait_s, outlive
  // it by more than that).
  void check_no_leftovers(double wait_s = 0) const {
    CHECK(kill_leftovers(token, wait_s).empty());
  }
};

// Waits for n rank processes (plus dsrun itself) before acting.
std::function<void(pid_t)> signal_when_running(const std::string& token, size_t n, int sig) {
  return [=](pid_t pid) {
    REQUIRE(wait_for_token_procs(token, n + 1, 10));
    usleep(100000);
    kill(pid, sig);
  };
}

}  // namespace

TEST_CASE("local: every rank gets its rendezvous environment", "[launcher]") {
  LocalJob job;
  auto r = job.run({"--include", "localhost:1,3", "--master_port", "31234"}, {"env", job.dir.path(), "--flag", "a b"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::string env = read_file(job.dir.path() + "/rank_" + std::to_string(rank) + ".env");
    CHECK(env_value(env, "RANK") == std::to_string(rank));
    CHECK(env_value(env, "LOCAL_RANK") == std::to_string(rank));
    CHECK(env_value(env, "WORLD_SIZE") == "2");
    CHECK(env_value(env, "LOCAL_SIZE") == "2");
    CHECK(env_value(env, "CROSS_RANK") == "0");
    CHECK(env_value(env, "CROSS_SIZE") == "1");
    CHECK(env_value(env, "MASTER_ADDR") == "127.0.0.1");
    CHECK(env_value(env, "MASTER_PORT") == "31234");
    CHECK(env_value(env, "CUDA_VISIBLE_DEVICES") == "1,3");
    CHECK(env_value(env, "DS_JOB_TOKEN") == job.token);
    CHECK(env_value(env, "DS_OUTPUT_RANK_PREFIXED") == "1");  // the agent prefixes its lines
    CHECK(env_value(env, "argv1") == "--local_rank=" + std::to_string(rank));
    CHECK(env_value(env, "argv2") == "env");
    CHECK(env_value(env, "argv4") == "--flag");
    CHECK(env_value(env, "argv5") == "a b");
  }
  CHECK_THAT(r.out, Catch::Contains("[rank 0] hello from rank 0\n"));
  CHECK_THAT(r.out, Catch::Contains("[rank 1] hello from rank 1\n"));
  CHECK_THAT(r.err, Catch::Contains("[rank 1] stderr from rank 1\n"));
  job.check_no_leftovers();
}

TEST_CASE("local: --no_local_rank and --enable_each_rank_log", "[launcher]") {
  LocalJob job;
  std::string logs = job.dir.path() + "/logs";
  auto r = job.run({"--num_gpus", "2", "--no_local_rank", "--enable_each_rank_log", logs}, {"env", job.dir.path()});
  REQUIRE(r.code == 0);
  CHECK(env_value(read_file(job.dir.path() + "/rank_1.env"), "argv1") == "env");
  // Each rank's output goes to its own file, unprefixed: its warnings name the rank.
  CHECK(env_value(read_file(job.dir.path() + "/rank_1.env"), "DS_OUTPUT_RANK_PREFIXED") == "<unset>");
  CHECK(r.out.find("hello") == std::string::npos);
  std::string log1 = read_file(logs + "/rank_1.log");
  CHECK_THAT(log1, Catch::Contains("hello from rank 1"));
  CHECK_THAT(log1, Catch::Contains("stderr from rank 1"));
  job.check_no_leftovers();
}

TEST_CASE("local: the first failing rank's exit code is dsrun's, siblings are stopped", "[launcher]") {
  LocalJob job;
  auto r = job.run({}, {"exit", "7", "2"});
  CHECK(r.code == 7);
  CHECK_THAT(r.err, Catch::Contains("rank 2 (host localhost, local rank 2) exit code 7"));
  CHECK(r.seconds < 10);
  job.check_no_leftovers();
}

TEST_CASE("local: a crash is reported as 128+signal", "[launcher]") {
  LocalJob job;
  auto r = job.run({}, {"crash", "1"});
  CHECK(r.code == 128 + SIGSEGV);
  CHECK_THAT(r.err, Catch::Contains("killed by SIGSEGV (exit code 139)"));
  job.check_no_leftovers();
}

TEST_CASE("local: all ranks succeeding gives 0, 64 ranks", "[launcher]") {
  LocalJob job(64);
  auto r = job.run({}, {"exit", "0"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  job.check_no_leftovers();
}

TEST_CASE("local: Ctrl-C and SIGTERM stop every rank with 128+signal", "[launcher]") {
  for (int sig : {SIGINT, SIGTERM}) {
    LocalJob job;
    auto r = job.run({}, {"hang"}, 30, signal_when_running(job.token, 4, sig));
    CHECK(r.code == 128 + sig);
    CHECK_THAT(r.err, Catch::Contains("received " + std::string(sig == SIGINT ? "SIGINT" : "SIGTERM")));
    CHECK(r.seconds < 10);
    job.check_no_leftovers();
  }
}

TEST_CASE("local: ranks ignoring SIGTERM are killed after the grace period", "[launcher]") {
  LocalJob job;
  auto r = job.run({"--teardown_grace", "1"}, {"hang_ignore_term"}, 30, signal_when_running(job.token, 4, SIGINT));
  CHECK(r.code == 130);
  CHECK(r.seconds < 6);
  job.check_no_leftovers();
}

TEST_CASE("local: grandchildren of a failed rank do not survive", "[launcher]") {
  LocalJob job;
  auto r = job.run({}, {"grandchild", "3", "0"});
  CHECK(r.code == 3);
  job.check_no_leftovers();
}

TEST_CASE("local: SIGKILL of dsrun takes the ranks with it", "[launcher]") {
  LocalJob job;
  auto r = job.run({}, {"hang"}, 30, signal_when_running(job.token, 4, SIGKILL));
  CHECK(r.code == 128 + SIGKILL);
  usleep(300000);
  job.check_no_leftovers();
}

TEST_CASE("local: SIGKILL of dsrun leaves nothing behind, children and setsid grandchildren included",
          "[launcher]") {
  LocalJob job;
  // dsrun (guard and worker) and two ranks, each with a child in its group and a
  // setsid grandchild: 2 + 2 * 3 processes carry the job's token.
  auto r = job.run({"--num_gpus", "2", "--teardown_grace", "1"}, {"family"}, 30,
                   signal_when_running(job.token, 1 + 2 * 3, SIGKILL));
  CHECK(r.code == 128 + SIGKILL);
  job.check_no_leftovers(10);
}

TEST_CASE("local: SIGKILL of the agent under dsrun leaves nothing behind", "[launcher]") {
  LocalJob job;
  auto r = job.run({"--num_gpus", "2", "--teardown_grace", "1"}, {"family"}, 30, [&](pid_t pid) {
    REQUIRE(wait_for_token_procs(job.token, 2 + 2 * 3, 10));
    pid_t worker = 0;  // the child of dsrun that starts and supervises the ranks
    for (pid_t p : pids_with_token(job.token))
      if (parent_of(p) == pid) worker = p;
    REQUIRE(worker > 0);
    kill(worker, SIGKILL);
  });
  CHECK(r.code == 128 + SIGKILL);
  job.check_no_leftovers(10);
}

TEST_CASE("local: the job token never appears in a command line", "[launcher]") {
  LocalJob job;
  std::vector<pid_t> seen;
  auto r = job.run({"--num_gpus", "2"}, {"hang"}, 30, [&](pid_t pid) {
    REQUIRE(wait_for_token_procs(job.token, 2 + 2, 10));
    seen = pids_with_in_cmdline(job.token);
    kill(pid, SIGINT);
  });
  CHECK(r.code == 130);
  CHECK(seen.empty());
  job.check_no_leftovers(5);
}

TEST_CASE("local: a launch that fails partway is one clear error and leaves nothing behind", "[launcher]") {
  LocalJob job(300);
  // Few file descriptors: starting 300 ranks runs out of pipes partway.
  std::vector<std::string> argv = {"/bin/sh", "-c", "ulimit -n 64 && exec \"$0\" \"$@\""};
  for (const std::string& a : job.dsrun({"--num_gpus", "300"}, {"hang"})) argv.push_back(a);
  auto r = run_cmd(argv, {{"DS_JOB_TOKEN", job.token}}, 60);
  CHECK(r.code != 0);
  CHECK(r.err.find("internal error") == std::string::npos);
  // One line naming the rank and the reason, without source locations.
  const size_t at = r.err.find("dsrun: error: cannot start rank ");
  REQUIRE(at != std::string::npos);
  CHECK_THAT(r.err.substr(at, r.err.find('\n', at) - at), Catch::Contains(": Too many open files; stopping "));
  CHECK(r.err.find(".cpp:") == std::string::npos);
  job.check_no_leftovers(10);
}

TEST_CASE("local: --bind_cores_to_rank pins ranks and sets OMP_NUM_THREADS", "[launcher]") {
  LocalJob job;
  auto r = job.run({"--num_gpus", "2", "--bind_cores_to_rank", "--bind_core_list", "0-1"}, {"env", job.dir.path()});
  REQUIRE(r.code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::string env = read_file(job.dir.path() + "/rank_" + std::to_string(rank) + ".env");
    CHECK(env_value(env, "cpus") == std::to_string(rank));
    CHECK(env_value(env, "OMP_NUM_THREADS") == "1");
  }
}

TEST_CASE("local: user errors are one line naming the input", "[launcher]") {
  LocalJob job;
  write_file(job.hostfile, "localhost slots=2\n\nworker-1 slots=two\n");
  auto r = job.run({}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK(r.err == "dsrun: error: " + job.hostfile + ":3: bad hostfile line 'worker-1 slots=two': expected "
                 "'HOSTNAME slots=N' with N >= 1\n");
  write_file(job.hostfile, "localhost slots=2\n");
  r = job.run({"--include", "localhost:5"}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("host 'localhost' has no slot 5"));
  r = job.run({"--hostfile", job.dir.path() + "/missing"}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("missing' cannot be read"));
  r = job.run({"--bogus_flag"}, {"exit", "0"});
  CHECK(r.code == 1);
  // Checked up front with exit 1 (127 is kept for a program that cannot be run), even where a local launch
  // would not use the value.
  r = job.run({"--bind_core_list", "3-1"}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK(r.err == "dsrun: error: --bind_core_list '3-1': range '3-1' is reversed\n");
  r = job.run({"--launcher", "sssh"}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK(r.err == "dsrun: error: --launcher 'sssh' is unknown; use ssh, pdsh, slurm, openmpi or mpich\n");
  r = job.run({"--enable_each_rank_log", job.hostfile + "/logs"}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::StartsWith("dsrun: error: --enable_each_rank_log: cannot create '" + job.hostfile +
                                      "/logs'"));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  r = job.run({"--hostfile", job.dir.path()}, {"exit", "0"});
  CHECK(r.code == 1);
  CHECK(r.err == "dsrun: error: hostfile '" + job.dir.path() + "' is a directory (give the file to --hostfile)\n");
  r = run_cmd({dsrun_bin(), "--hostfile", job.hostfile}, {{"DS_JOB_TOKEN", job.token}});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::StartsWith("dsrun: error: no PROGRAM given"));
  r = run_cmd({dsrun_bin(), "--hostfile", job.hostfile, job.dir.path() + "/no_such_program"}, {{"DS_JOB_TOKEN", job.token}});
  CHECK(r.code == 127);
  CHECK_THAT(r.err, Catch::Contains("cannot run '" + job.dir.path() + "/no_such_program': No such file"));
  job.check_no_leftovers();
}

TEST_CASE("local: --dry_run prints the plan and starts nothing", "[launcher]") {
  LocalJob job;
  auto r = run_cmd({dsrun_bin(), "--hostfile", job.hostfile, "--include", "localhost:0,1", "--dry_run",
                    probe_bin(), "env", job.dir.path()}, {{"DS_JOB_TOKEN", job.token}});
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["world_info"] == "eyJsb2NhbGhvc3QiOiBbMCwgMV19");
  CHECK(j["launcher"] == "local");
  CHECK(j["master_addr"] == "127.0.0.1");
  CHECK(j["master_port"] == 29500);
  CHECK(j["ranks"].size() == 2);
  CHECK(j["ranks"][1]["env"]["LOCAL_RANK"] == "1");
  CHECK(j["ranks"][1]["env"]["DS_JOB_TOKEN"] == job.token);
  CHECK(j["ranks"][1]["argv"][1] == "--local_rank=1");
  CHECK(!std::filesystem::exists(job.dir.path() + "/rank_0.env"));
}

TEST_CASE("local: --save_pid writes and removes /tmp/<pid>.deepspeed", "[launcher]") {
  LocalJob job;
  bool seen = false;
  std::string f;
  auto r = job.run({"--save_pid", "--num_gpus", "1"}, {"hang"}, 30, [&](pid_t pid) {
    REQUIRE(wait_for_token_procs(job.token, 2, 10));
    f = "/tmp/" + std::to_string(pid) + ".deepspeed";
    seen = read_file(f) == std::to_string(pid);
    kill(pid, SIGTERM);
  });
  CHECK(seen);
  CHECK(r.code == 143);
  CHECK(!std::filesystem::exists(f));
  job.check_no_leftovers();
}

// /tmp is shared: a symlink planted at /tmp/<dsrun pid>.deepspeed must not
// redirect the write (the target is untouched) and a file already there is not
// overwritten; dsrun refuses before any rank starts. The shell plants the path
// for its own pid, then execs dsrun, which keeps that pid.
TEST_CASE("local: --save_pid refuses a file or symlink already at its path", "[launcher]") {
  for (bool as_link : {true, false}) {
    INFO("planted a " << (as_link ? "symlink" : "regular file"));
    LocalJob job;
    const std::string target = job.dir.path() + "/precious";
    write_file(target, "keep me");
    const std::string plant = as_link ? "ln -s \"$1\" /tmp/$$.deepspeed" : "cp \"$1\" /tmp/$$.deepspeed";
    std::vector<std::string> argv = {"/bin/sh", "-c", plant + " && shift && exec \"$@\"", "sh", target};
    for (auto& w : job.dsrun({"--save_pid", "--num_gpus", "1"}, {"env", job.dir.path()})) argv.push_back(w);
    pid_t pid = 0;
    auto r = run_cmd(argv, {{"DS_JOB_TOKEN", job.token}}, 30, [&](pid_t p) { pid = p; });
    const std::string path = "/tmp/" + std::to_string(pid) + ".deepspeed";
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK_THAT(r.err, Catch::Contains("'" + path + "' already exists"));
    CHECK(read_file(target) == "keep me");
    CHECK(std::filesystem::is_symlink(path) == as_link);
    CHECK(read_file(path) == "keep me");
    CHECK(!std::filesystem::exists(job.dir.path() + "/rank_0.env"));
    std::filesystem::remove(path);
    job.check_no_leftovers();
  }
}

// At exit only the file dsrun created is removed: one put in its place while
// the job ran is left alone.
TEST_CASE("local: --save_pid does not remove a file swapped in for its own", "[launcher]") {
  LocalJob job;
  std::string f;
  auto r = job.run({"--save_pid", "--num_gpus", "1"}, {"hang"}, 30, [&](pid_t pid) {
    REQUIRE(wait_for_token_procs(job.token, 2, 10));
    f = "/tmp/" + std::to_string(pid) + ".deepspeed";
    write_file(f + ".new", "someone else's");
    std::filesystem::rename(f + ".new", f);
    kill(pid, SIGTERM);
  });
  CHECK(r.code == 143);
  CHECK(read_file(f) == "someone else's");
  std::filesystem::remove(f);
  job.check_no_leftovers();
}
