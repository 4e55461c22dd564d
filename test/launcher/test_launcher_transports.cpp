// Multi-host launches on network namespaces (each namespace is a "host" with
// its own sshd and address on a private bridge): ranks on different hosts meet
// at MASTER_ADDR:MASTER_PORT through a real TCP barrier, with the master
// address discovered by `hostname -I` like DeepSpeed. Also mpirun (OpenMPI).
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "test/launcher/test_util.h"
#include "test/skip.h"

using namespace ds::launch::test;

namespace {

}  // namespace

TEST_CASE("netns: three hosts rendezvous at the discovered master address", "[launcher]") {
  if (getuid() != 0) DS_SKIP("network namespace test needs root");
  NetnsLab lab(3);
  if (!lab.ok()) DS_SKIP(lab.error());
  TempDir dir;
  const int port = 2222;
  std::vector<std::unique_ptr<Sshd>> sshds;
  std::string hosts;
  for (int i = 0; i < 3; ++i) {
    sshds.push_back(std::make_unique<Sshd>(dir.path(), std::vector<std::string>{lab.addr(i)}, port, lab.ns(i)));
    if (!sshds.back()->ok()) DS_SKIP("sshd in namespace " << lab.ns(i) << ": " << sshds.back()->error());
    hosts += lab.addr(i) + " slots=2\n";
  }
  std::string hostfile = dir.path() + "/hosts";
  write_file(hostfile, hosts);
  std::vector<std::string> head = {"ip", "netns", "exec", lab.ns(0), dsrun_bin(), "--hostfile", hostfile,
                                   "--ssh_port", std::to_string(port), "--ssh_identity", sshds[0]->user_key(),
                                   "--ssh_known_hosts", sshds[0]->known_hosts(), "--master_port", "29611"};
  std::string token = new_token();
  std::vector<std::string> argv = head;
  argv.insert(argv.end(), {probe_bin(), "barrier"});
  auto r = run_cmd(argv, {{"DS_JOB_TOKEN", token}}, 60);
  INFO(r.err);
  REQUIRE(r.code == 0);
  for (int rank = 0; rank < 6; ++rank)
    CHECK_THAT(r.out, Catch::Contains("[rank " + std::to_string(rank) + "] barrier ok rank " +
                                      std::to_string(rank) + " world 6"));
  CHECK(kill_leftovers(token, 5).empty());

  token = new_token();
  argv = head;
  argv.insert(argv.end(), {"--master_addr", lab.addr(0), probe_bin(), "exit", "4", "5"});
  r = run_cmd(argv, {{"DS_JOB_TOKEN", token}}, 60);
  CHECK(r.code == 4);
  CHECK_THAT(r.err, Catch::Contains("node 10.200.0.3 (node rank 2) failed with exit code 4"));
  CHECK(kill_leftovers(token, 10).empty());
}

TEST_CASE("openmpi: mpirun starts one agent per node", "[launcher][mpirun]") {
  if (access("/usr/bin/mpirun", X_OK) != 0) DS_SKIP("mpirun (openmpi-bin) is not installed");
  TempDir dir;
  std::string hostfile = dir.path() + "/hosts";
  write_file(hostfile, "localhost slots=2\n");
  std::string token = new_token();
  std::vector<std::pair<std::string, std::string>> env = {
      {"DS_JOB_TOKEN", token}, {"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
      {"DS_TEST_EXPORT", "exported via -x"}};
  std::vector<std::string> head = {dsrun_bin(), "--hostfile", hostfile, "--launcher", "openmpi", "--force_multi",
                                   "--master_addr", "127.0.0.1", "--launcher_args", "--oversubscribe"};
  std::vector<std::string> argv = head;
  argv.insert(argv.end(), {probe_bin(), "env", dir.path()});
  auto r = run_cmd(argv, env, 60);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::string e = read_file(dir.path() + "/rank_" + std::to_string(rank) + ".env");
    CHECK(env_value(e, "RANK") == std::to_string(rank));
    CHECK(env_value(e, "WORLD_SIZE") == "2");
    CHECK(env_value(e, "CROSS_RANK") == "0");
    CHECK(env_value(e, "DS_TEST_EXPORT") == "exported via -x");
  }
  argv = head;
  argv.insert(argv.end(), {probe_bin(), "exit", "6", "1"});
  r = run_cmd(argv, env, 60);
  CHECK(r.code == 6);
  CHECK_THAT(r.err, Catch::Contains("rank 1 (host localhost, local rank 1) exit code 6"));
  CHECK(kill_leftovers(token, 5).empty());
}
