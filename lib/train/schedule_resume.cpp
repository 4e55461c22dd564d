#include "lib/train/schedule_resume.h"

#include <fmt/format.h>

#include <vector>

#include "lib/core/error.h"
#include "lib/optim/lr_schedule.h"

namespace ds {
namespace {

std::string tokens_text(int64_t t) { return t < 0 ? "none" : std::to_string(t); }

// "name: flags A, checkpoint B" for each value that differs.
std::vector<std::string> differences(const LrScheduleValues& flags, const LrScheduleValues& ckpt) {
  std::vector<std::string> out;
  auto add = [&](const char* what, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(fmt::format("{} {} (flags) vs {} (checkpoint)", what, a, b));
  };
  auto lr = [](double v) { return fmt::format("{}", static_cast<float>(v)); };  // as the flag was written
  add("learning rate (--lr)", lr(flags.max_lr), lr(ckpt.max_lr));
  add("minimum learning rate (--min-lr)", lr(flags.min_lr), lr(ckpt.min_lr));
  add("warmup samples", std::to_string(flags.warmup_samples), std::to_string(ckpt.warmup_samples));
  add("decay samples", std::to_string(flags.decay_samples), std::to_string(ckpt.decay_samples));
  add("warmup tokens", tokens_text(flags.warmup_tokens), tokens_text(ckpt.warmup_tokens));
  add("decay tokens", tokens_text(flags.decay_tokens), tokens_text(ckpt.decay_tokens));
  add("decay style (--lr-decay-style)", flags.decay_style, ckpt.decay_style);
  return out;
}

LrDecay decay_from_name(const std::string& s) {
  return s == "constant"              ? LrDecay::Constant
         : s == "linear"              ? LrDecay::Linear
         : s == "inverse-square-root" ? LrDecay::InverseSqrt
         : s == "WSD"                 ? LrDecay::WSD
                                      : LrDecay::Cosine;
}

}  // namespace

std::string reconcile_lr_schedule(TrainConfig& cfg, const TrainState& loaded) {
  OptimizerConfig& o = cfg.optim;
  if (o.scheduler != LrScheduler::Megatron || !loaded.lr_schedule) return "";
  const LrScheduleValues& ckpt = *loaded.lr_schedule;
  const std::vector<std::string> diff = differences(lr_schedule_values(o), ckpt);
  if (diff.empty()) return "";
  const std::string list = fmt::format("{}", fmt::join(diff, "; "));
  if (cfg.override_lr_scheduler)
    return "--override-opt_param-scheduler: the learning-rate schedule comes from the flags: " + list;
  DS_USER_CHECK(cfg.use_checkpoint_lr_scheduler,
                "--load {}: the learning-rate schedule differs from the checkpoint's: {}; pass "
                "--override-opt_param-scheduler to use the flags or --use-checkpoint-opt_param-scheduler to use the "
                "checkpoint's",
                cfg.ckpt.load_dir, list);
  o.lr = static_cast<float>(ckpt.max_lr);
  o.min_lr = static_cast<float>(ckpt.min_lr);
  o.warmup_samples = ckpt.warmup_samples;
  o.decay_samples = ckpt.decay_samples;
  o.warmup_tokens = ckpt.warmup_tokens;
  o.decay_tokens = ckpt.decay_tokens;
  o.decay = decay_from_name(ckpt.decay_style);
  return "--use-checkpoint-opt_param-scheduler: the learning-rate schedule comes from the checkpoint: " + list;
}

void fill_legacy_lr_clock(const TrainConfig& cfg, TrainState& st) {
  if (st.lr_clock.samples >= 0) return;
  const int64_t gbs = cfg.batch.train_batch_size;
  st.lr_clock.samples = st.lr_clock.steps * gbs;
  st.lr_clock.tokens = std::max<int64_t>(0, st.iteration - 1) * gbs * cfg.model.seq_length;
}

}  // namespace ds
