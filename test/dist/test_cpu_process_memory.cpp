// A CPU process of a CUDA build stays a CPU process: `dstrain --help` and a
// tiny CPU training step never map the CUDA libraries (libcudart, cuBLAS(Lt),
// cuDNN, NCCL, the driver) nor the CUDA backend module, which is loaded only
// for --device cuda (lib/core/cuda_module.h), and their peak resident set
// stays within tens of MB. Each program runs under ptrace and is stopped at
// its exit (PTRACE_O_TRACEEXIT), where /proc/PID/maps and VmHWM still
// describe the whole run. Also: --device cuda loads the module (on a machine
// without a GPU: one clear line that no device is visible), and a missing or
// broken module is one line naming it, never a crash. Skipped (77) in a
// build without CUDA, where none of this can differ.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "lib/core/cuda_module.h"
#include "test/dist/dist_util.h"
#include "test/skip.h"

using namespace ds::test;

namespace {

// Measured on a CUDA build (CPU machine, 2 cores): dstrain --help peaks at
// 13 MB (210 MB when the programs linked the CUDA libraries) and the tiny
// training run below at 15 MB (224 MB before). The bounds leave room for
// allocator and library growth but not for the CUDA libraries' ~200 MB.
constexpr int64_t kHelpBoundKb = 48 << 10;
constexpr int64_t kStepBoundKb = 64 << 10;

struct ExitSnapshot {
  int status = -1;       // waitpid status
  std::string maps;      // /proc/PID/maps at the exit stop
  int64_t vm_hwm_kb = -1;
  std::string output;    // stdout + stderr
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `argv` with `env` added, traced, and reads its maps and VmHWM when it
// stops at its exit (before its memory is released).
ExitSnapshot run_traced(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  const std::string out_path = dist_data().dir + "/traced_" + std::to_string(::getpid()) + ".log";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const std::string& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  ExitSnapshot snap;
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);  // the SIGTRAP after exec
  REQUIRE(WIFSTOPPED(st));
  REQUIRE(::ptrace(PTRACE_SETOPTIONS, pid, nullptr, PTRACE_O_TRACEEXIT | PTRACE_O_EXITKILL) == 0);
  ::ptrace(PTRACE_CONT, pid, nullptr, nullptr);
  for (;;) {
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    if (WIFEXITED(st) || WIFSIGNALED(st)) break;
    int sig = 0;
    if ((st >> 8) == (SIGTRAP | (PTRACE_EVENT_EXIT << 8))) {
      snap.maps = slurp("/proc/" + std::to_string(pid) + "/maps");
      std::smatch m;
      const std::string status = slurp("/proc/" + std::to_string(pid) + "/status");
      if (std::regex_search(status, m, std::regex(R"(VmHWM:\s+(\d+) kB)"))) snap.vm_hwm_kb = std::stoll(m[1].str());
    } else {
      sig = WSTOPSIG(st);  // a signal for the program: deliver it
    }
    ::ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(sig)));
  }
  snap.status = st;
  snap.output = slurp(out_path);
  std::remove(out_path.c_str());
  return snap;
}

// The CUDA libraries (and our own CUDA code) among the mapped files.
std::vector<std::string> cuda_mappings(const std::string& maps) {
  static const std::regex cuda_lib(R"((lib(cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|cuda|nvrtc|nvJitLink)\.so|libds_cuda)[^\s]*)");
  std::vector<std::string> out;
  for (std::sregex_iterator it(maps.begin(), maps.end(), cuda_lib), end; it != end; ++it)
    if (out.empty() || out.back() != it->str()) out.push_back(it->str());
  return out;
}

std::string dstrain() { return std::string(std::getenv("DS_BINARY_DIR")) + "/apps/dstrain/dstrain"; }

std::vector<std::string> tiny_step(const std::string& device) {
  SmallModel m;
  m.iters = 4;  // past its 3 warm-up iterations
  std::vector<std::string> a = {dstrain()};
  for (const std::string& s : small_model_args(m)) a.push_back(s);
  a.insert(a.end(), {"--micro-batch-size", "2", "--global-batch-size", "2", "--device", device});
  return a;
}

bool skip_without_cuda() {
  if (ds::cuda_module_built()) return false;
  ds::test::note_skip("a build without CUDA: its processes never had CUDA libraries to leave out");
  return true;
}

// The output's lines that are not empty.
std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("dstrain --help maps no CUDA library and peaks at tens of MB") {
  if (skip_without_cuda()) return;
  const ExitSnapshot s = run_traced({dstrain(), "--help"}, {});
  INFO(s.output);
  REQUIRE(WIFEXITED(s.status));
  REQUIRE(WEXITSTATUS(s.status) == 0);
  REQUIRE(!s.maps.empty());
  CHECK(s.maps.find("libds_core") != std::string::npos);  // the snapshot is of the program itself
  CHECK(cuda_mappings(s.maps).empty());
  std::printf("dstrain --help: VmHWM %lld kB (bound %lld kB)\n", (long long)s.vm_hwm_kb, (long long)kHelpBoundKb);
  CHECK(s.vm_hwm_kb > 0);
  CHECK(s.vm_hwm_kb <= kHelpBoundKb);
}

TEST_CASE("a tiny CPU training run maps no CUDA library and peaks at tens of MB") {
  if (skip_without_cuda()) return;
  const ExitSnapshot s = run_traced(tiny_step("cpu"), {"OMP_NUM_THREADS=1"});
  INFO(s.output);
  REQUIRE(WIFEXITED(s.status));
  REQUIRE(WEXITSTATUS(s.status) == 0);
  CHECK(s.output.find("iteration") != std::string::npos);
  CHECK(cuda_mappings(s.maps).empty());
  std::printf("tiny CPU step: VmHWM %lld kB (bound %lld kB)\n", (long long)s.vm_hwm_kb, (long long)kStepBoundKb);
  CHECK(s.vm_hwm_kb > 0);
  CHECK(s.vm_hwm_kb <= kStepBoundKb);
}

TEST_CASE("--device cuda loads the CUDA backend module") {
  if (skip_without_cuda()) return;
  const ExitSnapshot s = run_traced(tiny_step("cuda"), {"OMP_NUM_THREADS=1"});
  INFO(s.output);
  REQUIRE(WIFEXITED(s.status));
  const std::vector<std::string> mapped = cuda_mappings(s.maps);
  std::string all;
  for (const std::string& l : mapped) all += l + " ";
  INFO("CUDA mappings: " << all);
  CHECK(all.find("libds_cuda_backend.so") != std::string::npos);
  CHECK(all.find("libcudart") != std::string::npos);
  if (WEXITSTATUS(s.status) != 0) {
    // No GPU here: one line saying so (from the runtime or NCCL), no crash.
    CHECK(WEXITSTATUS(s.status) == 1);
    CHECK(lines(s.output).size() == 1);
    CHECK(s.output.find("CUDA") != std::string::npos);
    CHECK(s.output.find("cannot load the CUDA backend") == std::string::npos);
  }
}

TEST_CASE("a missing or broken CUDA backend module is one line naming it") {
  if (skip_without_cuda()) return;
  const std::string junk = dist_data().dir + "/not_a_module.so";
  std::ofstream(junk) << "not an ELF file\n";
  const std::string not_ours = std::string(std::getenv("DS_BINARY_DIR")) + "/lib/core/libds_core.so";
  const struct {
    std::string path, why;
  } cases[] = {{dist_data().dir + "/missing.so", "No such file"},
               {junk, "not_a_module.so"},
               {not_ours, "symbol ds_cuda_module_init missing"}};
  for (const auto& c : cases) {
    const ExitSnapshot s = run_traced(tiny_step("cuda"), {"OMP_NUM_THREADS=1", "DS_CUDA_BACKEND=" + c.path});
    INFO(c.path << ": " << s.output);
    REQUIRE(WIFEXITED(s.status));
    CHECK(WEXITSTATUS(s.status) == 1);
    const std::vector<std::string> l = lines(s.output);
    REQUIRE(l.size() == 1);
    CHECK(l[0].find("--device cuda: cannot load the CUDA backend " + c.path + ": ") != std::string::npos);
    CHECK(l[0].find(c.why) != std::string::npos);
    CHECK(cuda_mappings(s.maps).empty());
  }
}
