// ZeRO stage 0-2 gradient reduction and sharded optimizer step.
#include "lib/train/zero_optimizer.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/ops/ops.h"

namespace ds {

ZeroOptimizer::ZeroOptimizer(GptModel& model, Communicator* dp, const ZeroConfig& z, const ZeroPartition& part)
    : model_(model), dp_(dp), z_(z), part_(part) {
  DS_USER_CHECK(z.stage >= 0 && z.stage <= 2, "zero_optimization.stage {} is not supported yet (0, 1 or 2)",
                z.stage);
  DS_CHECK(model.params().numel() == part.padded_total, "model buffer {} != partition {}", model.params().numel(),
           part.padded_total);
  rank_ = dp ? dp->rank() : 0;
  range_ = z.stage == 0 ? Range{0, part.total} : part.owned_real(rank_);
  adam_ = std::make_unique<AdamW>(model.layout(), model.device(), range_.begin, range_.end);
}

double ZeroOptimizer::reduce_gradients() {
  Tensor g = model_.grads();
  const int dp = part_.dp;
  if (dp > 1 && z_.stage < 2) {
    for (const Range& b : make_buckets(part_.padded_total, z_.reduce_bucket_size))
      dp_->all_reduce(g.view(b.begin, {b.size()}));
  } else if (dp > 1) {
    const int64_t shard = part_.shard;
    for (const Range& c : make_shard_chunks(part_, z_.reduce_bucket_size)) {
      const int64_t n = c.size();
      Tensor send = Tensor::empty({dp * n}, DType::F32, g.device());
      for (int r = 0; r < dp; ++r) send.view(r * n, {n}).copy_from(g.view(r * shard + c.begin, {n}));
      Tensor recv = Tensor::empty({n}, DType::F32, g.device());
      dp_->reduce_scatter(send, recv);
      g.view(rank_ * shard + c.begin, {n}).copy_from(recv);
    }
  }
  if (z_.stage < 2 || dp == 1) return std::sqrt(grad_sum_squares(g.view(0, {part_.total})));
  // Stage 2: each rank holds only its shard of the summed gradients.
  Range mine = part_.owned_real(rank_);
  double local = mine.size() > 0 ? grad_sum_squares(g.view(mine.begin, {mine.size()})) : 0.0;
  Tensor s = Tensor::empty({1}, DType::F32);
  s.data<float>()[0] = static_cast<float>(local);
  dp_->all_reduce(s);
  return std::sqrt(static_cast<double>(s.data<float>()[0]));
}

void ZeroOptimizer::step(const AdamWHyper& h, float grad_scale) {
  if (range_.size() > 0) {
    adam_->step(model_.params().view(range_.begin, {range_.size()}), model_.grads().view(range_.begin, {range_.size()}),
                h, grad_scale);
  } else {
    adam_->set_step_count(adam_->step_count() + 1);
  }
  if (z_.stage >= 1 && part_.dp > 1) all_gather_params();
}

void ZeroOptimizer::all_gather_params() {
  Tensor p = model_.params();
  Tensor mine = p.view(rank_ * part_.shard, {part_.shard}).clone();
  dp_->all_gather(mine, p);
}

int64_t ZeroOptimizer::model_state_bytes() const {
  return 4 * (model_.params().numel() + model_.grads().numel() + adam_->m().numel() + adam_->v().numel());
}

}  // namespace ds
