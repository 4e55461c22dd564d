// fp16 dynamic loss scaling (see loss_scaler.h for the rules).
#include "lib/optim/loss_scaler.h"

#include <algorithm>

#include "lib/core/error.h"

namespace ds {

LossScaler::LossScaler(const LossScalerConfig& c) : c_(c), scale_(c.initial_scale), hysteresis_left_(c.hysteresis) {
  DS_USER_CHECK(c.initial_scale > 0 && c.min_scale > 0 && c.window > 0 && c.hysteresis >= 1,
                "fp16: loss scale {} / min_loss_scale {} / loss_scale_window {} / hysteresis {} out of range",
                c.initial_scale, c.min_scale, c.window, c.hysteresis);
}

void LossScaler::restore(double scale, int64_t good_steps, int hysteresis_left) {
  if (!c_.dynamic) return;  // a static scale comes from the config, not the checkpoint
  scale_ = scale > 0 ? scale : c_.initial_scale;
  good_ = std::max<int64_t>(0, good_steps);
  hysteresis_left_ = hysteresis_left >= 1 ? hysteresis_left : c_.hysteresis;
}

ScaleEvent LossScaler::update(bool overflow) {
  if (!c_.dynamic) return ScaleEvent::None;
  if (overflow) {
    good_ = 0;
    if (c_.hysteresis > 1 && hysteresis_left_ > 1) {
      --hysteresis_left_;
      return ScaleEvent::HysteresisSpent;
    }
    DS_USER_CHECK(scale_ > c_.min_scale,
                  "fp16: the gradients overflowed with the loss scale already at min_loss_scale {}; training has "
                  "diverged (lower the learning rate, or use bf16)",
                  c_.min_scale);
    scale_ = std::max(scale_ / 2, c_.min_scale);
    return ScaleEvent::Lowered;
  }
  if (c_.consecutive_hysteresis) hysteresis_left_ = c_.hysteresis;
  if (++good_ < c_.window) return ScaleEvent::None;
  good_ = 0;
  hysteresis_left_ = c_.hysteresis;
  scale_ *= 2;
  return ScaleEvent::Raised;
}

}  // namespace ds
