// Test helpers: command runner, /proc token scan, temp dirs, real sshd, namespace lab.
#include "test/launcher/test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace ds::launch::test {
namespace {

double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string read_proc(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Orphans of a killed dsrun re-parent to this process and are reaped here,
// instead of lingering as zombies under an init that may not reap.
struct BecomeSubreaper {
  BecomeSubreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }
} g_subreaper;

void reap_zombie_children() {
  pid_t self = getpid();
  DIR* d = opendir("/proc");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 1) continue;
    std::string stat = read_proc("/proc/" + std::string(e->d_name) + "/stat");
    size_t rp = stat.rfind(')');
    char state = 0;
    long ppid = 0;
    if (rp == std::string::npos || sscanf(stat.c_str() + rp + 1, " %c %ld", &state, &ppid) != 2) continue;
    int st;
    if (ppid == self && state == 'Z') waitpid(static_cast<pid_t>(pid), &st, WNOHANG);
  }
  closedir(d);
}

}  // namespace

std::string binary_dir() {
  const char* b = std::getenv("DS_BINARY_DIR");
  return b ? b : ".";
}
std::string dsrun_bin() { return binary_dir() + "/apps/dsrun/dsrun"; }
std::string probe_bin() { return binary_dir() + "/test/launcher/launch_probe"; }

RunResult run_cmd(const std::vector<std::string>& argv,
                  const std::vector<std::pair<std::string, std::string>>& env, double timeout_s,
                  std::function<void(pid_t)> during) {
  int out_p[2], err_p[2];
  if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) return {};
  double start = now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dup2(out_p[1], 1);
    dup2(err_p[1], 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  close(out_p[1]);
  close(err_p[1]);
  RunResult r;
  std::atomic<double> give_up{1e300};  // set once the command has exited
  std::thread reader([&] {
    pollfd fds[2] = {{out_p[0], POLLIN, 0}, {err_p[0], POLLIN, 0}};
    int open_n = 2;
    char buf[8192];
    while (open_n > 0 && now() < give_up.load()) {
      if (poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!fds[i].revents) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          fds[i].fd = -1;
          --open_n;
        } else {
          (i == 0 ? r.out : r.err).append(buf, n);
        }
      }
    }
  });
  if (during) during(pid);
  int st = 0;
  while (true) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    if (now() - start > timeout_s) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
    }
    usleep(2000);
  }
  r.seconds = now() - start;
  give_up = now() + 3;  // leftover processes may hold the pipes open: stop reading then
  reader.join();
  reap_zombie_children();
  close(out_p[0]);
  close(err_p[0]);
  r.code = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  return r;
}

std::vector<pid_t> pids_with_token(const std::string& token) {
  reap_zombie_children();
  std::vector<pid_t> out;
  pid_t self = getpid();
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 1 || pid == self) continue;
    std::string base = "/proc/" + std::string(e->d_name);
    std::string stat = read_proc(base + "/stat");
    size_t rp = stat.rfind(')');
    if (rp != std::string::npos && rp + 2 < stat.size() && stat[rp + 2] == 'Z') continue;  // zombie: already dead
    if (read_proc(base + "/environ").find(token) != std::string::npos ||
        read_proc(base + "/cmdline").find(token) != std::string::npos)
      out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

std::vector<pid_t> kill_leftovers(const std::string& token, double wait_s) {
  std::vector<pid_t> left = pids_with_token(token);
  for (double t = 0; !left.empty() && t < wait_s; t += 0.1) {
    usleep(100000);
    left = pids_with_token(token);
  }
  for (pid_t p : left) kill(p, SIGKILL);
  return left;
}

pid_t parent_of(pid_t pid) {
  const std::string stat = read_proc("/proc/" + std::to_string(pid) + "/stat");
  const size_t rp = stat.rfind(')');
  if (rp == std::string::npos) return 0;
  char state = 0;
  int ppid = 0;
  return std::sscanf(stat.c_str() + rp + 1, " %c %d", &state, &ppid) == 2 ? ppid : 0;
}

std::vector<pid_t> pids_with_in_cmdline(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 1 || pid == getpid()) continue;
    if (read_proc("/proc/" + std::string(e->d_name) + "/cmdline").find(needle) != std::string::npos)
      out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

bool wait_for_token_procs(const std::string& token, size_t n, double timeout_s) {
  double until = now() + timeout_s;
  while (now() < until) {
    if (pids_with_token(token).size() >= n) return true;
    usleep(20000);
  }
  return false;
}

std::string new_token() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "dstest%08x%04x", rd(), rd() & 0xffff);
  return buf;
}

std::string read_file(const std::string& path) { return read_proc(path); }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

std::string env_value(const std::string& env_text, const std::string& key) {
  std::istringstream in(env_text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return "<missing>";
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/dsrun_test_XXXXXX";
  path_ = mkdtemp(tmpl);
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

int sh(const std::string& cmd) {
  int st = std::system((cmd + " >/tmp/dsrun_test_sh.log 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

std::string prepare_ssh_keys(const std::string& dir) {
  if (access((dir + "/user_key").c_str(), R_OK) == 0) return "";
  if (sh("ssh-keygen -q -t ed25519 -N '' -f " + dir + "/user_key") != 0) return "ssh-keygen failed";
  if (sh("cp " + dir + "/user_key.pub " + dir + "/authorized_keys") != 0) return "cp failed";
  return "";
}

Sshd::Sshd(const std::string& dir, const std::vector<std::string>& addrs, int port, const std::string& netns)
    : port_(port) {
  if (access("/usr/sbin/sshd", X_OK) != 0) {
    error_ = "/usr/sbin/sshd is not installed (openssh-server)";
    return;
  }
  if (getuid() != 0) {
    error_ = "sshd tests need root (sshd must switch users)";
    return;
  }
  if (std::string e = prepare_ssh_keys(dir); !e.empty()) {
    error_ = e;
    return;
  }
  std::string tag = netns.empty() ? std::to_string(port) : netns;
  std::string hostkey = dir + "/host_key_" + tag;
  if (sh("ssh-keygen -q -t ed25519 -N '' -f " + hostkey) != 0) {
    error_ = "ssh-keygen (host key) failed";
    return;
  }
  mkdir("/run/sshd", 0755);
  user_key_ = dir + "/user_key";
  known_hosts_ = dir + "/known_hosts";
  std::string pub = read_file(hostkey + ".pub");
  pub = pub.substr(0, pub.find(' ', pub.find(' ') + 1));  // "type base64"
  std::ofstream kh(known_hosts_, std::ios::app);
  for (const auto& a : addrs) kh << "[" << a << "]:" << port << " " << pub << "\n";
  kh.close();
  std::string cfg = dir + "/sshd_config_" + tag;
  std::ostringstream c;
  c << "Port " << port << "\n";
  for (const auto& a : addrs) c << "ListenAddress " << a << "\n";
  c << "HostKey " << hostkey << "\nPidFile none\nStrictModes no\nPermitRootLogin yes\n"
    << "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    << "UsePAM no\nAuthorizedKeysFile " << dir << "/authorized_keys\nMaxStartups 200\nMaxSessions 200\n"
    << "LogLevel ERROR\nAcceptEnv none\n";
  write_file(cfg, c.str());
  std::vector<std::string> argv;
  if (!netns.empty()) argv = {"ip", "netns", "exec", netns};
  for (const char* w : {"/usr/sbin/sshd", "-D", "-e", "-f"}) argv.push_back(w);
  argv.push_back(cfg);
  pid_ = fork();
  if (pid_ == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  // Ready when the port accepts connections (checked from inside the namespace when needed).
  std::string probe = (netns.empty() ? "" : "ip netns exec " + netns + " ") +
                      "bash -c 'exec 3<>/dev/tcp/" + addrs[0] + "/" + std::to_string(port) + "'";
  for (int i = 0; i < 200; ++i) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "sshd exited at start (see stderr)";
      return;
    }
    if (sh(probe) == 0) return;
    usleep(25000);
  }
  error_ = "sshd did not start listening";
}

Sshd::~Sshd() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) return;
    usleep(20000);
  }
  kill(pid_, SIGKILL);
  int st;
  waitpid(pid_, &st, 0);
}

NetnsLab::NetnsLab(int n) : n_(n) {
  if (getuid() != 0) {
    error_ = "network namespaces need root";
    return;
  }
  std::random_device rd;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "dsl%05x", rd() & 0xfffff);
  prefix_ = buf;
  std::string sw = prefix_ + "sw";
  if (sh("ip netns add " + sw) != 0) {
    error_ = "cannot create a network namespace (ip netns add failed: no CAP_SYS_ADMIN?)";
    return;
  }
  bool good = sh("ip -n " + sw + " link add br0 type bridge && ip -n " + sw + " link set br0 up") == 0;
  for (int i = 0; i < n && good; ++i) {
    std::string h = ns(i), a = std::to_string(i);
    good = sh("ip netns add " + h) == 0 &&
           sh("ip link add vh" + a + prefix_ + " netns " + h + " type veth peer name vb" + a + " netns " + sw) == 0 &&
           sh("ip -n " + h + " link set vh" + a + prefix_ + " name eth0") == 0 &&
           sh("ip -n " + h + " addr add " + addr(i) + "/24 dev eth0") == 0 &&
           sh("ip -n " + h + " link set eth0 up && ip -n " + h + " link set lo up") == 0 &&
           sh("ip -n " + sw + " link set vb" + a + " master br0 && ip -n " + sw + " link set vb" + a + " up") == 0;
  }
  if (!good) error_ = "setting up veth/bridge in namespaces failed (see /tmp/dsrun_test_sh.log)";
  ok_ = good;
}

std::string NetnsLab::ns(int i) const { return prefix_ + "h" + std::to_string(i); }

NetnsLab::~NetnsLab() {
  if (prefix_.empty()) return;
  for (int i = 0; i < n_; ++i) sh("ip netns del " + ns(i));
  sh("ip netns del " + prefix_ + "sw");
}

}  // namespace ds::launch::test
