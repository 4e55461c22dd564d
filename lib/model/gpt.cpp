// GPT forward and backward, one transformer layer at a time, on the op API.
//   x_{l+1} = r + MLP(norm2(r)),  r = x_l + Attn(norm1(x_l))
// Backward walks the same steps in reverse with one residual-gradient buffer
// that each branch adds into (norm backward uses Accum::Add).
#include "lib/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/ops/ops.h"

namespace ds {
namespace {

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Tensor rows(const Tensor& t) { return t.reshape({t.numel() / t.size(-1), t.size(-1)}); }

}  // namespace

GptModel::GptModel(const ModelConfig& cfg, Device dev, int64_t alloc_elems)
    : cfg_(cfg), d_(model_dims(cfg)), layout_(build_layout(cfg)), dev_(dev) {
  const int64_t n = std::max(alloc_elems, layout_.total);
  params_ = Tensor::zeros({n}, DType::F32, dev_);
  grads_ = Tensor::zeros({n}, DType::F32, dev_);
}

Tensor GptModel::param(const std::string& name) const {
  const ParamSpec& p = layout_.find(name);
  return params_.view(p.offset, p.shape);
}

Tensor GptModel::grad(const std::string& name) const {
  const ParamSpec& p = layout_.find(name);
  return grads_.view(p.offset, p.shape);
}

Tensor GptModel::opt(const std::string& name, bool grad) const {
  const ParamSpec* p = layout_.try_find(name);
  if (!p) return Tensor();
  return (grad ? grads_ : params_).view(p->offset, p->shape);
}

void GptModel::init_weights(uint64_t seed, float std) {
  Tensor host = Tensor::zeros({params_.numel()}, DType::F32);
  float* w = host.data<float>();
  const double scaled = std / std::sqrt(2.0 * d_.L);
  for (const ParamSpec& p : layout_.params) {
    uint64_t stream = name_hash(p.name);
    float* dst = w + p.offset;
    switch (p.init) {
      case InitKind::Zeros: std::fill(dst, dst + p.numel, 0.f); break;
      case InitKind::Ones: std::fill(dst, dst + p.numel, 1.f); break;
      case InitKind::Normal:
      case InitKind::ScaledNormal: {
        double s = p.init == InitKind::Normal ? std : scaled;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<float>(s * normal_at(seed, stream, i));
        break;
      }
    }
  }
  params_.copy_from(host);
}

void GptModel::ensure_acts(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  DS_USER_CHECK(T <= d_.maxT || d_.rope, "sequence length {} exceeds max_position_embeddings {}", T, d_.maxT);
  B_ = B;
  T_ = T;
  const int64_t C = d_.C, F = d_.F, N = B * T, F_in = d_.swiglu ? 2 * F : F;
  auto f32 = [&](Shape s) { return Tensor::empty(s, DType::F32, dev_); };
  resid_.clear();
  for (int l = 0; l <= d_.L; ++l) resid_.push_back(f32({B, T, C}));
  acts_.assign(d_.L, LayerActs{});
  for (auto& a : acts_) {
    a.norm1_out = f32({N, C});
    a.norm1_mean = f32({N});
    a.norm1_rstd = f32({N});
    a.qkv = f32({B, T, 3 * C});
    if (d_.rope) a.qkv_pre = f32({B, T, 3 * C});
    a.attn_out = f32({B, T, C});
    a.lse = f32({B, d_.NH, T});
    a.resid_mid = f32({N, C});
    a.norm2_out = f32({N, C});
    a.norm2_mean = f32({N});
    a.norm2_rstd = f32({N});
    a.fc_out = f32({N, F_in});
    a.act_out = f32({N, F});
  }
  final_out = f32({N, C});
  final_mean = f32({N});
  final_rstd = f32({N});
  logits_ = f32({N, d_.Vp});
  losses_ = f32({N});
  dresid_ = f32({N, C});
  dnorm_ = f32({N, C});
  dqkv_ = f32({B, T, 3 * C});
  dattn_ = f32({B, T, C});
  dfc_ = f32({N, F_in});
  dact_ = f32({N, F});
}

void GptModel::norm_forward(const std::string& prefix, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd, const Tensor& inp) {
  if (d_.rmsnorm) {
    ops::rmsnorm_forward({out, rstd, rows(inp), param(prefix + ".weight"), cfg_.norm_eps}, stream_);
  } else {
    ops::layernorm_forward(
        {out, mean, rstd, rows(inp), param(prefix + ".weight"), param(prefix + ".bias"), cfg_.norm_eps},
        stream_);
  }
}

void GptModel::norm_backward(const std::string& prefix, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp, const Tensor& mean, const Tensor& rstd) {
  if (d_.rmsnorm) {
    ops::rmsnorm_backward({dinp, grad(prefix + ".weight"), dout, rows(inp), param(prefix + ".weight"),
                           rstd, Accum::Add},
                          stream_);
  } else {
    ops::layernorm_backward({dinp, grad(prefix + ".weight"), grad(prefix + ".bias"), dout, rows(inp),
                             param(prefix + ".weight"), mean, rstd, Accum::Add},
                            stream_);
  }
}

void GptModel::layer_forward(int l, const Tensor& x, const Tensor& y) {
  LayerActs& a = acts_[l];
  const std::string p = "layers." + std::to_string(l) + ".";
  norm_forward(p + "norm1", a.norm1_out, a.norm1_mean, a.norm1_rstd, x);
  Tensor qkv_lin = d_.rope ? a.qkv_pre : a.qkv;
  ops::matmul_forward({rows(qkv_lin), a.norm1_out, param(p + "attn.qkv.weight"), opt(p + "attn.qkv.bias", false)},
                      stream_);
  if (d_.rope) ops::rope_forward({a.qkv, a.qkv_pre, d_.NH, 0, cfg_.rope_theta}, stream_);
  ops::attention_forward({a.attn_out, a.lse, a.qkv, d_.NH}, stream_);
  ops::matmul_forward({a.resid_mid, rows(a.attn_out), param(p + "attn.proj.weight"),
                       opt(p + "attn.proj.bias", false)},
                      stream_);
  ops::add({a.resid_mid, a.resid_mid, rows(x)}, stream_);
  norm_forward(p + "norm2", a.norm2_out, a.norm2_mean, a.norm2_rstd, a.resid_mid);
  ops::matmul_forward({a.fc_out, a.norm2_out, param(p + "mlp.fc.weight"), opt(p + "mlp.fc.bias", false)}, stream_);
  if (d_.swiglu) {
    ops::swiglu_forward({a.act_out, a.fc_out}, stream_);
  } else {
    ops::gelu_forward({a.act_out, a.fc_out, Tensor()}, stream_);
  }
  Tensor y2 = rows(y);
  ops::matmul_forward({y2, a.act_out, param(p + "mlp.proj.weight"), opt(p + "mlp.proj.bias", false)}, stream_);
  ops::add({y2, y2, a.resid_mid}, stream_);
}

void GptModel::layer_backward(int l, const Tensor& x, const Tensor& dresid) {
  LayerActs& a = acts_[l];
  const std::string p = "layers." + std::to_string(l) + ".";
  // MLP branch.
  ops::matmul_backward({dact_, grad(p + "mlp.proj.weight"), opt(p + "mlp.proj.bias", true), dresid, a.act_out,
                        param(p + "mlp.proj.weight"), Accum::Overwrite},
                       stream_);
  if (d_.swiglu) {
    ops::swiglu_backward({dfc_, dact_, a.fc_out}, stream_);
  } else {
    ops::gelu_backward({dfc_, a.fc_out, dact_}, stream_);
  }
  ops::matmul_backward({dnorm_, grad(p + "mlp.fc.weight"), opt(p + "mlp.fc.bias", true), dfc_, a.norm2_out,
                        param(p + "mlp.fc.weight"), Accum::Overwrite},
                       stream_);
  norm_backward(p + "norm2", dresid, dnorm_, a.resid_mid, a.norm2_mean, a.norm2_rstd);
  // Attention branch.
  ops::matmul_backward({rows(dattn_), grad(p + "attn.proj.weight"), opt(p + "attn.proj.bias", true), dresid,
                        rows(a.attn_out), param(p + "attn.proj.weight"), Accum::Overwrite},
                       stream_);
  ops::attention_backward({dqkv_, dattn_, a.attn_out, a.lse, a.qkv, d_.NH}, stream_);
  if (d_.rope) ops::rope_backward({dqkv_, dqkv_, d_.NH, 0, cfg_.rope_theta}, stream_);
  ops::matmul_backward({dnorm_, grad(p + "attn.qkv.weight"), opt(p + "attn.qkv.bias", true), rows(dqkv_),
                        a.norm1_out, param(p + "attn.qkv.weight"), Accum::Overwrite},
                       stream_);
  norm_backward(p + "norm1", dresid, dnorm_, x, a.norm1_mean, a.norm1_rstd);
}

void GptModel::forward(const Tensor& tokens) {
  ensure_acts(tokens.size(0), tokens.size(1));
  ops::embedding_forward({resid_[0], tokens, param("embed.wte"), opt("embed.wpe", false), 0, 0}, stream_);
  for (int l = 0; l < d_.L; ++l) layer_forward(l, resid_[l], resid_[l + 1]);
  norm_forward("final_norm", final_out, final_mean, final_rstd, resid_[d_.L]);
  Tensor head = d_.untied ? param("head.weight") : param("embed.wte");
  ops::matmul_forward({logits_, final_out, head, Tensor()}, stream_);
}

float GptModel::loss_and_dlogits(const Tensor& targets, float loss_weight, bool backward) {
  Tensor t = targets.reshape({targets.numel()});
  ops::cross_entropy({losses_, backward ? logits_ : Tensor(), logits_, t, d_.V, loss_weight}, stream_);
  Tensor l = losses_.device().is_cpu() ? losses_ : losses_.to(Device::cpu());
  Tensor tg = t.device().is_cpu() ? t : t.to(Device::cpu());
  double sum = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < l.numel(); ++i) {
    if (tg.data<int32_t>()[i] < 0) continue;
    sum += l.data<float>()[i];
    ++n;
  }
  return n ? static_cast<float>(sum / n) : 0.f;
}

void GptModel::backward(const Tensor& tokens) {
  Tensor head = d_.untied ? param("head.weight") : param("embed.wte");
  Tensor dhead = d_.untied ? grad("head.weight") : grad("embed.wte");
  ops::matmul_backward({dnorm_, dhead, Tensor(), logits_, final_out, head, Accum::Overwrite}, stream_);
  dresid_.zero_();
  norm_backward("final_norm", dresid_, dnorm_, resid_[d_.L], final_mean, final_rstd);
  for (int l = d_.L - 1; l >= 0; --l) layer_backward(l, resid_[l], dresid_);
  ops::embedding_backward({grad("embed.wte"), opt("embed.wpe", true), dresid_.reshape({B_, T_, d_.C}), tokens, 0, 0},
                          stream_);
}

float GptModel::forward_backward(const Tensor& tokens, const Tensor& targets, float loss_weight) {
  forward(tokens);
  float loss = loss_and_dlogits(targets, loss_weight, true);
  backward(tokens);
  return loss;
}

float GptModel::forward_loss(const Tensor& tokens, const Tensor& targets) {
  forward(tokens);
  return loss_and_dlogits(targets, 0.f, false);
}

}  // namespace ds
