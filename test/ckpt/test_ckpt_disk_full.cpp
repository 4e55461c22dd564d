// A checkpoint save that runs out of disk space: the error names the path and
// says "No space left on device", and no partial .tmp-global_stepN directory
// (nor a `latest` pointing at one) is left. The full disk is a small tmpfs
// mounted in a private mount namespace of a child process (as root, or in a
// user namespace); where neither is allowed the test is skipped (exit 77).
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "lib/ckpt/checkpoint.h"
#include "lib/core/error.h"
#include "test/ckpt/tiny_checkpoint.h"
#include "test/skip.h"
#include "test/small_disk.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

// Child: saves a tiny checkpoint into the `kib` KiB tmpfs at `dir`. Exit 0:
// saved whole; 1: the expected clean failure; 2: anything else (printed).
int save_on_small_disk(const fs::path& dir, int kib) {
  const test::TinyCheckpoint ck;
  const CheckpointData d = ck.data(1);
  TrainState st;
  st.iteration = 3;
  try {
    save_checkpoint(dir.string(), st, d, nlohmann::json::object());
  } catch (const UserError& e) {
    const std::string msg = e.what();
    const bool named = msg.find("No space left on device") != std::string::npos &&
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
    const int code = test::run_on_small_disk(dir, kib, [&] { return save_on_small_disk(dir, kib); });
    if (code == test::kNoSmallDisk) {
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
