// GPT model (GPT-2 and LLaMA families) with explicit forward and backward.
// Parameters and gradients live in flat buffers described by ModelLayout;
// activations are allocated once per (B, T) and reused every micro-batch.
// The model calls only the device-neutral op API (lib/ops), never a backend.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"

namespace ds {

// Saved activations of one transformer layer for one micro-batch.
struct LayerActs {
  Tensor norm1_out, norm1_mean, norm1_rstd;  // (B,T,C), (B,T), (B,T)
  Tensor qkv;                                // (B,T,3C) after bias (and rope if any)
  Tensor qkv_pre;                            // (B,T,3C) before rope (rope models only)
  Tensor attn_out, lse;                      // (B,T,C), (B,NH,T)
  Tensor resid_mid;                          // (B,T,C) x + attention branch
  Tensor norm2_out, norm2_mean, norm2_rstd;  // (B,T,C), (B,T), (B,T)
  Tensor fc_out;                             // (B,T,F) or (B,T,2F) for swiglu
  Tensor act_out;                            // (B,T,F)
};

class GptModel {
 public:
  // alloc_elems: size of the params/grads allocations (>= layout total), so
  // data-parallel collectives can run on a padded buffer (ZeRO partitions).
  GptModel(const ModelConfig& cfg, Device dev, int64_t alloc_elems = 0);

  const ModelLayout& layout() const { return layout_; }
  const ModelDims& dims() const { return d_; }
  Device device() const { return dev_; }
  Tensor& params() { return params_; }  // (alloc) f32, layout total first
  Tensor& grads() { return grads_; }    // (alloc) f32
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // Megatron-style init: N(0, std) for matrices and embeddings, std/sqrt(2L)
  // for the output projections of each block, zeros for biases, ones for norms.
  // Element i of a weight depends only on (seed, weight name, i).
  void init_weights(uint64_t seed, float std);

  // Forward + backward of one micro-batch. tokens/targets: (B, T) i32 on the
  // model's device. Gradients are ADDED to grads(); each token's loss gets
  // weight `loss_weight` (e.g. 1 / (B*T*grad_accum)). Returns the mean loss.
  float forward_backward(const Tensor& tokens, const Tensor& targets, float loss_weight);
  // Forward only; returns the mean loss over non-ignored targets.
  float forward_loss(const Tensor& tokens, const Tensor& targets);

 private:
  void ensure_acts(int64_t B, int64_t T);
  void forward(const Tensor& tokens);                   // fills acts, logits
  float loss_and_dlogits(const Tensor& targets, float loss_weight, bool backward);
  void backward(const Tensor& tokens);
  void layer_forward(int l, const Tensor& x_in, const Tensor& x_out);
  void layer_backward(int l, const Tensor& x_in, const Tensor& dresid);
  void norm_forward(const std::string& prefix, const Tensor& out, const Tensor& mean,
                    const Tensor& rstd, const Tensor& inp);
  void norm_backward(const std::string& prefix, const Tensor& dinp, const Tensor& dout,
                     const Tensor& inp, const Tensor& mean, const Tensor& rstd);
  Tensor opt(const std::string& name, bool grad) const;  // undefined if absent

  ModelConfig cfg_;
  ModelDims d_;
  ModelLayout layout_;
  Device dev_;
  Stream stream_;
  Tensor params_, grads_;
  int64_t B_ = 0, T_ = 0;
  std::vector<Tensor> resid_;       // L+1 residual streams (B,T,C)
  std::vector<LayerActs> acts_;
  Tensor final_out, final_mean, final_rstd;  // (B,T,C), (B,T), (B,T)
  Tensor logits_;                   // (B*T, Vp), becomes dlogits in backward
  Tensor losses_;                   // (B*T) f32
  // Backward scratch.
  Tensor dresid_, dnorm_, dqkv_, dqkv2_, dattn_, dfc_, dact_;
};

}  // namespace ds
