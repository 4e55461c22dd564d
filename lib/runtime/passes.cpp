// One process's passes over a step's micro-batches (passes.h).
#include "lib/runtime/passes.h"

namespace ds {

void EagerPasses::train(const MicroBatchFeed& feed, int n, float loss_weight, const DropoutKey& key) {
  for (int m = 0; m < n; ++m) {
    const MicroBatch mb = feed(m);
    DropoutKey k = key;
    k.first_sample = mb.first_sample;
    if (mb.step_key.defined()) k.step = mb.step_key;
    if (m + 1 == n && before_last_) before_last_();
    model_.set_lengths(mb.lengths);
    model_.set_shifts(mb.shifts);
    model_.forward_backward(mb.tokens, mb.targets, loss_weight * mb.loss_weight_scale, k);
  }
}

double EagerPasses::forward_only(const MicroBatchFeed& feed, int n) {
  double sum = 0;
  for (int m = 0; m < n; ++m) {
    const MicroBatch mb = feed(m);
    model_.set_lengths(mb.lengths);
    model_.set_shifts(mb.shifts);
    sum += model_.forward_loss(mb.tokens, mb.targets);
  }
  return sum;
}

}  // namespace ds
