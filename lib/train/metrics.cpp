// Log line formatting and the CSV monitor.
#include "lib/train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/progress.h"

namespace ds {

double flops_per_token(const ModelConfig& m, int64_t n) {
  return 6.0 * static_cast<double>(n) +
         6.0 * m.num_layers * static_cast<double>(m.hidden_size) * static_cast<double>(m.seq_length);
}

std::string format_iteration(const IterStats& s) {
  std::string line = fmt::format(
      " iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): {:.1f} | "
      "learning rate: {:.6E} | global batch size: {:>5} | lm loss: {:.6E} |{} loss scale: {:.1f} | "
      "grad norm: {:.3f} |{}{} number of skipped iterations: {:>3} | number of nan iterations: {:>3} | "
      "tokens/s: {:.0f} | TFLOP/s: {:.3f} |",
      s.iteration, s.train_iters, s.consumed_samples, s.ms_per_iter, s.lr, s.global_batch, s.loss,
      (s.moe_loss >= 0 ? fmt::format(" moe loss: {:.6E} |", s.moe_loss) : std::string()) +
          (std::isnan(s.kd_loss) ? std::string() : fmt::format(" {}: {:.6E} |", s.kd_label, s.kd_loss)),
      s.loss_scale,
      s.grad_norm,
      s.curriculum_seqlen > 0 ? fmt::format(" curriculum seqlen: {:5d} |", s.curriculum_seqlen) : std::string(),
      s.random_ltd_reserved > 0 ? fmt::format(" random ltd reserved length: {:5d} |", s.random_ltd_reserved)
                                : std::string(),
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

namespace {

constexpr const char* kTrainHeader =
    "iteration,consumed_samples,lr,loss,grad_norm,loss_scale,ms_per_iter,tokens_per_s,tflops\n";
constexpr const char* kValidHeader = "iteration,loss,ppl\n";

[[noreturn]] void csv_write_error(const std::string& path, int err) {
  DS_USER_ERROR("csv_monitor: cannot write '{}': {}; training stops here (free some space and resume from the last "
                "checkpoint)", path, std::strerror(err));
}

// The length of the file's whole lines: its size, or the end of its last
// newline when it ends in a partial row.
off_t whole_lines_length(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) csv_write_error(path, errno);
  off_t end = st.st_size;
  char buf[4096];
  while (end > 0) {
    const off_t start = std::max<off_t>(0, end - static_cast<off_t>(sizeof(buf)));
    const ssize_t n = ::pread(fd, buf, static_cast<size_t>(end - start), start);
    if (n != end - start) csv_write_error(path, n < 0 ? errno : EIO);
    for (ssize_t i = n; i > 0; --i)
      if (buf[i - 1] == '\n') return start + i;
    end = start;
  }
  return 0;
}

}  // namespace

CsvMonitor::~CsvMonitor() {
  if (train_.fd >= 0) ::close(train_.fd);
  if (valid_.fd >= 0) ::close(valid_.fd);
}

void CsvMonitor::open_file(File& f, const std::string& path, const std::string& header) {
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (f.fd < 0) csv_write_error(path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) csv_write_error(path, errno);
  const off_t whole = whole_lines_length(f.fd, path);
  if (whole != st.st_size) {
    if (::ftruncate(f.fd, whole) != 0) csv_write_error(path, errno);
    DS_WARN("csv_monitor: '{}' ended in a partial row ({} bytes, from an interrupted write); removed it", path,
           st.st_size - whole);
  }
  if (whole == 0) append(f, header);
}

void CsvMonitor::append(const File& f, const std::string& row) {
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) csv_write_error(f.path, errno);
  const int err = write_all_fd(f.fd, row.data(), row.size());
  if (err == 0) return;
  // Cut a partial row back off; should that fail too, the next open() does.
  [[maybe_unused]] const int cut = ::ftruncate(f.fd, st.st_size);
  csv_write_error(f.path, err);
}

void CsvMonitor::open(const std::string& output_path, const std::string& job_name) {
  std::filesystem::path dir = std::filesystem::path(output_path) / job_name;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DS_USER_CHECK(!ec, "csv_monitor: cannot create '{}' (output_path '{}', job_name '{}'): {}", dir.string(),
                output_path, job_name, ec.message());
  open_file(train_, (dir / "train.csv").string(), kTrainHeader);
  open_file(valid_, (dir / "valid.csv").string(), kValidHeader);
}

void CsvMonitor::train(const IterStats& s) {
  if (train_.fd < 0) return;
  append(train_, fmt::format("{},{},{:.8e},{:.8e},{:.6e},{},{:.3f},{:.1f},{:.4f}\n", s.iteration,
                             s.consumed_samples, s.lr, s.loss, s.grad_norm, s.loss_scale, s.ms_per_iter,
                             s.tokens_per_s, s.tflops));
}

void CsvMonitor::valid(int64_t iteration, double loss) {
  if (valid_.fd < 0) return;
  append(valid_, fmt::format("{},{:.8e},{:.8e}\n", iteration, loss, std::exp(std::min(loss, 20.0))));
}

}  // namespace ds
