// Running the processes of an autotuning session: dstrain's memory estimate
// for a configuration, and one experiment, i.e. dsrun itself (the same
// launcher flags, without --autotuning) running PROGRAM on the experiment's
// config for a bounded number of steps, with its own logs, metrics file and
// timeout. A failing experiment is a result, never an exception.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::launch::autotune {

// Thrown when dsrun is interrupted (Ctrl-C, SIGTERM) during a session: it
// exits 128+signal, as any dsrun run.
struct Interrupted {
  int sig = 0;
};

using EnvPairs = std::vector<std::pair<std::string, std::string>>;

struct ProcessResult {
  int code = -1;          // exit code (128+signal for a signal death)
  bool timed_out = false;
  int interrupted = 0;    // a signal that reached dsrun while it waited (the session stops)
  double seconds = 0;
};

// Runs argv with extra variables, stdout/stderr into the given files, in its own
// process group; after timeout_s sends SIGTERM, then SIGKILL to the group and
// its descendants after `grace` seconds. SIGINT/SIGTERM/SIGHUP to dsrun are
// forwarded and reported in `interrupted`.
ProcessResult run_logged(const std::vector<std::string>& argv, const EnvPairs& env, const std::string& out_path,
                         const std::string& err_path, double timeout_s, double grace);

// The estimate JSON of PROGRAM --estimate-memory ARGS for a world of `world`
// ranks (written to json_path; logs beside it). Returns the JSON, or nullopt
// with *error set to PROGRAM's error line.
std::optional<nlohmann::json> run_estimate(const std::string& program, const std::vector<std::string>& args,
                                           int world, int local_size, const std::string& json_path,
                                           std::string* error);

// The last line of `path` holding "error" (or its last non-empty line).
std::string last_error_line(const std::string& path);
// Reads a whole file ("" when missing).
std::string slurp(const std::string& path);
// Writes a file through a temporary name; a failure is a UserError naming it.
void write_text(const std::string& path, const std::string& text);

}  // namespace ds::launch::autotune
