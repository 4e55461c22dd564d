// What killed writers leave: NAME.tmp.<pid> files (write_file_atomic) and
// NAME.tmp-<pid> directories (export_hf). remove_stale_temporaries removes
// those of dead processes and never a live one's; a single-process save
// removes them before it writes, so a killed save's partial file is never
// committed into the next step. (dstrain, dsconvert --save and --export-hf
// end to end: test/gen/dsgen_check.py temporaries.)
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/file_io.h"
#include "test/ckpt/tiny_checkpoint.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

// The pid of a child that has exited and been reaped: no process has it.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "partial";
}

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("dstrain_stale_" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(dir); fs::create_directories(dir); }
  ~TempDir() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("remove_stale_temporaries removes dead writers' temporaries only", "[ckpt]") {
  TempDir t;
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  const fs::path d = t.dir;
  touch(d / ("latest.tmp." + dead));
  touch(d / (".tmp-global_step4") / ("model.safetensors.tmp." + dead));
  touch(d / ("hf.tmp-" + dead) / "model.safetensors");
  touch(d / ("latest.tmp." + live));
  touch(d / (".tmp-global_step4") / ("state.json.tmp." + live));
  touch(d / "notes.tmp.x1");
  touch(d / ".tmp-global_step4" / "model.safetensors");
  const auto removed = remove_stale_temporaries(d.string());
  CHECK(removed.size() == 3);
  CHECK(!fs::exists(d / ("latest.tmp." + dead)));
  CHECK(!fs::exists(d / ".tmp-global_step4" / ("model.safetensors.tmp." + dead)));
  CHECK(!fs::exists(d / ("hf.tmp-" + dead)));
  CHECK(fs::exists(d / ("latest.tmp." + live)));
  CHECK(fs::exists(d / ".tmp-global_step4" / ("state.json.tmp." + live)));
  CHECK(fs::exists(d / "notes.tmp.x1"));
  CHECK(fs::exists(d / ".tmp-global_step4" / "model.safetensors"));

  // With a stem: only STEM.tmp-<pid> / STEM.tmp.<pid> (an export's parent directory is not ours).
  touch(d / ("other.tmp-" + dead) / "x");
  touch(d / ("hf.tmp-" + dead) / "model.safetensors");
  CHECK(remove_stale_temporaries(d.string(), "hf").size() == 1);
  CHECK(!fs::exists(d / ("hf.tmp-" + dead)));
  CHECK(fs::exists(d / ("other.tmp-" + dead)));
}

TEST_CASE("a save never commits a killed save's partial file", "[ckpt]") {
  TempDir t;
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  const fs::path stale = t.dir / ".tmp-global_step3" / ("model.safetensors.tmp." + dead);
  touch(stale);
  touch(t.dir / ("latest.tmp." + dead));
  touch(t.dir / ("latest.tmp." + live));
  const test::TinyCheckpoint ck;
  CheckpointData d = ck.data(0);
  TrainState st;
  st.iteration = 3;
  save_checkpoint(t.dir.string(), st, d, nlohmann::json::object());
  const fs::path step = t.dir / "global_step3";
  REQUIRE(fs::is_directory(step));
  for (const auto& e : fs::directory_iterator(step))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  CHECK(!fs::exists(stale));
  CHECK(!fs::exists(t.dir / ("latest.tmp." + dead)));
  CHECK(fs::exists(t.dir / ("latest.tmp." + live)));
  TrainState back;
  CHECK(load_checkpoint(t.dir.string(), back, d));
  CHECK(back.iteration == 3);
}
