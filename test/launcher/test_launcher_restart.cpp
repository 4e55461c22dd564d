// --max_restarts and --elastic_training with the real trainer: dstrain ranks
// (tiny GPT, CPU, a dataset made with dsprep) are killed with SIGKILL at
// random iterations, or their host's link is cut, and dsrun must relaunch the
// job so that it resumes from `latest` and its loss curve (the CSV monitor's
// loss and gradient norm, printed with 9 significant digits: every bit of a
// float) equals that of an uninterrupted run at the same layout. Elastic
// cases run three network-namespace hosts over ssh (test_util.h's NetnsLab).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "launcher/rank_env.h"
#include "test/launcher/test_util.h"
#include "test/skip.h"

using namespace ds::launch::test;
namespace fs = std::filesystem;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

std::string dstrain_bin() { return binary_dir() + "/apps/dstrain/dstrain"; }
std::string dsprep_bin() { return binary_dir() + "/apps/dsprep/dsprep"; }

// A tiny dataset and tokenizer made once per test binary.
struct Data {
  TempDir dir;
  std::string error;
  Data() {
    const std::string d = dir.path();
    for (const auto& cmd : std::vector<std::vector<std::string>>{
             {dsprep_bin(), "--generate-corpus", d + "/corpus.txt", "--size-mb", "0.1", "--seed", "3"},
             {dsprep_bin(), "--train-tokenizer", "--input", d + "/corpus.txt", "--vocab-size", "300", "--output-dir",
              d + "/tok"},
             {dsprep_bin(), "--input", d + "/corpus.txt", "--output-prefix", d + "/c", "--vocab-file",
              d + "/tok/vocab.json", "--merge-file", d + "/tok/merges.txt"}}) {
      auto r = run_cmd(cmd, {}, 60);
      if (r.code != 0) error += cmd[1] + ": " + r.out + r.err;
    }
  }
  static Data& get() {
    static Data data;
    return data;
  }
};

// One CSV row: iteration and the loss and gradient norm exactly as printed.
struct Row {
  int iteration;
  std::string loss, grad_norm;
};

std::vector<Row> csv_rows(const std::string& path) {
  std::vector<Row> rows;
  if (!fs::exists(path)) return rows;
  std::istringstream in(read_file(path));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::istringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    if (cells.size() >= 5) rows.push_back({std::stoi(cells[0]), cells[3], cells[4]});
  }
  return rows;
}

// A job directory: config (CSV monitor into DIR/csv), checkpoints in DIR/ck.
struct TrainJob {
  TempDir dir;
  std::string token = new_token();
  int iters;
  TrainJob(int iters_, const std::string& batch_json) : iters(iters_) {
    write_file(config(), "{" + batch_json + ", \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" +
                             dir.path() + "/csv\", \"job_name\": \"j\"}}\n");
  }
  std::string config() const { return dir.path() + "/ds.json"; }
  std::string ckpt() const { return dir.path() + "/ck"; }
  std::string csv() const { return dir.path() + "/csv/j/train.csv"; }
  std::vector<std::string> dstrain_args() const {
    const std::string d = Data::get().dir.path();
    return {dstrain_bin(), "--config", config(), "--num-layers", "2", "--hidden-size", "32",
            "--num-attention-heads", "4", "--seq-length", "32", "--max-position-embeddings", "32",
            "--train-iters", std::to_string(iters), "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
            "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1", "--data-path", d + "/c",
            "--vocab-file", d + "/tok/vocab.json", "--merge-file", d + "/tok/merges.txt", "--save", ckpt(),
            "--load", ckpt(), "--save-interval", "3"};
  }
  Env env() const { return {{"DS_JOB_TOKEN", token}, {"OMP_NUM_THREADS", "1"}}; }
};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// With --max_restarts dsrun holds the job's secret and each attempt's agents
// and ranks hold that attempt's token (ds::launch::attempt_token); the tests
// here restart at most 5 times.
constexpr int kMaxAttempts = 6;

std::vector<pid_t> job_pids(const std::string& secret) {
  std::vector<pid_t> out = pids_with_token(secret);
  for (int a = 0; a < kMaxAttempts; ++a)
    for (pid_t p : pids_with_token(ds::launch::attempt_token(secret, a)))
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  return out;
}

// kill_leftovers for every token of the job.
std::vector<pid_t> job_leftovers(const std::string& secret, double wait_s) {
  for (double t = 0; t < wait_s && !job_pids(secret).empty(); t += 0.1) usleep(100000);
  std::vector<pid_t> left = kill_leftovers(secret);
  for (int a = 0; a < kMaxAttempts; ++a)
    for (pid_t p : kill_leftovers(ds::launch::attempt_token(secret, a))) left.push_back(p);
  return left;
}

// The pids of the job's dstrain ranks whose environment has NAME=value.
std::vector<pid_t> ranks_with(const std::string& secret, const std::string& name, const std::string& value) {
  std::vector<pid_t> out;
  for (pid_t p : job_pids(secret)) {
    const std::string base = "/proc/" + std::to_string(p);
    if (read_file(base + "/cmdline").find("dstrain") == std::string::npos) continue;
    std::string env = read_file(base + "/environ");
    for (char& c : env)
      if (c == '\0') c = '\n';
    if (("\n" + env).find("\n" + name + "=" + value + "\n") != std::string::npos) out.push_back(p);
  }
  return out;
}

// Waits until the CSV has at least `rows` rows (true) or timeout.
bool wait_rows(const std::string& csv, size_t rows, double timeout_s) {
  for (double t = 0; t < timeout_s; t += 0.01) {
    if (csv_rows(csv).size() >= rows) return true;
    usleep(10000);
  }
  return false;
}

// Every row (repeated iterations included) equals the reference's row for its iteration.
void check_rows_match(const std::vector<Row>& rows, const std::map<int, Row>& ref, const std::string& what) {
  for (const Row& r : rows) {
    INFO(what << ": iteration " << r.iteration);
    REQUIRE(ref.count(r.iteration));
    CHECK(r.loss == ref.at(r.iteration).loss);
    CHECK(r.grad_norm == ref.at(r.iteration).grad_norm);
  }
}

std::map<int, Row> by_iteration(const std::vector<Row>& rows) {
  std::map<int, Row> m;
  for (const Row& r : rows) m.insert_or_assign(r.iteration, r);
  return m;
}

#define REQUIRE_DATA()                                                       \
  do {                                                                       \
    REQUIRE(access(dstrain_bin().c_str(), X_OK) == 0);                      \
    REQUIRE(Data::get().error.empty());                                      \
  } while (0)

const char* kBatch = "\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 1";

}  // namespace

TEST_CASE("restart: kill -9 of a random rank at random iterations, three times; the curve is unchanged",
          "[restart]") {
  REQUIRE_DATA();
  const int iters = 36;
  std::vector<std::string> local = {dsrun_bin(), "--include", "localhost:0,1", "--teardown_grace", "1"};

  TrainJob ref(iters, kBatch);
  auto r = run_cmd(cat(cat(local, {"--master_port", std::to_string(free_port())}), ref.dstrain_args()), ref.env(), 120);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const std::vector<Row> ref_rows = csv_rows(ref.csv());
  REQUIRE(ref_rows.size() == static_cast<size_t>(iters));

  TrainJob job(iters, kBatch);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::vector<std::string> kills;
  auto killer = [&](pid_t) {
    // Three kills at random points of the run (rows written so far, repeats included).
    size_t at = 0;
    for (int k = 0; k < 3; ++k) {
      at += 3 + rng() % 6;
      if (!wait_rows(job.csv(), at, 60)) return;
      const int rank = static_cast<int>(rng() % 2);
      std::vector<pid_t> pids = ranks_with(job.token, "RANK", std::to_string(rank));
      if (pids.size() != 1 || kill(pids[0], SIGKILL) != 0) return;
      kills.push_back("rank " + std::to_string(rank) + " after iteration " +
                      std::to_string(csv_rows(job.csv()).back().iteration));
    }
  };
  r = run_cmd(cat(cat(local, {"--max_restarts", "5", "--master_port", std::to_string(free_port())}),
                  job.dstrain_args()),
              job.env(), 180, killer);
  std::string shown;
  for (const auto& k : kills) shown += k + "; ";
  INFO("seed " << seed << ", killed " << shown << "\n" << r.err);
  REQUIRE(r.code == 0);
  REQUIRE(kills.size() == 3);
  // The killed rank's 137, or its sibling's own error if that one was reaped first.
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 1 of 5 after exit code "));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 3 of 5 after exit code "));
  CHECK_THAT(r.err, !Catch::Contains("restart 4 of 5"));
  CHECK_THAT(r.err, Catch::Contains("; layout: world 2; resuming from iteration "));
  CHECK_THAT(r.err, Catch::Contains("dsrun: the job finished after 3 restart(s)"));
  const std::vector<Row> rows = csv_rows(job.csv());
  check_rows_match(rows, by_iteration(ref_rows), "restarted run");
  CHECK(by_iteration(rows).size() == static_cast<size_t>(iters));
  CHECK(job_leftovers(job.token, 5).empty());
}

// dstrain's side of the liveness watch: it touches DS_HEARTBEAT_FILE as it
// trains, is not stopped by a short --heartbeat_timeout while it starts,
// saves and finishes, and a rank stopped mid-run is found and restarted.
TEST_CASE("restart: a dstrain rank stopped mid-run is found by the heartbeat watch and the job resumes", "[restart]") {
  REQUIRE_DATA();
  const int iters = 30;
  TrainJob job(iters, kBatch);
  long long mtime_first = -1, mtime_later = -1;
  bool stopped = false;
  auto stopper = [&](pid_t) {
    if (!wait_rows(job.csv(), 3, 60)) return;
    std::vector<pid_t> rank0 = ranks_with(job.token, "RANK", "0");
    if (rank0.size() != 1) return;
    std::string env = read_file("/proc/" + std::to_string(rank0[0]) + "/environ");
    const size_t at = env.find("DS_HEARTBEAT_FILE=");
    if (at == std::string::npos) return;
    const std::string hb = env.substr(at + 18, env.find('\0', at) - at - 18);
    auto mtime = [&] {
      struct stat st {};
      return stat(hb.c_str(), &st) == 0 ? st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec : -1LL;
    };
    for (int i = 0; i < 500 && mtime_later <= mtime_first; ++i, usleep(10000)) {  // absent while it saves
      const long long m = mtime();
      if (mtime_first < 0) mtime_first = m;
      else mtime_later = m;
    }
    std::vector<pid_t> rank1 = ranks_with(job.token, "RANK", "1");
    stopped = rank1.size() == 1 && kill(rank1[0], SIGSTOP) == 0;
  };
  auto r = run_cmd(cat({dsrun_bin(), "--include", "localhost:0,1", "--teardown_grace", "1", "--heartbeat_timeout", "1",
                        "--max_restarts", "1", "--master_port", std::to_string(free_port())},
                       job.dstrain_args()),
                   job.env(), 120, stopper);
  INFO(r.err);
  CHECK(mtime_first > 0);
  CHECK(mtime_later > mtime_first);  // rank 0 beats while it trains
  REQUIRE(stopped);
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 1 of 1 after rank 1 (host localhost, local rank 1) has been stopped "
                                    "(process state T: SIGSTOP or SIGTSTP) for "));
  CHECK_THAT(r.err, Catch::Contains("dsrun: the job finished after 1 restart(s)"));
  CHECK(by_iteration(csv_rows(job.csv())).size() == static_cast<size_t>(iters));
  CHECK(job_leftovers(job.token, 5).empty());
}

TEST_CASE("restart: the exit code is the last attempt's; flags and a missing checkpoint are one-line errors",
          "[restart]") {
  Env env = {{"DS_JOB_TOKEN", new_token()}};
  auto r = run_cmd({dsrun_bin(), "--include", "localhost:0,1", "--max_restarts", "2", probe_bin(), "exit", "7", "1"},
                   env, 60);
  INFO(r.err);
  CHECK(r.code == 7);
  CHECK_THAT(r.err, Catch::Contains("note: with --max_restarts 2 a restart runs"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 1 of 2 after exit code 7: hosts localhost (1 node(s)); layout: "
                                    "world 2; the program starts again (no checkpoint directory known to dsrun)"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 2 of 2 after exit code 7"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: attempt 3 ended with exit code 7; no restarts left (--max_restarts 2); "
                                    "exit code 7"));
  CHECK(job_leftovers(env[0].second, 5).empty());

  // dstrain without --load could only start over: refused before anything starts.
  r = run_cmd({dsrun_bin(), "--max_restarts", "1", dstrain_bin(), "--train-iters", "3"}, env, 30);
  CHECK(r.code == 1);
  CHECK(r.err == "dsrun: error: --max_restarts 1: dstrain has no checkpoint to resume from after a restart; give it "
                 "--load DIR --save DIR --save-interval N (the same DIR)\n");
  r = run_cmd({dsrun_bin(), "--elastic_training", "--max_restarts", "1", probe_bin(), "exit", "0"}, env, 30);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("dsrun: error: --elastic_training needs the built-in ssh launcher"));

  // Ctrl-C is never restarted.
  r = run_cmd({dsrun_bin(), "--include", "localhost:0,1", "--max_restarts", "3", probe_bin(), "hang"}, env, 30,
              [&](pid_t pid) {
                // Its two ranks, with the first attempt's token.
                REQUIRE(wait_for_token_procs(ds::launch::attempt_token(env[0].second, 0), 2, 15));
                usleep(200000);
                kill(pid, SIGINT);
              });
  CHECK(r.code == 130);
  CHECK_THAT(r.err, !Catch::Contains("restart 1"));
  CHECK(job_leftovers(env[0].second, 5).empty());
}

TEST_CASE("restart: each attempt's ranks share a fresh job token and never see the job's secret", "[restart]") {
  TempDir dir;
  // Each rank appends its DS_JOB_TOKEN to tokens.<RANK>; the first attempt
  // fails once both ranks have written theirs, the second succeeds.
  const std::string script = dir.path() + "/record_token.sh";
  write_file(script,
             "#!/bin/sh\n"
             "d=\"$1\"\n"
             "echo \"$DS_JOB_TOKEN\" >> \"$d/tokens.$RANK\"\n"
             "[ \"$(wc -l < \"$d/tokens.$RANK\")\" -ge 2 ] && exit 0\n"
             "while [ \"$(cat \"$d\"/tokens.* | wc -l)\" -lt \"$WORLD_SIZE\" ]; do sleep 0.05; done\n"
             "exit 3\n");
  REQUIRE(chmod(script.c_str(), 0755) == 0);
  const std::string secret = new_token();
  auto r = run_cmd({dsrun_bin(), "--include", "localhost:0,1", "--no_local_rank", "--max_restarts", "2",
                    "--master_port", std::to_string(free_port()), script, dir.path()},
                   {{"DS_JOB_TOKEN", secret}}, 60);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("dsrun: the job finished after 1 restart(s)"));
  const std::string t0 = read_file(dir.path() + "/tokens.0"), t1 = read_file(dir.path() + "/tokens.1");
  const std::string want = ds::launch::attempt_token(secret, 0) + "\n" + ds::launch::attempt_token(secret, 1) + "\n";
  CHECK(t0 == want);  // attempt 0's token, then attempt 1's: the same on both ranks
  CHECK(t1 == want);
  CHECK(t0.find(secret) == std::string::npos);
  CHECK(job_leftovers(secret, 5).empty());
}

namespace {

// Three namespace hosts with one slot each, an sshd in each, and the head in
// the first (as test_launcher_transports.cpp).
struct ElasticLab {
  NetnsLab lab{3};
  TempDir dir;
  std::vector<std::unique_ptr<Sshd>> sshds;
  std::string hostfile, error;
  ElasticLab() {
    if (!lab.ok()) {
      error = lab.error();
      return;
    }
    std::string hosts;
    for (int i = 0; i < 3; ++i) {
      sshds.push_back(std::make_unique<Sshd>(dir.path(), std::vector<std::string>{lab.addr(i)}, 2222, lab.ns(i)));
      if (!sshds.back()->ok()) {
        error = "sshd in namespace " + lab.ns(i) + ": " + sshds.back()->error();
        return;
      }
      hosts += lab.addr(i) + " slots=1\n";
    }
    hostfile = dir.path() + "/hosts";
    write_file(hostfile, hosts);
  }
  std::vector<std::string> head(const std::vector<std::string>& flags) const {
    std::vector<std::string> argv = {"ip", "netns", "exec", lab.ns(0), dsrun_bin(), "--hostfile", hostfile,
                                     "--ssh_port", "2222", "--ssh_identity", sshds[0]->user_key(),
                                     "--ssh_known_hosts", sshds[0]->known_hosts(),
                                     "--teardown_grace", "1", "--master_port", std::to_string(free_port())};
    return cat(argv, flags);
  }
};

// Global batch 12 from micro batches {1, 2} under 16 on at most 4 GPUs: DP 3
// runs micro 2 x accumulation 2, DP 2 micro 2 x accumulation 3.
const char* kElastic =
    "\"elasticity\": {\"enabled\": true, \"max_train_batch_size\": 16, \"micro_batch_sizes\": [1, 2], "
    "\"max_gpus\": 4}";

// The iteration the last restart resumed from, from dsrun's restart line.
int last_resume(const std::string& err) {
  std::regex re("resuming from iteration ([0-9]+)");
  int it = -1;
  for (auto m = std::sregex_iterator(err.begin(), err.end(), re); m != std::sregex_iterator(); ++m)
    it = std::stoi((*m)[1]);
  return it;
}

// A run that lost host 3 and resumed on two hosts at iteration k has the
// curve of an uninterrupted three-rank run up to k (every row written by a
// three-host attempt, repeats included) and after k that of a two-rank run
// resumed from that run's checkpoint k.
void check_elastic_curve(const TrainJob& job, const std::string& err) {
  const int k = last_resume(err);
  INFO(err);
  REQUIRE(k > 0);
  const std::string last_restart = err.substr(err.rfind("dsrun: restart "));
  REQUIRE_THAT(last_restart, Catch::Contains("hosts 10.200.0.1, 10.200.0.2 (2 node(s))"));
  Env env = {{"OMP_NUM_THREADS", "1"}};
  TrainJob three(job.iters, kElastic);
  env.push_back({"DS_JOB_TOKEN", three.token});
  auto r = run_cmd(cat({dsrun_bin(), "--include", "localhost:0,1,2", "--master_port", std::to_string(free_port())},
                       three.dstrain_args()),
                   env, 120);
  INFO(r.err);
  REQUIRE(r.code == 0);
  TrainJob two(job.iters, kElastic);
  const std::string step = "global_step" + std::to_string(k);
  fs::create_directories(two.ckpt());
  fs::copy(three.ckpt() + "/" + step, two.ckpt() + "/" + step, fs::copy_options::recursive);
  write_file(two.ckpt() + "/latest", step + "\n");
  env.back().second = two.token;
  r = run_cmd(cat({dsrun_bin(), "--include", "localhost:0,1", "--master_port", std::to_string(free_port())},
                  two.dstrain_args()),
              env, 120);
  REQUIRE(r.code == 0);
  const auto ref3 = by_iteration(csv_rows(three.csv())), ref2 = by_iteration(csv_rows(two.csv()));
  REQUIRE(ref3.size() == static_cast<size_t>(job.iters));
  REQUIRE(ref2.size() == static_cast<size_t>(job.iters - k));
  // The last attempt's rows follow the last drop of the iteration number.
  const std::vector<Row> rows = csv_rows(job.csv());
  size_t last_start = 0;
  for (size_t i = 1; i < rows.size(); ++i)
    if (rows[i].iteration <= rows[i - 1].iteration) last_start = i;
  std::vector<Row> before, after;
  for (size_t i = 0; i < rows.size(); ++i) (i >= last_start && rows[i].iteration > k ? after : before).push_back(rows[i]);
  check_rows_match(before, ref3, "three-host attempts");
  check_rows_match(after, ref2, "two-host attempt");
  CHECK(after.size() == static_cast<size_t>(job.iters - k));
}

// The final curve of an elastic run (the last value written for each
// iteration) against a chain of uninterrupted runs: the first layout from
// scratch, then, at every restart that changed the world size, a run at the
// new size resumed from the previous reference's checkpoint at the logged
// resume iteration. An iteration's value comes from the last attempt that
// resumed before it, and so from the reference in effect for that attempt.
void check_curve_chain(const TrainJob& job, const std::string& err, int first_world) {
  std::vector<std::pair<int, int>> attempts = {{first_world, 0}};  // world, resumed iteration
  std::regex re("dsrun: restart [0-9]+ of [0-9]+ after .*; layout: world ([0-9]+)[^\n]*resuming from iteration "
                "([0-9]+)");
  for (auto m = std::sregex_iterator(err.begin(), err.end(), re); m != std::sregex_iterator(); ++m)
    attempts.push_back({std::stoi((*m)[1]), std::stoi((*m)[2])});
  std::vector<std::unique_ptr<TrainJob>> refs;
  std::vector<size_t> ref_of(attempts.size());
  for (size_t a = 0; a < attempts.size(); ++a) {
    if (a > 0 && attempts[a].first == attempts[a - 1].first) {
      ref_of[a] = ref_of[a - 1];
      continue;
    }
    auto ref = std::make_unique<TrainJob>(job.iters, kElastic);
    if (a > 0) {
      const std::string step = "global_step" + std::to_string(attempts[a].second);
      fs::create_directories(ref->ckpt());
      fs::copy(refs.back()->ckpt() + "/" + step, ref->ckpt() + "/" + step, fs::copy_options::recursive);
      write_file(ref->ckpt() + "/latest", step + "\n");
    }
    std::string slots = "localhost:0";
    for (int i = 1; i < attempts[a].first; ++i) {
      slots += ',';
      slots += std::to_string(i);
    }
    auto r = run_cmd(cat({dsrun_bin(), "--include", slots, "--master_port", std::to_string(free_port())},
                         ref->dstrain_args()),
                     {{"DS_JOB_TOKEN", ref->token}, {"OMP_NUM_THREADS", "1"}}, 120);
    INFO(r.err);
    REQUIRE(r.code == 0);
    refs.push_back(std::move(ref));
    ref_of[a] = refs.size() - 1;
  }
  const auto final_rows = by_iteration(csv_rows(job.csv()));
  REQUIRE(final_rows.size() == static_cast<size_t>(job.iters));
  for (const auto& [it, row] : final_rows) {
    size_t a = 0;
    for (size_t k = 0; k < attempts.size(); ++k)
      if (attempts[k].second < it) a = k;
    const auto ref = by_iteration(csv_rows(refs[ref_of[a]]->csv()));
    INFO("iteration " << it << " written by attempt " << a + 1 << " (world " << attempts[a].first << ")");
    REQUIRE(ref.count(it));
    CHECK(row.loss == ref.at(it).loss);
    CHECK(row.grad_norm == ref.at(it).grad_norm);
  }
}

}  // namespace

TEST_CASE("elastic: a host whose ranks keep dying is dropped; the job finishes on two hosts", "[netns]") {
  if (getuid() != 0) DS_SKIP("network namespace test needs root");
  REQUIRE_DATA();
  ElasticLab lab;
  if (!lab.error.empty()) DS_SKIP(lab.error);
  TrainJob job(24, kElastic);
  int kills = 0;
  auto killer = [&](pid_t) {
    std::vector<pid_t> killed;
    for (size_t at : {4, 9}) {  // rows written so far: one kill per three-host attempt
      if (!wait_rows(job.csv(), at, 90)) return;
      // The rank of this attempt: under load the rows can run ahead of the
      // restart (the killed attempt wrote some), so wait until the new rank
      // is the only one on the third host.
      pid_t target = 0;
      for (double t = 0; t < 60 && target == 0; t += 0.02) {
        std::vector<pid_t> pids = ranks_with(job.token, "CROSS_RANK", "2");
        std::erase_if(pids, [&](pid_t p) { return std::find(killed.begin(), killed.end(), p) != killed.end(); });
        if (pids.size() == 1) target = pids[0];
        else usleep(20000);
      }
      if (target == 0 || kill(target, SIGKILL) != 0) return;
      killed.push_back(target);
      ++kills;
    }
  };
  auto r = run_cmd(lab.head(cat({"--elastic_training", "--max_restarts", "3"}, job.dstrain_args())), job.env(),
                   240, killer);
  INFO(r.err);
  INFO(r.out.substr(r.out.size() > 4000 ? r.out.size() - 4000 : 0));
  REQUIRE(r.code == 0);
  REQUIRE(kills == 2);
  CHECK_THAT(r.err, Catch::Contains("dsrun: elastic: starting on 3 host(s) (10.200.0.1, 10.200.0.2, 10.200.0.3); "
                                    "layout: world 3 = DP 3, global batch 12 = micro batch 2 x gradient "
                                    "accumulation 2 x DP 3"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 1 of 3 after node 10.200.0.3 (node rank 2) failed with exit "
                                    "code 137: hosts 10.200.0.1, 10.200.0.2, 10.200.0.3 (3 node(s))"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: elastic: dropping host 10.200.0.3 (2 failed attempts in a row, the last: "
                                    "node 10.200.0.3 (node rank 2) failed with exit code 137)"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 2 of 3 after node 10.200.0.3 (node rank 2) failed with exit "
                                    "code 137: hosts 10.200.0.1, 10.200.0.2 (2 node(s)); layout: world 2 = DP 2, "
                                    "global batch 12 = micro batch 2 x gradient accumulation 3 x DP 2; resuming from "
                                    "iteration "));
  // dstrain took its batch from the elasticity section at both sizes.
  CHECK_THAT(r.out + r.err, Catch::Contains("batch: global 12 = micro 2 x grad accum 2 x data parallel 3"));
  CHECK_THAT(r.out + r.err, Catch::Contains("batch: global 12 = micro 2 x grad accum 3 x data parallel 2"));
  check_elastic_curve(job, r.err);
  CHECK(job_leftovers(job.token, 10).empty());
}

TEST_CASE("elastic: a host whose link is cut is dropped after the heartbeat timeout and taken back later",
          "[netns]") {
  if (getuid() != 0) DS_SKIP("network namespace test needs root");
  REQUIRE_DATA();
  ElasticLab lab;
  if (!lab.error.empty()) DS_SKIP(lab.error);
  TrainJob job(24, kElastic);
  bool cut = false, restored = false, killed = false;
  auto chaos = [&](pid_t) {
    if (!wait_rows(job.csv(), 5, 90)) return;
    cut = sh("ip -n " + lab.lab.ns(2) + " link set eth0 down") == 0;
    // Once the two-host attempt trains, the link comes back and a rank of the
    // second host dies: the next attempt takes the third host back.
    if (!wait_rows(job.csv(), 10, 90)) return;
    restored = sh("ip -n " + lab.lab.ns(2) + " link set eth0 up") == 0;
    std::vector<pid_t> pids = ranks_with(job.token, "CROSS_RANK", "1");
    killed = pids.size() == 1 && kill(pids[0], SIGKILL) == 0;
  };
  auto r = run_cmd(lab.head(cat({"--elastic_training", "--max_restarts", "2", "--heartbeat_timeout", "4"},
                                job.dstrain_args())),
                   job.env(), 240, chaos);
  INFO(r.err);
  REQUIRE(cut);
  REQUIRE(restored);
  REQUIRE(killed);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("dsrun: node 10.200.0.3 (node rank 2) sent nothing for 4 s (lost heartbeat); "
                                    "stopping all nodes"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: elastic: dropping host 10.200.0.3 (node 10.200.0.3 (node rank 2) sent "
                                    "nothing for 4 s (lost heartbeat))"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 1 of 2 after node 10.200.0.3 (node rank 2) sent nothing for 4 s "
                                    "(lost heartbeat): hosts 10.200.0.1, 10.200.0.2 (2 node(s)); layout: world 2"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: elastic: host 10.200.0.3 answers again and is taken back"));
  CHECK_THAT(r.err, Catch::Contains("dsrun: restart 2 of 2 after node 10.200.0.2 (node rank 1) failed with exit "
                                    "code 137: hosts 10.200.0.1, 10.200.0.2, 10.200.0.3 (3 node(s)); layout: world 3"));
  check_curve_chain(job, r.err, 3);
  CHECK(job_leftovers(job.token, 30).empty());
}
