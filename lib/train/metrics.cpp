// Log line formatting and CSV output.
#include "lib/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "lib/core/error.h"
#include "lib/core/progress.h"

namespace ds {

double flops_per_token(const ModelConfig& m, int64_t n) {
  return 6.0 * static_cast<double>(n) +
         6.0 * m.num_layers * static_cast<double>(m.hidden_size) * static_cast<double>(m.seq_length);
}

std::string format_iteration(const IterStats& s) {
  std::string line = fmt::format(
      " iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): {:.1f} | "
      "learning rate: {:.6E} | global batch size: {:>5} | lm loss: {:.6E} | loss scale: {:.1f} | "
      "grad norm: {:.3f} |{} number of skipped iterations: {:>3} | number of nan iterations: {:>3} | "
      "tokens/s: {:.0f} | TFLOP/s: {:.3f} |",
      s.iteration, s.train_iters, s.consumed_samples, s.ms_per_iter, s.lr, s.global_batch, s.loss, s.loss_scale,
      s.grad_norm,
      s.curriculum_seqlen > 0 ? fmt::format(" curriculum seqlen: {:5d} |", s.curriculum_seqlen) : std::string(),
      s.skipped, s.nan_iters, s.tokens_per_s, s.tflops);
  line += s.mfu >= 0 ? fmt::format(" MFU: {:.1f}% |", 100.0 * s.mfu) : std::string(" MFU: n/a |");
  if (s.max_mem_gb >= 0) line += fmt::format(" max allocated (GB): {:.2f} |", s.max_mem_gb);
  if (s.elapsed_s >= 0)
    line += fmt::format(" elapsed time: {} | ETA: {} |", format_duration(s.elapsed_s), format_duration(eta_seconds(s)));
  return line;
}

double eta_seconds(const IterStats& s) {
  return s.ms_per_iter / 1000.0 * static_cast<double>(std::max<int64_t>(s.train_iters - s.iteration, 0));
}

std::string format_step_times(const StepTimes& t) {
  const double n = t.steps > 0 ? static_cast<double>(t.steps) : 1.0;
  return fmt::format(" time (ms) | forward-backward: {:.2f} | grads-reduce: {:.2f} | optimizer: {:.2f} |",
                     t.forward_backward / n, t.grads_reduce / n, t.optimizer / n);
}

std::string format_validation(int64_t iteration, double loss) {
  double ppl = std::exp(std::min(loss, 20.0));
  return fmt::format(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |", iteration,
                     loss, ppl);
}

void CsvMonitor::open(const std::string& output_path, const std::string& job_name) {
  std::filesystem::path dir = std::filesystem::path(output_path) / job_name;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DS_USER_CHECK(!ec, "csv_monitor: cannot create '{}' (output_path '{}', job_name '{}'): {}", dir.string(),
                output_path, job_name, ec.message());
  bool fresh_train = !std::filesystem::exists(dir / "train.csv");
  bool fresh_valid = !std::filesystem::exists(dir / "valid.csv");
  train_.open(dir / "train.csv", std::ios::app);
  valid_.open(dir / "valid.csv", std::ios::app);
  DS_USER_CHECK(train_.good() && valid_.good(), "csv_monitor: cannot write into '{}'", dir.string());
  if (fresh_train)
    train_ << "iteration,consumed_samples,lr,loss,grad_norm,loss_scale,ms_per_iter,tokens_per_s,tflops\n";
  if (fresh_valid) valid_ << "iteration,loss,ppl\n";
}

void CsvMonitor::train(const IterStats& s) {
  if (!train_.is_open()) return;
  train_ << fmt::format("{},{},{:.8e},{:.8e},{:.6e},{},{:.3f},{:.1f},{:.4f}\n", s.iteration, s.consumed_samples,
                        s.lr, s.loss, s.grad_norm, s.loss_scale, s.ms_per_iter, s.tokens_per_s, s.tflops);
  train_.flush();
}

void CsvMonitor::valid(int64_t iteration, double loss) {
  if (!valid_.is_open()) return;
  valid_ << fmt::format("{},{:.8e},{:.8e}\n", iteration, loss, std::exp(std::min(loss, 20.0)));
  valid_.flush();
}

}  // namespace ds
