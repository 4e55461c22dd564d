// Test helpers for multi-process dstrain runs: a generated dataset, a job
// runner that starts WORLD dstrain processes with the launcher's rank
// environment on 127.0.0.1 (each dies with the test), and CSV loss readers.
#pragma once
#include <string>
#include <vector>

namespace ds::test {

// Corpus + tokenizer + dataset under a temp dir, made once per test binary.
struct DistData {
  std::string dir, data_prefix, vocab, merges;
};
const DistData& dist_data();

struct DstrainJob {
  int world = 1;
  std::vector<std::string> args;  // dstrain arguments after the binary
  double timeout_s = 240;
  std::string* rank0_output = nullptr;  // if set: receives rank 0's stdout + stderr
};
// Runs the job; returns "" on success, else every rank's exit code and output.
std::string run_dstrain(const DstrainJob& job);

// The small model the equivalence tests train (hidden 32, 4 heads, T 32, a
// 20-step-style LR schedule, log every step, hidden and attention dropout 0.1,
// Megatron's defaults, so every layout test checks the dropout masks too) on
// dist_data(); llama switches the family (FFN 64).
struct SmallModel {
  int layers = 2, tp = 1, pp = 1, iters = 20;
  bool llama = false;
};
std::vector<std::string> small_model_args(const SmallModel& m);

// Writes DIR/NAME.json (global batch 8, `micro` per rank, ZeRO `zero_stage`
// with small buckets and overlap_comm on, or no zero section when zero_stage < 0, CSV monitor
// under NAME) and runs `world` ranks with `--config` that file plus `args`.
// Returns "" on success, else every rank's output. On success `losses` (if
// set) gets rank 0's CSV losses; `rank0_log` (if set) gets rank 0's output.
// `sections`: more top-level keys of the config, as JSON text ("\"key\": {...}").
std::string run_with_config(const std::string& name, int world, int micro, int zero_stage,
                            const std::vector<std::string>& args, std::vector<double>* losses,
                            std::string* rank0_log, const std::string& sections = "");

// Runs one of the project's programs (DS_BINARY_DIR/apps/<name>/<name>) with
// `args` (shell words); returns its exit code, its stdout and stderr in *out.
int run_tool(const std::string& name, const std::string& args, std::string* out);

// Losses (column "loss") of OUTPUT_PATH/JOB/train.csv, by iteration order.
std::vector<double> read_losses(const std::string& csv_file);
// Column `column` (by its header name) of such a file.
std::vector<double> read_csv_column(const std::string& csv_file, const std::string& column);

}  // namespace ds::test
