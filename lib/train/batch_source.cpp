// BatchSource: the device copy every source shares.
#include "lib/train/batch_source.h"

#include "lib/core/device_runtime.h"
#include "lib/core/error.h"

namespace ds {

// GPU: an asynchronous copy through pinned staging memory, so feeding a
// micro-batch does not wait for the device (docs/distributed.md, host
// synchronisations per step).
Tensor BatchSource::upload(const Tensor& host) const {
  if (dev_.is_cuda()) {  // without blocking the host (a pageable copy would wait for the device)
    Tensor t = Tensor::empty(host.shape(), host.dtype(), dev_);
    device_runtime(dev_).upload_async(t.raw(), host.raw(), host.nbytes());
    return t;
  }
  return host.to(dev_);
}

MicroBatch BatchSource::to_device(MicroBatch mb) const {
  if (dev_.is_cpu()) return mb;
  mb.tokens = upload(mb.tokens);
  mb.targets = upload(mb.targets);
  if (mb.lengths.defined()) mb.lengths = upload(mb.lengths);
  if (mb.shifts.defined()) mb.shifts = upload(mb.shifts);
  return mb;
}

namespace {

class NoTrainingData final : public BatchSource {
 public:
  explicit NoTrainingData(Device dev) : BatchSource(dev) {}
  MicroBatch train_batch(int64_t, int, int, int, int64_t) override {
    DS_CHECK(false, "a run that trains no step asked for a training batch");
    return {};
  }
  MicroBatch valid_batch(int64_t, int, int) override {
    DS_CHECK(false, "a run that trains no step asked for a validation batch");
    return {};
  }
  bool has_valid() const override { return false; }
  int64_t train_samples_per_epoch() const override { return 0; }
};

}  // namespace

std::unique_ptr<BatchSource> no_training_data(Device dev) { return std::make_unique<NoTrainingData>(dev); }

}  // namespace ds
