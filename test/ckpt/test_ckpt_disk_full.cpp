// A checkpoint save that runs out of disk space: the error names the path and
// says "no space left on device", and no partial .tmp-global_stepN directory
// (nor a `latest` pointing at one) is left. The full disk is a small tmpfs
// mounted in a private mount namespace of a child process (as root, or in a
// user namespace); where neither is allowed the test is skipped (exit 77).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "lib/ckpt/checkpoint.h"
#include "lib/core/error.h"
#include "test/model/tiny_model.h"
#include "test/skip.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int kCannotMount = 77;

bool write_text(const char* path, const std::string& s) {
  const int fd = ::open(path, O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  ::close(fd);
  return ok;
}

// A private mount namespace in which `dir` is a tmpfs of `kib` KiB.
bool mount_small_tmpfs(const fs::path& dir, int kib) {
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  if (::unshare(CLONE_NEWNS) != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
    write_text("/proc/self/setgroups", "deny");
    if (!write_text("/proc/self/uid_map", fmt::format("0 {} 1", uid)) ||
        !write_text("/proc/self/gid_map", fmt::format("0 {} 1", gid)))
      return false;
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  return ::mount("none", dir.c_str(), "tmpfs", 0, fmt::format("size={}k", kib).c_str()) == 0;
}

// Child: saves a tiny checkpoint into a `kib` KiB tmpfs. Exit 0: saved whole;
// 1: the expected clean failure; 2: anything else (printed); 77: no mount.
int save_on_small_disk(const fs::path& dir, int kib) {
  if (!mount_small_tmpfs(dir, kib)) return kCannotMount;
  const ModelConfig cfg = test::tiny_model(false);
  const ModelLayout layout = build_layout(cfg);
  Tensor p = Tensor::zeros({layout.total}, DType::F32), m = p.clone(), v = p.clone();
  CheckpointData d{&layout, p, m, v, 0, layout.total, 1, 0, 1};
  TrainState st;
  st.iteration = 3;
  try {
    save_checkpoint(dir.string(), st, d, nlohmann::json::object());
  } catch (const UserError& e) {
    const std::string msg = e.what();
    const bool named = msg.find("no space left on device") != std::string::npos &&
                       msg.find(dir.string()) != std::string::npos && msg.find('\n') == std::string::npos;
    const bool clean = !fs::exists(dir / ".tmp-global_step3") && !fs::exists(dir / "latest") &&
                       !fs::exists(dir / "global_step3");
    if (named && clean) return 1;
    std::fprintf(stderr, "size %dk: message '%s', leftovers: %s\n", kib, msg.c_str(), clean ? "none" : "yes");
    for (const auto& e2 : fs::recursive_directory_iterator(dir)) std::fprintf(stderr, "  %s\n", e2.path().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "size %dk: not a UserError: %s\n", kib, e.what());
    return 2;
  }
  return fs::exists(dir / "latest") && fs::exists(dir / "global_step3" / "state.json") ? 0 : 2;
}

}  // namespace

TEST_CASE("a full disk during a checkpoint save names the path and leaves no partial directory") {
  const fs::path dir = fs::temp_directory_path() / ("dstrain_diskfull_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int failed_cleanly = 0, saved = 0;
  for (int kib : {8, 24, 40, 56, 72, 88, 104, 4096}) {
    INFO("tmpfs of " << kib << " KiB");
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) ::_exit(save_on_small_disk(dir, kib));
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    const int code = WEXITSTATUS(status);
    if (code == kCannotMount) {
      fs::remove_all(dir);
      DS_SKIP("cannot mount a small tmpfs here (not root, no user namespaces)");
    }
    CHECK(code <= 1);
    failed_cleanly += code == 1;
    saved += code == 0;
  }
  CHECK(failed_cleanly >= 3);
  CHECK(saved >= 1);  // the 4 MiB disk holds it: the test saves a real checkpoint
  fs::remove_all(dir);
}
