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

// Losses (column "loss") of OUTPUT_PATH/JOB/train.csv, by iteration order.
std::vector<double> read_losses(const std::string& csv_file);

}  // namespace ds::test
