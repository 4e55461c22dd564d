// fp16 loss scaling with DeepSpeed's semantics (DynamicLossScaler).
// The loss is multiplied by scale() before the backward pass; the step that
// follows either applies (no inf/nan in any gradient) or is skipped. Dynamic
// mode: after `window` consecutive good steps the scale doubles; an overflow
// first spends the hysteresis budget (`hysteresis` overflows tolerated) and
// then halves the scale, never below `min_scale`. With consecutive_hysteresis
// the budget refills after every good step, otherwise only when the scale is
// raised. Static mode (loss_scale > 0 in the config): the scale never moves,
// overflowing steps are still skipped. The whole state is three numbers that
// checkpoints keep (TrainState: loss_scale, good_steps, hysteresis_left).
#pragma once
#include <cstdint>

namespace ds {

struct LossScalerConfig {
  bool dynamic = true;
  double initial_scale = 65536.0;  // 2^initial_scale_power, or the static loss_scale
  int64_t window = 1000;           // loss_scale_window
  int hysteresis = 2;              // delayed_shift
  double min_scale = 1.0;
  bool consecutive_hysteresis = false;
};

enum class ScaleEvent { None, Raised, Lowered, HysteresisSpent };

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& c);
  double scale() const { return scale_; }
  bool dynamic() const { return c_.dynamic; }
  int64_t good_steps() const { return good_; }
  int hysteresis_left() const { return hysteresis_left_; }
  // Restores the state a checkpoint kept.
  void restore(double scale, int64_t good_steps, int hysteresis_left);
  // Records one step's outcome and moves the scale. Throws UserError when a
  // dynamic scale is already at min_scale and overflows again (DeepSpeed stops
  // the run there too: training has diverged).
  ScaleEvent update(bool overflow);

 private:
  LossScalerConfig c_;
  double scale_;
  int64_t good_ = 0;
  int hysteresis_left_;
};

}  // namespace ds
