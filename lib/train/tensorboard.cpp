#include "lib/train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "lib/ckpt/crc32c.h"
#include "lib/core/error.h"

namespace ds {
namespace tensorboard {
namespace {

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void fixed(std::string& out, T v) {  // little-endian, as protobuf's fixed32/fixed64/double/float
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, const std::string& bytes) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}

// Event fields: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  varint(e, 1 << 3 | 1);
  fixed(e, wall_time);
  if (step != 0) {
    varint(e, 2 << 3 | 0);
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;  // Summary.Value: 1 tag (string), 2 simple_value (float)
  bytes_field(v, 1, tag);
  varint(v, 2 << 3 | 5);
  fixed(v, value);
  std::string summary;  // Summary: 1 repeated Value
  bytes_field(summary, 1, v);
  std::string e = event_head(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

std::string version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  bytes_field(e, 3, "brain.Event:2");
  return e;
}

}  // namespace tensorboard

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

void EventFileWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DS_USER_CHECK(!ec, "TensorBoard directory '{}' (--tensorboard-dir): cannot create it: {}", dir, ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double t = tensorboard::now_seconds();
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, static_cast<int64_t>(t), host, getpid());
  f_ = std::fopen(path_.c_str(), "wb");
  DS_USER_CHECK(f_ != nullptr, "TensorBoard directory '{}' (--tensorboard-dir): cannot create '{}': {}", dir, path_,
                std::strerror(errno));
  write_record(tensorboard::version_event(t));
  flush();
}

void EventFileWriter::write_record(const std::string& payload) {
  std::string rec;
  const uint64_t n = payload.size();
  rec.append(reinterpret_cast<const char*>(&n), 8);
  const uint32_t len_crc = masked_crc32c(rec.data(), rec.size());
  rec.append(reinterpret_cast<const char*>(&len_crc), 4);
  rec += payload;
  const uint32_t crc = masked_crc32c(payload.data(), payload.size());
  rec.append(reinterpret_cast<const char*>(&crc), 4);
  DS_USER_CHECK(std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size(), "cannot write TensorBoard file '{}': {}",
                path_, std::strerror(errno));
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  if (!f_) return;
  const double t = tensorboard::now_seconds();
  write_record(tensorboard::scalar_event(t, step, tag, static_cast<float>(value)));
}

void EventFileWriter::flush() {
  if (f_) std::fflush(f_);
}

void TensorBoardMonitor::open(const std::string& dir, TensorBoardOptions o) {
  o_ = o;
  w_.open(dir);
}

void TensorBoardMonitor::triple(const std::string& tag, double v, const TrainPoint& p) {
  w_.add_scalar(tag, v, p.iteration);
  w_.add_scalar(tag + " vs samples", v, p.samples);
  w_.add_scalar(tag + " vs tokens", v, p.tokens);
}

void TensorBoardMonitor::train(const TrainPoint& p) {
  if (!enabled()) return;
  w_.add_scalar("steps-vs-samples/y=steps,x=samples", static_cast<double>(p.iteration), p.samples);
  w_.add_scalar("steps-vs-samples/y=samples,x=steps", static_cast<double>(p.samples), p.iteration);
  w_.add_scalar("steps-vs-tokens/y=steps,x=tokens", static_cast<double>(p.iteration), p.tokens);
  w_.add_scalar("steps-vs-tokens/y=tokens,x=steps", static_cast<double>(p.tokens), p.iteration);
  if (o_.learning_rate) triple("learning-rate/learning-rate", p.lr, p);
  if (o_.batch_size) triple("batch-size/batch-size", p.batch_size, p);
  triple("lm-loss-training/lm loss", p.loss, p);
  if (!std::isnan(p.moe_loss)) triple("lm-loss-training/moe loss", p.moe_loss, p);
  if (p.fp16 && o_.loss_scale) triple("loss-scale/loss-scale", p.loss_scale, p);
  if (o_.world_size) triple("world-size/world-size", p.world_size, p);
  if (std::isfinite(p.grad_norm)) triple("grad-norm/grad-norm", p.grad_norm, p);
  triple("seqlen/actual_seq_length", p.seq_length, p);
  if (p.curriculum_seqlen > 0) triple("seqlen/curriculum_seqlen", p.curriculum_seqlen, p);
  if (p.random_ltd_reserved > 0) triple("seqlen/random_ltd_reserved_length", p.random_ltd_reserved, p);
}

void TensorBoardMonitor::iteration_time(const TrainPoint& p, double ms) {
  if (enabled() && o_.timers) triple("iteration-time/iteration-time", ms / 1000.0, p);
}

void TensorBoardMonitor::valid(const TrainPoint& p, double loss) {
  if (!enabled()) return;
  triple("lm-loss-validation/lm loss validation", loss, p);
  if (o_.validation_ppl) triple("lm-loss-validation/lm loss validation ppl", std::exp(std::min(20.0, loss)), p);
  flush();
}

void TensorBoardMonitor::optimizer(const TrainPoint& p, const OptimizerStats& s) {
  if (!enabled()) return;
  static const char* kNames[4] = {"variance", "variance_sqrt", "momentum", "weight"};
  for (int k = 0; k < 4; ++k) {
    const std::string base = std::string("optimizer/") + kNames[k];
    for (const auto& [suffix, v] : {std::pair<const char*, double>{"_l2", std::sqrt(s.sq[k])}, {"_l1", s.l1[k]},
                                    {"_abs_max", s.max[k]}}) {
      w_.add_scalar(base + suffix + " vs tokens", v, p.tokens);
      w_.add_scalar(base + suffix, v, p.iteration);
    }
  }
}

}  // namespace ds
