// LoRA in GptModel (gpt.h, ModelConfig::lora): DeepSpeed-Chat's
// LinearLayer_LoRA computes y = x W^T + s (x R) L with R = lora_right_weight
// (in, dim), L = lora_left_weight (dim, out), s = scaling / dim, W frozen.
// Here each adapted weight is replaced, while its unit is held, by its
// effective weight W + s L^T R^T (per row block: one Hugging Face linear of
// a fused weight), so the layer code runs unchanged; the weight's gradient
// goes to a scratch dW, and from it the LoRA gradients: dL = s R^T dW^T and
// dR^T = s L dW (right is stored as R^T, (dim, in)). In bf16/fp16 the
// effective weight is rounded to the compute dtype as W is.
#include <algorithm>
#include <string>

#include "lib/core/error.h"
#include "lib/model/gpt.h"
#include "lib/ops/ops.h"

namespace ds {

void GptModel::init_lora() {
  lora_slots_.clear();
  frozen_.clear();
  lora_w_.clear();
  lora_dw_.clear();
  const LoraConfig& lora = cfg_.lora;
  bool any_frozen = false;
  for (const ParamSpec& p : layout_.params) any_frozen = any_frozen || p.lr_scale == 0.f;
  if (!lora.enabled() && !any_frozen) return;
  DS_USER_CHECK(!tp_.active() && sp_.size == 1, "LoRA runs without tensor or sequence parallelism");
  lora_slots_.resize(units_.size());
  frozen_.resize(units_.size());
  lora_s_ = lora.scaling / static_cast<float>(std::max(lora.dim, 1));
  for (size_t k = 0; k < lora.targets.size(); ++k) {
    const LoraTarget& t = lora.targets[k];
    if (!layout_.holds_layer(t.layer)) continue;
    const std::string p = "layers." + std::to_string(t.layer) + ".";
    auto index = [&](const std::string& name) {
      return static_cast<int32_t>(&layout_.find(name) - layout_.params.data());
    };
    lora_slots_[static_cast<size_t>(t.layer + 1)].push_back(
        {index(p + t.weight), index(p + "lora." + std::to_string(k) + ".left"),
         index(p + "lora." + std::to_string(k) + ".right"), t.row0, t.rows});
  }
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamSpec& p = layout_.params[i];
    if (p.lr_scale != 0.f) continue;
    const auto& slots = lora_slots_[static_cast<size_t>(unit_of(p))];
    const bool adapted = std::any_of(slots.begin(), slots.end(),
                                     [&](const LoraSlot& s) { return s.base == static_cast<int32_t>(i); });
    if (!adapted) frozen_[static_cast<size_t>(unit_of(p))].push_back(static_cast<int32_t>(i));
  }
}

void GptModel::lora_acquire(int unit) {
  for (const LoraSlot& s : lora_slots_[static_cast<size_t>(unit)]) {
    Tensor& weff = lora_w_[s.base];
    const Tensor base = unit_view(ParamRef{s.base}, unit_params_, "parameter");
    const int64_t K = base.size(1);
    if (!weff.defined()) {  // the first block of this weight: start from W
      weff = Tensor::empty(base.shape(), base.dtype(), dev_);
      weff.copy_from(base);
    }
    const Tensor L = w(ParamRef{s.left}), R = w(ParamRef{s.right});  // (dim, rows), (dim, in)
    Tensor delta = Tensor::zeros({s.rows, K}, DType::F32, dev_);
    const Tensor block = weff.view(s.row0 * K, {s.rows, K});
    // delta = L^T R: matmul_backward's weight gradient with dout = L, inp = R.
    ops::matmul_backward(
        {.dinp = Tensor(), .dweight = delta, .dbias = Tensor(), .dout = L, .inp = R, .weight = block}, stream_);
    ops::scale({.x = delta, .s = lora_s_}, stream_);
    ops::add({.out = block, .a = block, .b = delta}, stream_);
  }
}

void GptModel::lora_grads_begin(int unit) {
  for (const LoraSlot& s : lora_slots_[static_cast<size_t>(unit)]) {
    Tensor& g = lora_dw_[s.base];
    if (g.defined()) continue;
    const ParamSpec& p = layout_.params[static_cast<size_t>(s.base)];
    g = Tensor::zeros(p.shape, DType::F32, dev_);
  }
}

void GptModel::lora_fold_grads(int unit) {
  for (const LoraSlot& s : lora_slots_[static_cast<size_t>(unit)]) {
    const auto it = lora_dw_.find(s.base);
    if (it == lora_dw_.end()) continue;
    DS_CHECK(unit_params_[static_cast<size_t>(unit)].defined(), "LoRA: unit {}'s gradients folded without its weights",
             unit);
    const int64_t K = it->second.size(1);
    const Tensor dW = it->second.view(s.row0 * K, {s.rows, K});
    const Tensor L = w(ParamRef{s.left}), R = w(ParamRef{s.right});
    // dL (dim, rows) += s R dW^T
    Tensor t = Tensor::empty(L.shape(), DType::F32, dev_);
    ops::matmul_forward({.out = t, .inp = R, .weight = dW, .bias = Tensor()}, stream_);
    ops::scale({.x = t, .s = lora_s_}, stream_);
    const Tensor dL = dw(ParamRef{s.left});
    ops::add({.out = dL, .a = dL, .b = t}, stream_);
    // dR (dim, in) += s L dW: matmul_backward's input gradient with dout = L, weight = dW.
    Tensor u = Tensor::empty(R.shape(), DType::F32, dev_);
    ops::matmul_backward({.dinp = u, .dweight = Tensor(), .dbias = Tensor(), .dout = L, .inp = R, .weight = dW,
                          .accum = Accum::Overwrite},
                         stream_);
    ops::scale({.x = u, .s = lora_s_}, stream_);
    const Tensor dR = dw(ParamRef{s.right});
    ops::add({.out = dR, .a = dR, .b = u}, stream_);
  }
  for (const LoraSlot& s : lora_slots_[static_cast<size_t>(unit)]) lora_dw_.erase(s.base);
}

void GptModel::zero_frozen_grads(int unit) {
  for (int32_t i : frozen_[static_cast<size_t>(unit)]) unit_view(ParamRef{i}, unit_grads_, "gradient").zero_();
}

}  // namespace ds
