// Multi-process dstrain job runner and data fixture for the equivalence tests.
#include "test/dist/dist_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ds::test {
namespace fs = std::filesystem;

namespace {

std::string env_or_throw(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw std::runtime_error(std::string(name) + " is not set (run through ctest)");
  return v;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

const DistData& dist_data() {
  static DistData d = [] {
    DistData r;
    fs::path dir = fs::temp_directory_path() / ("dstrain_dist_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string bin = env_or_throw("DS_BINARY_DIR") + "/apps/dsprep/dsprep", s = dir.string();
    for (const std::string& c : {bin + " --generate-corpus " + s + "/corpus.txt --size-mb 0.3 --seed 5",
                                 bin + " --train-tokenizer --input " + s + "/corpus.txt --vocab-size 300 --output-dir " +
                                     s + "/tok",
                                 bin + " --input " + s + "/corpus.txt --output-prefix " + s + "/data/c --vocab-file " +
                                     s + "/tok/vocab.json --merge-file " + s + "/tok/merges.txt"})
      if (std::system((c + " > /dev/null").c_str()) != 0) throw std::runtime_error("failed: " + c);
    r.dir = s;
    r.data_prefix = s + "/data/c";
    r.vocab = s + "/tok/vocab.json";
    r.merges = s + "/tok/merges.txt";
    std::atexit([] { fs::remove_all(fs::temp_directory_path() / ("dstrain_dist_" + std::to_string(::getpid()))); });
    return r;
  }();
  return d;
}

std::string run_dstrain(const DstrainJob& job) {
  const std::string exe = env_or_throw("DS_BINARY_DIR") + "/apps/dstrain/dstrain";
  const int port = free_port();
  const std::string logdir = dist_data().dir + "/logs_" + std::to_string(port);
  fs::create_directories(logdir);
  std::vector<pid_t> pids;
  for (int r = 0; r < job.world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::string log = logdir + "/rank" + std::to_string(r) + ".log";
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(job.world).c_str(), 1);
      ::setenv("LOCAL_SIZE", std::to_string(job.world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("DS_JOB_TOKEN", "test-token", 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      std::vector<char*> argv{const_cast<char*>(exe.c_str())};
      for (const auto& a : job.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(job.timeout_s);
  std::vector<int> codes(job.world, -1);
  int left = job.world;
  while (left > 0) {
    for (int r = 0; r < job.world; ++r) {
      if (codes[r] != -1) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < job.world; ++r)
        if (codes[r] == -1) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          codes[r] = 137;
        }
      left = 0;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (job.rank0_output) *job.rank0_output = read_file(logdir + "/rank0.log");
  std::string report;
  bool ok = true;
  for (int r = 0; r < job.world; ++r) {
    if (codes[r] != 0) ok = false;
    report += "--- rank " + std::to_string(r) + " exit " + std::to_string(codes[r]) + "\n" +
              read_file(logdir + "/rank" + std::to_string(r) + ".log");
  }
  return ok ? std::string() : report;
}

std::vector<std::string> small_model_args(const SmallModel& m) {
  const DistData& d = dist_data();
  std::vector<std::string> a = {"--num-layers", std::to_string(m.layers), "--hidden-size", "32",
                                "--num-attention-heads", "4", "--seq-length", "32",
                                "--max-position-embeddings", "32", "--train-iters", std::to_string(m.iters),
                                "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
                                "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
                                "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
                                "--tensor-model-parallel-size", std::to_string(m.tp),
                                "--pipeline-model-parallel-size", std::to_string(m.pp),
                                "--data-path", d.data_prefix, "--vocab-file", d.vocab, "--merge-file", d.merges};
  if (m.llama) a.insert(a.end(), {"--model-family", "llama", "--ffn-hidden-size", "64"});
  return a;
}

std::string run_with_config(const std::string& name, int world, int micro, int zero_stage,
                            const std::vector<std::string>& args, std::vector<double>* losses,
                            std::string* rank0_log, const std::string& sections) {
  const DistData& d = dist_data();
  const std::string cfg = d.dir + "/" + name + ".json";
  {
    std::ofstream f(cfg);
    f << "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": " << micro;
    if (zero_stage >= 0)
      f << ", \"zero_optimization\": {\"stage\": " << zero_stage << ", \"reduce_bucket_size\": 5000, \"overlap_comm\": true}";
    f << ", \"csv_monitor\": {\"enabled\": true, \"output_path\": \"" << d.dir << "/csv\", \"job_name\": \""
      << name << "\"}" << (sections.empty() ? "" : ", ") << sections << "}";
  }
  std::vector<std::string> all = {"--config", cfg};
  all.insert(all.end(), args.begin(), args.end());
  DstrainJob job{world, all};
  job.rank0_output = rank0_log;
  std::string err = run_dstrain(job);
  if (err.empty() && losses) *losses = read_losses(d.dir + "/csv/" + name + "/train.csv");
  return err;
}

std::vector<double> read_losses(const std::string& csv_file) { return read_csv_column(csv_file, "loss"); }

std::vector<double> read_csv_column(const std::string& csv_file, const std::string& column) {
  std::ifstream f(csv_file);
  if (!f.good()) throw std::runtime_error("cannot read " + csv_file);
  std::string line, cell;
  std::getline(f, line);  // header: iteration,consumed_samples,lr,loss,grad_norm,...
  int at = -1;
  {
    std::stringstream ss(line);
    for (int i = 0; std::getline(ss, cell, ','); ++i)
      if (cell == column) at = i;
  }
  if (at < 0) throw std::runtime_error(csv_file + " has no column " + column);
  std::vector<double> out;
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    for (int i = 0; i <= at && std::getline(ss, cell, ','); ++i) {
    }
    out.push_back(std::stod(cell));
  }
  return out;
}

int run_tool(const std::string& name, const std::string& args, std::string* out) {
  const char* bin = std::getenv("DS_BINARY_DIR");
  if (!bin) throw std::runtime_error("DS_BINARY_DIR is not set (ctest sets it)");
  const std::string cmd = std::string(bin) + "/apps/" + name + "/" + name + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot start " + cmd);
  char buf[4096];
  out->clear();
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

}  // namespace ds::test
