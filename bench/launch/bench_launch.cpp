// bench_launch: wall time for dsrun to start and reap 64 local ranks of `true`,
// next to OpenMPI's `mpirun -n 64 true`, and for dsrun's ssh fan-out to several
// network-namespace hosts (root only). Prints a markdown table for docs/benchmarks.md.
//   bench_launch [REPEATS]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "test/launcher/test_util.h"

using namespace ds::launch::test;

namespace {

struct Stat {
  double median = 0, best = 0;
  int failures = 0;
  std::string note;
};

Stat measure(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
             int repeats, double timeout_s) {
  std::vector<double> t;
  Stat s;
  for (int i = 0; i < repeats; ++i) {
    RunResult r = run_cmd(argv, env, timeout_s);
    if (r.code != 0) {
      ++s.failures;
      s.note = r.seconds >= timeout_s ? "timed out after " + std::to_string(int(timeout_s)) + " s" :
                                        "exit " + std::to_string(r.code);
      if (r.seconds >= timeout_s) break;  // do not wait on a hang again
      continue;
    }
    t.push_back(r.seconds);
  }
  if (!t.empty()) {
    std::sort(t.begin(), t.end());
    s.median = t[t.size() / 2];
    s.best = t.front();
  }
  return s;
}

void row(const std::string& what, const Stat& s) {
  if (s.median > 0)
    std::printf("| %s | %.3f | %.3f | %s |\n", what.c_str(), s.median, s.best, s.note.c_str());
  else
    std::printf("| %s | - | - | %s |\n", what.c_str(), s.note.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = argc > 1 ? std::atoi(argv[1]) : 10;
  TempDir dir;
  std::string hostfile = dir.path() + "/hosts64";
  write_file(hostfile, "localhost slots=64\n");
  std::printf("| launch | median s | best s | note |\n|---|---|---|---|\n");
  row("dsrun, 64 local ranks of true", measure({dsrun_bin(), "--hostfile", hostfile, "--no_local_rank", "true"}, {}, repeats, 30));
  std::vector<std::pair<std::string, std::string>> root_ok = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                               {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
  if (access("/usr/bin/mpirun", X_OK) == 0) {
    for (int n : {16, 64}) {
      std::string what = "mpirun -n " + std::to_string(n) + " true (OpenMPI)";
      row(what, measure({"mpirun", "--oversubscribe", "-n", std::to_string(n), "true"}, root_ok, repeats, 30));
    }
    write_file(dir.path() + "/hosts16", "localhost slots=16\n");
    row("dsrun, 16 local ranks of true", measure({dsrun_bin(), "--hostfile", dir.path() + "/hosts16", "--no_local_rank", "true"}, {}, repeats, 30));
  }
  if (getuid() == 0) {
    const int hosts = 4;
    NetnsLab lab(hosts);
    if (!lab.ok()) {
      std::printf("| ssh fan-out | - | - | skipped: %s |\n", lab.error().c_str());
      return 0;
    }
    std::vector<std::unique_ptr<Sshd>> sshds;
    std::string hf;
    for (int i = 0; i < hosts; ++i) {
      sshds.push_back(std::make_unique<Sshd>(dir.path(), std::vector<std::string>{lab.addr(i)}, 2222, lab.ns(i)));
      if (!sshds.back()->ok()) {
        std::printf("| ssh fan-out | - | - | skipped: %s |\n", sshds.back()->error().c_str());
        return 0;
      }
      hf += lab.addr(i) + " slots=8\n";
    }
    write_file(dir.path() + "/hosts_ns", hf);
    std::vector<std::string> base = {"ip", "netns", "exec", lab.ns(0), dsrun_bin(), "--hostfile", dir.path() + "/hosts_ns",
                                     "--ssh_port", "2222", "--ssh_identity", sshds[0]->user_key(), "--ssh_known_hosts",
                                     sshds[0]->known_hosts(), "--master_addr", lab.addr(0), "--no_local_rank"};
    auto ssh = base;
    ssh.push_back("true");
    row("dsrun ssh (libssh) fan-out, 4 namespace hosts x 8 ranks", measure(ssh, {}, repeats, 60));
    auto pdsh = base;
    pdsh.insert(pdsh.end(), {"--launcher", "pdsh", "true"});
    std::string append = "-i " + sshds[0]->user_key() + " -o UserKnownHostsFile=" + sshds[0]->known_hosts();
    row("dsrun pdsh fan-out, 4 namespace hosts x 8 ranks", measure(pdsh, {{"PDSH_SSH_ARGS_APPEND", append}}, repeats, 60));
  }
  return 0;
}
