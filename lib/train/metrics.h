// Iteration and validation log lines (Megatron's format, plus the elapsed time
// and the ETA to train_iters as the last two fields) and the CSV monitor.
// FLOPs per token = 6 * N + 6 * L * C * T, with N the parameters that take part
// in matrix multiplies (all but learned position embeddings); the second term is
// causal attention (QK^T and PV, forward + backward, half the TxT square).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "lib/config/config.h"

namespace ds {

struct IterStats {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0, global_batch = 0;
  double ms_per_iter = 0, lr = 0, loss = 0, loss_scale = 1, grad_norm = 0;
  int64_t skipped = 0, nan_iters = 0;
  int64_t curriculum_seqlen = 0;  // > 0: the step's curriculum sequence length (logged)
  int64_t random_ltd_reserved = 0;  // > 0: random-LTD's reserved length of the step (logged)
  double moe_loss = -1;           // >= 0: Mixture of Experts, loss_coeff x sum of l_aux (logged after lm loss)
  double kd_loss = NAN;           // distillation (not NaN): the KD loss, logged after them as kd_label
  const char* kd_label = "kd loss";
  double tokens_per_s = 0, tflops = 0, mfu = -1;  // mfu < 0: not reported
  double max_mem_gb = -1;                          // < 0: not reported
  double elapsed_s = -1;  // since the trainer started; < 0: not reported (nor the ETA)
};

// Seconds left to train_iters at ms_per_iter (the last log interval's average):
// evaluation and checkpoint time are not in it.
double eta_seconds(const IterStats& s);

// DeepSpeed's wall_clock_breakdown: milliseconds per phase of the training
// step, summed over the iterations since the last log line.
struct StepTimes {
  double forward_backward = 0;  // all micro-batches (pipeline sends and receives included)
  double grads_reduce = 0;      // gradient reduction over data parallelism and the norm
  double optimizer = 0;         // clipping, loss-scale check and the AdamW step
  int64_t steps = 0;
};
std::string format_step_times(const StepTimes& t);  // per-iteration averages

double flops_per_token(const ModelConfig& m, int64_t n_params_matmul);
std::string format_iteration(const IterStats& s);
std::string format_validation(int64_t iteration, double loss);

// csv_monitor: OUTPUT_PATH/JOB_NAME/{train,valid}.csv. Every row is one
// write(); a write that fails (a full disk) is cut back off the file, so the
// files hold whole rows only, and stops training with one line naming the
// file (as the TensorBoard writer does): the run exits non-zero and resumes
// from its last checkpoint. A file that ends in a partial row (a run killed
// mid-write) has that row removed when it is opened again, so appended rows
// start on a fresh line.
class CsvMonitor {
 public:
  CsvMonitor() = default;
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;
  ~CsvMonitor();
  // Opens OUTPUT_PATH/JOB_NAME/{train,valid}.csv (appending on resume).
  void open(const std::string& output_path, const std::string& job_name);
  void train(const IterStats& s);
  void valid(int64_t iteration, double loss);
  bool enabled() const { return train_.fd >= 0; }

 private:
  struct File {
    int fd = -1;
    std::string path;
  };
  static void open_file(File& f, const std::string& path, const std::string& header);
  static void append(const File& f, const std::string& row);
  File train_, valid_;
};

}  // namespace ds
