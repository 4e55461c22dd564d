// launch_probe: the small rank program dsrun's tests launch. One binary, several
// behaviours chosen by MODE, so tests can check env, exit codes, crashes, hangs,
// teardown of grandchildren and a real TCP rendezvous at MASTER_ADDR:MASTER_PORT.
//   launch_probe [--local_rank=N] [--config FILE] MODE [ARGS...]
// (`--config FILE` is skipped so the probe can stand in for dstrain in the
// scripts/slurm/ sbatch scripts, which always pass it.)
//   env DIR            write DIR/rank_<RANK>.env (variables, argv, CPU affinity), print a line
//   exit CODE [RANK]   exit CODE (only rank RANK when given; the others hang)
//   crash RANK         rank RANK raises SIGSEGV, the others hang
//   hang               sleep until killed
//   hang_ignore_term   ignore SIGTERM, sleep until SIGKILL
//   grandchild CODE RANK  fork a hanging grandchild, then like `exit CODE RANK`
//   barrier            TCP barrier over MASTER_ADDR:MASTER_PORT, prints "barrier ok"
// Liveness (DS_HEARTBEAT_FILE; each prints "heartbeat PATH" first):
//   stop RANK [ONCE]   rank RANK stops itself (SIGSTOP), the others hang; with
//                      ONCE: only while the file ONCE does not exist (RANK
//                      creates it first), else every rank exits 0
//   beat_then_hang     touch the heartbeat file once (opt in), then hang
//   beat SECONDS       touch it every 0.2 s for SECONDS, exit 0
//   pause SECONDS      touch it, remove it (pause) for SECONDS, touch it, exit 0
//   sleep SECONDS      never touch it: sleep SECONDS, exit 0
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

[[noreturn]] void hang() {
  while (true) pause();
}

std::string status_field(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) {
      size_t b = line.find_first_not_of(" \t", key.size() + 1);
      return line.substr(b);
    }
  return "";
}

int write_env(const std::string& dir, const std::vector<std::string>& argv) {
  int rank = env_int("RANK");
  std::ofstream f(dir + "/rank_" + std::to_string(rank) + ".env");
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
                        "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "DS_JOB_TOKEN",
                        "OMP_NUM_THREADS", "DS_OUTPUT_RANK_PREFIXED", "DS_TEST_EXPORT", "NCCL_TEST_VAR", "FROM_ENV_FILE", "SLURMD_NODENAME",
                        "SLURM_STEP_ID"}) {
    const char* v = std::getenv(k);
    f << k << "=" << (v ? v : "<unset>") << "\n";
  }
  for (size_t i = 0; i < argv.size(); ++i) f << "argv" << i << "=" << argv[i] << "\n";
  f << "cpus=" << status_field("Cpus_allowed_list") << "\n";
  char cwd[4096];
  f << "cwd=" << (getcwd(cwd, sizeof(cwd)) ? cwd : "?") << "\n";
  f.close();
  std::printf("hello from rank %d\n", rank);
  std::fprintf(stderr, "stderr from rank %d\n", rank);
  return 0;
}

int connect_retry(const char* host, const char* port) {
  for (int attempt = 0; attempt < 400; ++attempt) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) == 0) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        freeaddrinfo(res);
        return fd;
      }
      close(fd);
      freeaddrinfo(res);
    }
    usleep(50000);
  }
  return -1;
}

int barrier() {
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  const char* host = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!host || !port || rank < 0 || world < 1) return 90;
  if (rank == 0) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
      hostent* h = gethostbyname(host);
      if (!h) return 91;
      std::memcpy(&a.sin_addr, h->h_addr, 4);
    }
    if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(ls, 256) != 0) return 92;
    std::vector<int> peers;
    for (int i = 1; i < world; ++i) {
      int fd = accept(ls, nullptr, nullptr);
      int r = -1;
      if (fd < 0 || read(fd, &r, sizeof(r)) != sizeof(r)) return 93;
      peers.push_back(fd);
    }
    for (int fd : peers) {
      if (write(fd, &world, sizeof(world)) != sizeof(world)) return 94;
      close(fd);
    }
    close(ls);
  } else {
    int fd = connect_retry(host, port);
    if (fd < 0) return 95;
    int w = 0;
    if (write(fd, &rank, sizeof(rank)) != sizeof(rank) || read(fd, &w, sizeof(w)) != sizeof(w) || w != world) return 96;
    close(fd);
  }
  std::printf("barrier ok rank %d world %d\n", rank, world);
  return 0;
}

// The heartbeat protocol as any program may speak it: touch (or create) the file.
void touch_heartbeat() {
  const char* p = std::getenv("DS_HEARTBEAT_FILE");
  if (!p || !*p) return;
  if (utimensat(AT_FDCWD, p, nullptr, 0) != 0) {
    const int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
}

int liveness(const std::string& mode, const std::vector<std::string>& args, int rank) {
  const char* hb = std::getenv("DS_HEARTBEAT_FILE");
  std::printf("heartbeat %s\n", hb ? hb : "<unset>");
  std::fflush(stdout);
  const double seconds = args.size() > 1 ? std::atof(args[1].c_str()) : 0;
  if (mode == "stop") {
    if (args.size() > 2 && access(args[2].c_str(), F_OK) == 0) return 0;
    if (std::atoi(args.at(1).c_str()) != rank) hang();
    if (args.size() > 2) close(open(args[2].c_str(), O_WRONLY | O_CREAT, 0644));
    raise(SIGSTOP);
    return 0;  // continued (the watch is off)
  }
  if (mode == "beat_then_hang") {
    touch_heartbeat();
    hang();
  }
  if (mode == "beat") {
    for (int i = 0; i < seconds * 5; ++i) {
      touch_heartbeat();
      usleep(200000);
    }
    return 0;
  }
  if (mode == "pause") {
    touch_heartbeat();
    if (hb) unlink(hb);
  }
  usleep(static_cast<useconds_t>(seconds * 1e6));  // pause, sleep
  if (mode == "pause") touch_heartbeat();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> all(argv, argv + argc);
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      ++i;
      continue;
    }
    if (a.rfind("--local_rank=", 0) != 0) args.push_back(a);
  }
  if (args.empty()) return 64;
  const std::string mode = args[0];
  int rank = env_int("RANK");
  auto arg_int = [&](size_t i, int dflt) { return args.size() > i ? std::atoi(args[i].c_str()) : dflt; };
  if (mode == "env") return write_env(args.at(1), all);
  if (mode == "hang") hang();
  if (mode == "family") {  // a child in the rank's group and a setsid grandchild, then hang
    if (fork() == 0) hang();
    if (fork() == 0) {
      setsid();
      if (fork() == 0) hang();
      _exit(0);  // the grandchild is orphaned at once
    }
    hang();
  }
  if (mode == "hang_ignore_term") {
    signal(SIGTERM, SIG_IGN);
    hang();
  }
  if (mode == "exit" || mode == "grandchild") {
    if (mode == "grandchild" && fork() == 0) hang();
    int target = arg_int(2, -1);
    if (target >= 0 && target != rank) hang();
    usleep(100000);  // let the siblings start, so teardown has something to do
    return arg_int(1, 0);
  }
  if (mode == "crash") {
    if (arg_int(1, 0) != rank) hang();
    usleep(100000);
    raise(SIGSEGV);
  }
  if (mode == "barrier") return barrier();
  for (const char* m : {"stop", "beat_then_hang", "beat", "pause", "sleep"})
    if (mode == m) return liveness(mode, args, rank);
  return 64;
}
