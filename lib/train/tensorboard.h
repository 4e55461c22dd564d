// TensorBoard event files, written directly: TFRecord framing (length,
// masked CRC-32C of the length, payload, masked CRC-32C of the payload)
// around hand-encoded `Event` protocol buffers (wall_time, step, and a
// `Summary` of one `simple_value` per tag). TensorBoard reads them with its
// own reader; test/train/tensorboard_check.py does so in the suite.
// TensorBoardMonitor writes Megatron-DeepSpeed's scalar tags.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ds {

class EventFileWriter {
 public:
  EventFileWriter() = default;
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  ~EventFileWriter();
  // Creates DIR (and parents) and a new events.out.tfevents.<time>.<host>.<pid>
  // file in it, starting with the file-version event. A resumed run writes a
  // new file in the same directory; TensorBoard reads them as one run.
  void open(const std::string& dir);
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();  // whole records reach the file (fflush)

 private:
  void write_record(const std::string& payload);
  std::FILE* f_ = nullptr;
  std::string path_;
};

// Protocol-buffer pieces, exposed for tests.
namespace tensorboard {
std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
std::string version_event(double wall_time);
}  // namespace tensorboard

// What a training run reports (Megatron-DeepSpeed's tags: the value against
// the iteration, and the same "vs samples" / "vs tokens").
struct TensorBoardOptions {
  bool learning_rate = true, loss_scale = true;  // --no-log-learnig-rate-... / --no-log-loss-scale-...
  bool batch_size = false, timers = false, validation_ppl = false, world_size = false;
};

struct TrainPoint {
  int64_t iteration = 0, samples = 0, tokens = 0;
  double lr = 0, loss = 0, loss_scale = 1, grad_norm = 0, batch_size = 0, seq_length = 0, world_size = 1;
  double curriculum_seqlen = 0;  // > 0 with a sequence-length curriculum
  double random_ltd_reserved = 0;  // > 0 with random-LTD
  double moe_loss = NAN;         // Mixture of Experts: loss_coeff x sum of l_aux; NaN without MoE
  bool fp16 = false;
};

// Optimizer-state statistics (--log-optimizer-states-to-tensorboard): sums of
// squares (l2^2), sums of absolute values (l1) and absolute maxima of Adam's
// second moment v, sqrt(v), the first moment m and the fp32 weights.
struct OptimizerStats {
  double sq[4] = {0, 0, 0, 0}, l1[4] = {0, 0, 0, 0}, max[4] = {0, 0, 0, 0};  // v, sqrt(v), m, w
};

class TensorBoardMonitor {
 public:
  void open(const std::string& dir, TensorBoardOptions o);
  bool enabled() const { return w_.is_open(); }
  void train(const TrainPoint& p);                       // every tensorboard_log_interval iterations
  void iteration_time(const TrainPoint& p, double ms);  // at log_interval, with timers
  void valid(const TrainPoint& p, double loss);
  void optimizer(const TrainPoint& p, const OptimizerStats& s);
  void flush() { w_.flush(); }

 private:
  // tag against the iteration, samples and tokens.
  void triple(const std::string& tag, double v, const TrainPoint& p);
  EventFileWriter w_;
  TensorBoardOptions o_;
};

}  // namespace ds
