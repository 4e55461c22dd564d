// GPT model (GPT-2 and LLaMA families) with explicit forward and backward.
// Parameters and gradients are laid out by ModelLayout and held by a
// ParamStore (flat buffers by default, ZeRO shards when the trainer asks):
// the model acquires one unit (embeddings, a layer, the final norm/head) at a
// time. Activations are allocated once per (B, T) and reused every micro-batch
// (a pipeline stage holds one set per in-flight micro-batch and runs only its
// layers: stage_forward / stage_backward).
// The model calls only the device-neutral op API (lib/ops), never a backend.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "lib/core/stream.h"
#include "lib/core/tensor.h"
#include "lib/model/expert_comm.h"
#include "lib/model/kv_cache.h"
#include "lib/model/layout.h"
#include "lib/model/param_store.h"
#include "lib/model/tp_comm.h"
#include "lib/model/ulysses.h"
#include "lib/ops/dropout_mask.h"
#include "lib/ops/op_args.h"  // Accum

namespace ds {

// Saved activations of one transformer layer for one micro-batch. With tensor
// parallelism (TP ranks) Cl = C/TP, NHl = NH/TP, Fl = F/TP are this rank's
// head / FFN slices (QKVl = (NHl + 2*NKVl)*HS: its q heads and its kv heads,
// NKVl = NKV/TP, or one replicated kv head when NKV < TP); the residual stream and norms stay full (replicated),
// or hold T/TP positions per sample with sequence parallelism (the (B,T,C)
// shapes of norm1/norm2/resid_mid below and of ActSet's resid and final norm
// are then (B,T/TP,C); see local_seq()).
// DeepSpeed-Ulysses (sp size U > 1): T below is the rank's T/U positions and
// the attention tensors (qkv, qkv_pre, attn_out, lse) hold the full sequence
// U*T with this rank's NHl/U query heads and their kv heads (QKVa, Ca); the
// attention output back in sequence shards, the input of attn.proj, is attn_seq.
// A Mixture-of-Experts MLP's saved activations for one micro-batch
// (lib/model/moe_layer.cpp), sized by each forward: the experts' buffers hold
// Cb rows each (the capacity, or the largest expert load when dropless).
struct MoeActs {
  Tensor logits;        // (N, E) f32 router logits
  Tensor gates;         // (N, E) f32 softmax of the logits
  Tensor expert, slot;  // (N, K) i32 each token's choices and their rows (-1: dropped)
  Tensor weight;        // (N, K) f32 combine weights
  Tensor counts;        // (E) i32 choices per expert before dropping
  Tensor aux;           // (1) f32 load-balancing loss l_aux
  // The experts' inputs and activations: (El, Rl, ...) for this rank's El
  // experts with Rl rows each; without expert parallelism El = E, Rl = Cb;
  // with EP ranks El = E / EP and Rl = EP * Cb (every group rank's rows).
  Tensor xin;           // (El, Rl, C) the experts' inputs
  Tensor fc_out;        // (El, Rl, Fin) fc output (pre-activation)
  Tensor act_out;       // (El, Rl, F)
  Tensor xout;          // (E, Cb, C) the experts' outputs for this rank's tokens
  // PR-MoE: the experts' combined output, the dense MLP's activations and
  // output, and the mixing coefficients' logits.
  Tensor y_moe, res_fc, res_act, y_res;  // (N, C), (N, Fin), (N, F), (N, C)
  Tensor coef;                           // (N, 2) f32
  Tensor gate_in;  // (N, C) noisy gate policy Jitter: the router's jittered input
  uint64_t jitter_stream = 0;
};

// DeepSpeed Compression's activation quantization (ops act_quantize) of the
// inputs of the layers' dense linear layers, in the order qkv, attention
// proj, MLP fc, MLP proj; 0 bits leaves that input as it is. The quantized
// input is what the layer multiplies and what its weight gradient sees; its
// gradient passes straight through.
struct ActivationQuantization {
  std::vector<std::array<int, 4>> bits;  // per layer (the model's L); empty: none
  bool symmetric = true;
  bool calibrate_static = false;  // one running range per linear layer (activation_ranges)
};

struct LayerActs {
  Tensor norm1_out, norm1_mean, norm1_rstd;  // (B,T,C), (B,T), (B,T)
  Tensor qkv;                                // (B,T,QKVl) after bias (and rope if any)
  Tensor qkv_pre;                            // (B,T,QKVl) before rope (rope models only)
  Tensor attn_out, lse;                      // (B,T,Cl), (B,NHl,T)
  Tensor attn_seq;                           // (B,T,Cl) Ulysses: attn_out re-sharded; else attn_out itself
  Tensor resid_mid;                          // (B,T,C) x + attention branch
  Tensor norm2_out, norm2_mean, norm2_rstd;  // (B,T,C), (B,T), (B,T)
  // Post-norm blocks (ModelDims::post_norm): norm1 reads resid_mid and its
  // output is the MLP's input and residual; resid_out = norm1_out + MLP
  // branch is norm2's input and norm2 writes the layer's output (norm2_out
  // unused). The attention reads the layer's input itself.
  Tensor resid_out;                          // (B,T,C) post-norm only
  Tensor fc_out;                             // (B,T,Fl) or (B,T,2Fl) for swiglu
  Tensor act_out;                            // (B,T,Fl)
  Tensor attn_q;                             // (B,T,Cl) attention proj's quantized input (activation quantization)
  MoeActs moe;                               // MoE layers only (fc_out / act_out above unused)
};

// Where a training micro-batch is: the key of its dropout masks
// (lib/ops/dropout_mask.h, docs/dropout.md). A default key (train false) means
// no dropout: evaluation, forward_loss and every caller that does not train.
// With `step` defined the ops read the iteration and the first sample from it
// (on the model's device) and the two fields beside it are unused: a captured
// CUDA graph replays the same kernel arguments while the host writes each
// step's values into that buffer (lib/train/graph_step.cpp). The masks are
// those of the by-value key with the same values.
struct DropoutKey {
  bool train = false;
  uint64_t seed = 0;
  int64_t iteration = 0;     // 0-based training iteration
  int64_t first_sample = 0;  // global index of the micro-batch's first sample
  Tensor step;               // (2) i64 {iteration, first_sample} or undefined
};

// One micro-batch's activations of this rank's layers (a pipeline stage keeps
// several at once, one per in-flight micro-batch; otherwise one). resid and acts
// are indexed by global layer; only this stage's entries are allocated.
struct ActSet {
  std::vector<Tensor> resid;                  // L+1 residual streams (B,T,C)
  std::vector<LayerActs> acts;                // L
  Tensor final_out, final_mean, final_rstd;   // (B,T,C), (B,T), (B,T); last stage with a final norm
  Tensor emb_in;                              // (B,T,P) projected embedding: the token rows before project_in
  Tensor head_in;                             // (B*T,P) projected embedding: project_out's output
  Tensor logits;                              // (B*T, Vl), dlogits after the loss; last stage
  DropoutKey key;                             // of the micro-batch held (recomputation redraws with it)
  Tensor lengths;                             // its right-padding lengths (GptModel::set_lengths) or undefined
  Tensor shifts;                              // its position shifts (GptModel::set_shifts) or undefined
  // Random-LTD (GptModel::set_random_ltd): the micro-batch's kept positions,
  // (dropping layers, B, ltd_R) i32 on the model's device; ltd_R 0: no layer drops.
  Tensor ltd_index;
  int64_t ltd_R = 0;
};

// Where a layer's closing residual add (x_out = MLP output + resid_mid) runs:
// in the layer, or fused with the norm that reads x_out next (the next
// layer's norm1 or the final norm) as one add_norm_forward. Fusing needs no
// hidden dropout there and a next norm in the same forward call (a pipeline
// stage's last layer sends a complete x_out). The CPU's add_norm_forward is
// add then norm, so CPU results are bit-identical either way.
enum class ResidualAdd : uint8_t { InLayer, InNextNorm };

// Which pipeline stage a model is (pp = 1: the whole model), and with
// expert parallelism which block of each MoE layer's experts it holds (the
// expert-parallel group's rank) and the group its tokens are exchanged over.
struct PipeStage {
  int pp = 1, rank = 0, vp = 1;  // vp: model chunks (virtual stages) per stage
  EpComm ep;
};

// Activation recomputation (lib/model/recompute.cpp). Full: the first
// num_layers layers of each model chunk (0: all of them; Megatron's "block"
// method) keep only their input and re-run their forward just before their
// backward. Selective: every layer drops its attention output and recomputes
// it from the saved qkv and lse before its backward. Dropped tensors live in
// one shared scratch set, so the saved activations really shrink.
struct RecomputeConfig {
  using Kind = RecomputeKind;
  Kind kind = Kind::None;
  int num_layers = 0;
};

// A loss the caller computes from the model's outputs in place of the
// vocabulary cross-entropy (DeepSpeed-Chat's reward-model loss on a value
// head, lib/chat). While one is set (GptModel::set_head_loss), every forward
// that computes a loss hands it the outputs.
class HeadLoss {
 public:
  virtual ~HeadLoss() = default;
  // out: the micro-batch's (B*T, Vl) outputs (logits, or one value per row
  // with a value head) in the compute dtype on the model's device; tokens,
  // targets: its (B, T) i32. Returns the micro-batch's loss; with backward,
  // overwrites out with `weight` times that loss's gradient with respect to
  // it (the model's backward starts from there).
  virtual double apply(const Tensor& out, const Tensor& tokens, const Tensor& targets, float weight,
                       bool backward) = 0;
};

class GptModel {
 public:
  // Flat parameter and gradient buffers of alloc_elems (>= layout total) elements.
  // With tp.size > 1 the layout holds this tp rank's shards (build_layout(cfg,
  // tp.size, tp.rank)) and the forward/backward all-reduce over tp.comm.
  // With stage.pp > 1 the layout holds only that pipeline stage's weights.
  // `compute`: the dtype of the weights copy the forward reads and of the
  // activations (bf16/f16 with mixed precision); gradients and masters are f32.
  // `flat`: the gradient dtype and the ZeRO-1 master sharding of the flat store.
  GptModel(const ModelConfig& cfg, Device dev, int64_t alloc_elems = 0, TpComm tp = {}, PipeStage stage = {},
           DType compute = DType::F32, FlatStoreOptions flat = {});
  // Parameters and gradients held by `store` (not owned; must outlive the model).
  GptModel(const ModelConfig& cfg, Device dev, ParamStore& store, TpComm tp = {}, PipeStage stage = {},
           DType compute = DType::F32);

  const ModelLayout& layout() const { return layout_; }
  const ModelDims& dims() const { return d_; }  // full (unsplit) dimensions
  const TpComm& tp() const { return tp_; }
  // Each expert split over the tp ranks (--enable-expert-tensor-parallelism).
  bool expert_tp() const { return d_.expert_tp && tp_.active(); }
  Device device() const { return dev_; }
  DType compute_dtype() const { return compute_; }  // weights the forward reads, activations
  ParamStore& store() { return *store_; }
  const std::vector<Range>& units() const { return units_; }
  bool has_flat_buffers() const { return flat_ != nullptr; }
  // Flat-buffer models only (the default constructor).
  FlatParamStore& flat_store();
  Tensor& params();  // (alloc) f32, layout total first (not with a ZeRO-1 sharded master)
  Tensor& grads();   // (alloc) f32, or the compute dtype (FlatStoreOptions::grad)
  Tensor& compute_params();  // (total) bf16/f16 copy the forward reads; undefined in fp32
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // Megatron-style init: N(0, std) for matrices and embeddings, std/sqrt(2L)
  // for the output projections of each block, zeros for biases, ones for norms.
  // Element i of a weight depends only on (seed, weight name, i) of the FULL
  // weight: each rank computes only its own slices and stage (param_init.h).
  void init_weights(uint64_t seed, float std);

  // Forward + backward of one micro-batch. tokens/targets: (B, T) i32 on the
  // model's device. Gradients are ADDED to grads(); each token's loss gets
  // weight `loss_weight` (e.g. 1 / (B*T*grad_accum)). Returns the mean loss.
  // Dropout (the config's probabilities) only with a training `key`.
  // Targets: < 0 is ignored, >= V an error. While a loss sink is set the
  // targets stay on the device and only the CPU op checks their range (a
  // kernel cannot throw): the producer guarantees it there, as the training
  // data does (DataPipeline checks every dataset's largest id when it opens).
  // Without a sink the loss is read back and the targets checked on the host.
  float forward_backward(const Tensor& tokens, const Tensor& targets, float loss_weight,
                         const DropoutKey& key = {});
  // While set (not owned; null: the cross-entropy), every loss is h's: a
  // forward_backward's loss_weight then multiplies the micro-batch's loss
  // h returns (the cross-entropy's multiplies each token's), and a loss sink
  // receives it as the cross-entropy's mean. A value-head model
  // (ModelConfig::value_head) has no loss without one. Not with a dloss scale.
  void set_head_loss(HeadLoss* h) { head_loss_ = h; }
  // Right padding of the micro-batches of the following passes: (B) i32 on
  // the model's device, sample b's attention mask lengths[b] ones then zeros
  // (AttentionArgs::lengths: no query sees a padding key; DeepSpeed-Chat's
  // batches); undefined: none. The CPU backend's attention only so far.
  void set_lengths(const Tensor& lengths) { lengths_ = lengths; }
  // With lengths: sample b's real positions read the position table shifts[b]
  // rows further on ((B) i32 on the model's device; EmbeddingArgs::shifts),
  // a left-padded sequence packed to the left; undefined: none.
  void set_shifts(const Tensor& shifts) { shifts_ = shifts; }
  // Deferred loss, so that a GPU step needs no device-to-host read per
  // micro-batch: while a sink is set, every training forward (forward_backward,
  // and stage_forward with backward on the last stage) adds `weight` times its
  // micro-batch's mean loss (ops::masked_mean: the rows whose target is not
  // ignored) to sink[0] (a (1) f32 on the model's device), stream-ordered, and
  // returns NaN. Weight 0 adds nothing (a rank whose copy of the loss another
  // rank reports). An undefined sink turns the deferral off.
  void set_loss_sink(const Tensor& sink, float weight = 1.0f);
  // While defined (a (1) f32 on the model's device), the gradient of every
  // training loss is loss_weight times its value, read on the device when the
  // loss kernel runs: the fp16 loss scale of a captured step lives in the step
  // block, not in a kernel argument (docs/cuda.md, "CUDA graphs"). Not with
  // the vocab-parallel loss. Undefined: loss_weight alone.
  void set_dloss_scale(const Tensor& scale);
  // Mixture of Experts: while a sink is set, every training forward adds
  // `weight` times each MoE layer's load-balancing loss l_aux to sink[0] (a
  // (1) f32 on the model's device; the step's "moe loss" statistic). The
  // gradient of l_aux is loss_coeff times the micro-batch's loss weight
  // times its tokens (the loss is lm loss + loss_coeff * sum of l_aux, as
  // Megatron-DeepSpeed's loss_func), whether or not a sink is set.
  void set_moe_loss_sink(const Tensor& sink, float weight = 1.0f);
  bool has_moe() const;
  // The sum of the MoE layers' l_aux in the last forward (host read; tests).
  double moe_aux_loss() const;
  // Forgets a forward/backward that an exception interrupted (a CUDA graph
  // capture that failed midway; none of its device work ran): the units it
  // acquired are dropped without adding their gradients, so the next pass
  // starts clean (ParamStore::abandon_pass).
  void abandon_pass();
  // Mean of the per-row losses (N) f32 whose target (N) i32 is not ignored
  // (>= 0), summed in double: the loss every forward returns. Host tensors;
  // the masked_mean op computes it, the one the loss sink runs on the device.
  static float mean_loss(const Tensor& losses, const Tensor& targets);
  // Forward only; returns the mean loss over non-ignored targets (read back
  // and range-checked on the host).
  float forward_loss(const Tensor& tokens, const Tensor& targets);
  // Forward only, to the logits: (B*T, Vl) in the compute dtype, the model's
  // own activation buffer (valid until its next forward). A distillation
  // teacher's pass: `key` as in training (upstream's teacher runs in training
  // mode: dropout, the training capacity of MoE layers).
  Tensor forward_logits(const Tensor& tokens, const DropoutKey& key);

  // Knowledge distillation (docs/distillation.md): while a teacher is set,
  // forward_backward runs it on the micro-batch and adds Megatron-DeepSpeed's
  // KD loss, beta * temp^2 * KL(p_t || p_s) summed over the rows / (B x
  // seq_length), to the loss the backward starts from (with the micro-batch's
  // weight, as the lm loss). The teacher (not owned) must have the same padded
  // vocabulary and device and outlive the model; null: none.
  struct Distill {
    GptModel* teacher = nullptr;
    float beta = 1.0f, temp = 1.0f;
    int64_t seq_length = 0;  // Megatron's --seq-length: the divisor, also when a curriculum shortens T
    uint64_t seed = 0;       // the teacher's dropout stream
  };
  void set_distillation(const Distill& d);
  // While a sink is set, every training forward with a teacher adds `weight`
  // times its micro-batch's KD loss to sink[0] (a (1) f32 on the model's device).
  void set_kd_loss_sink(const Tensor& sink, float weight = 1.0f);

  // Activation quantization (reallocates the activations on the next pass;
  // the static ranges start at [0, 0]). Quantizing only while active: the
  // trainer turns it on at the schedule offset. Training forwards (a train
  // key) fold their inputs into the static ranges, recomputation included.
  void set_activation_quantization(ActivationQuantization q);
  void set_activation_quantization_active(bool on) { act_quant_on_ = on; }
  // (L, 4, 2) f32 [min, max] per layer and linear layer (static calibration);
  // undefined otherwise.
  Tensor& activation_ranges() { return act_ranges_; }

  // ---- Random-LTD (lib/model/random_ltd.h, docs/data_efficiency.md) --------
  // While `reserved` is below a training micro-batch's T, each layer of
  // `layers` (global indices) runs on `reserved` positions per sample
  // (random_ltd_positions, keyed by the micro-batch's DropoutKey) and passes
  // the others unchanged; evaluation and generation run every position.
  // Whole-sequence layouts only: no pipeline stages, sequence parallelism,
  // Ulysses or rotary positions. Empty layers: off.
  struct RandomLtd {
    std::vector<int> layers;
    int64_t reserved = 0;
  };
  void set_random_ltd(RandomLtd r);
  void set_random_ltd_reserved(int64_t reserved) { ltd_.reserved = reserved; }
  // The kept positions of the last forward's micro-batch, (layers, B, R) i32
  // (undefined when no layer dropped).
  const Tensor& random_ltd_index() const { return sets_.at(static_cast<size_t>(cur_)).ltd_index; }

  // ---- Pipeline stage (see lib/runtime/pipeline_executor.h) -----------------
  // Activation sets ("slots") kept at once, one per in-flight micro-batch.
  void set_activation_slots(int n);
  // `chunk`: the local model chunk (virtual stage; 0 unless interleaved).
  // (B,T,C), or (B,T/TP,C) with sequence parallelism: where the chunk receives
  // the previous virtual stage's output.
  Tensor stage_input(int slot, int chunk, int64_t B, int64_t T);
  Tensor stage_output(int slot, int chunk);  // (B,T,C) output of the chunk's last layer
  // Forward of a chunk on slot's activations: the first virtual stage embeds
  // tokens, others start from stage_input. The last virtual stage computes
  // the loss (and, if backward, dlogits with weight loss_weight) and returns
  // the mean loss (NaN with backward while a loss sink is set: the mean went
  // to the sink); others return 0. Dropout only with a training `key`.
  // Targets as for forward_backward.
  float stage_forward(int slot, int chunk, const Tensor& tokens, const Tensor& targets, float loss_weight,
                      bool backward, const DropoutKey& key = {});
  // Backward of slot's micro-batch through the chunk; dout (B,T,C) is the
  // gradient of its output (ignored on the last virtual stage). Gradients are ADDED.
  // defer_weights (zero-bubble pipelines, ActionKind::BackwardInput): the
  // weight-gradient GEMMs of the layers' dense linear layers (qkv, attention
  // proj, MLP fc and proj, as upstream's WeightGradStore; not the experts, the
  // head or the embeddings) are left for stage_weight_grads, which gets a
  // copy of each one's input and output gradient, one set per call.
  void stage_backward(int slot, int chunk, const Tensor& tokens, const Tensor& dout, bool defer_weights = false);
  Tensor stage_input_grad();  // (B,T,C) gradient of the stage input after stage_backward
  // Runs the oldest deferred set (ActionKind::WeightGrad): its weight
  // gradients are ADDED, as stage_backward would have, and its copies freed.
  void stage_weight_grads();
  int pending_weight_grads() const { return static_cast<int>(deferred_.size()); }
  // Bytes one deferred set holds on this rank for a (B, T) micro-batch
  // (the copies of the chunk's linear layers' inputs and output gradients).
  int64_t deferred_weight_grad_bytes(int64_t B, int64_t T, int chunk = 0) const;
  // Rows of the sequence this rank holds outside the tp regions: T, or T/TP
  // with sequence parallelism (stage inputs / outputs are then (B, T/TP, C)).
  int64_t local_seq(int64_t T) const { return tp_.sp() ? T / tp_.size : T; }

  // ---- DeepSpeed-Ulysses sequence parallelism (lib/model/ulysses.h) --------
  // With sp.size U > 1 the model is fed this rank's T/U positions of every
  // sample (tokens (B, T/U); see sequence_shard) and all-to-alls around the
  // attention core over sp.comm. UserError unless the query heads (and the
  // kv heads) of this tp rank split over U.
  void set_ulysses(SpComm sp);
  const SpComm& ulysses() const { return sp_; }

  // ---- Generation (lib/model/gpt_decode.cpp) -------------------------------
  // A cache for B samples of up to Tmax positions (Tmax <= max positions).
  // Whole models only (no pipeline stages, no sequence parallelism).
  KvCache make_kv_cache(int64_t B, int64_t Tmax) const;
  // Incremental forward: tokens (B, Tq) i32 on the model's device, row t of
  // sample b at position pos[b] + t (0 <= pos[b], pos[b] + Tq <= cache.Tmax).
  // Stores their keys and values in the cache and returns the logits of each
  // sample's LAST row over the real vocabulary: a host f32 (B, V) tensor,
  // gathered over tensor-parallel ranks (collective: every tp rank calls).
  Tensor decode_forward(const Tensor& tokens, const std::vector<int32_t>& pos, KvCache& cache);
  // While held, a unit a forward acquires stays acquired after the pass: its
  // weights (gathered once under ZeRO-3) and its LoRA effective weights
  // (computed once) serve every later forward until hold_params(false)
  // releases them. Generation holds them for a whole generate() call, as
  // DeepSpeed's hybrid engine does; no backward may run while they are held.
  void hold_params(bool hold);
  // The training forward (no dropout) on tokens (B, T); returns the logits of
  // every row: (B*T, Vl) in the compute dtype, valid until the next forward
  // (the reference the KV-cache path is tested against).
  const Tensor& forward_logits(const Tensor& tokens);

  // ---- Activation recomputation (lib/model/recompute.cpp) ----------------
  void set_recompute(RecomputeConfig r);
  const RecomputeConfig& recompute() const { return recompute_; }
  // Bytes of the activations saved for one micro-batch (one slot) of shape
  // (B, T), not counting the shared recompute scratch nor backward buffers.
  int64_t saved_activation_bytes(int64_t B, int64_t T);

  // ---- MLP GEMM epilogues ------------------------------------------------
  // Fused (default): a GELU model runs mlp.fc + GELU as matmul_bias_gelu_forward
  // and mlp.proj's input-gradient GEMM + GELU gradient + mlp.fc's bias
  // gradient as matmul_dgelu_bgrad (cuBLASLt epilogues on CUDA, falling back
  // per shape; on the CPU those ops are the unfused sequence, same bits).
  // Unfused: the separate ops. SwiGLU models always run the separate ops.
  enum class MlpFusion : uint8_t { Fused, Unfused };
  void set_mlp_fusion(MlpFusion f) {
    mlp_fusion_ = f;
    B_ = T_ = 0;  // reallocate on next use (the unfused backward needs dact_)
  }

 private:
  void ensure_acts(int64_t B, int64_t T);
  void alloc_act_set(ActSet& s, int64_t B, int64_t T);
  void forward(const Tensor& tokens, int chunk = 0);  // fills acts, logits
  float loss_and_dlogits(const Tensor& tokens, const Tensor& targets, float loss_weight, bool backward,
                         bool to_sink = false);
  void vocab_parallel_loss(const Tensor& targets, float loss_weight, bool backward);
  void init_local();  // local dims and units after layout_ is built
  void backward(const Tensor& tokens, const Tensor& dout = Tensor(), int chunk = 0);
  bool embeds(int chunk) const { return chunk == 0 && layout_.first_stage(); }
  bool has_head(int chunk) const { return chunk == layout_.shard.vp - 1 && layout_.last_stage(); }
  void head_backward();
  bool full_recompute(int l) const;  // layer l keeps only its input
  void alloc_layer_acts(LayerActs& a, int64_t B, int64_t T, bool dense_mlp = true);
  void alloc_recompute_scratch(int64_t B, int64_t T);
  // x, y: the layer's input and where a full recompute writes its output
  // (undefined: the slot's residual streams l and l + 1).
  void recompute_before_backward(int l, const Tensor& x = Tensor(), const Tensor& y = Tensor());
  // Random-LTD (random_ltd.cpp).
  RandomLtd ltd_;
  std::vector<int> ltd_layer_;  // per layer: its index in ltd_.layers, or -1
  Tensor ltd_x_, ltd_y_;        // (B*T*C) gather buffers of a dropping layer's rows
  struct ShortSeq;              // a dropping layer's (B, R) views while it runs
  bool ltd_active(int l) const;  // layer l drops positions in the current slot's pass
  void draw_random_ltd(ActSet& s);
  Tensor ltd_index(int l);      // (B, R) kept positions of layer l in the current slot
  void ltd_layer_forward(int l);
  void ltd_layer_backward(int l);
  // Tensor-parallel regions (lib/model/gpt_regions.cpp); with sequence
  // parallelism they gather / reduce-scatter the sequence (sp_full_ holds
  // the full-sequence tensor, valid until the next region call).
  Tensor enter_tp(const Tensor& x);             // input (Nl,C) of a column-parallel linear -> (N,C)
  Tensor enter_tp_backward(const Tensor& dx);   // (N,C) partial grads -> summed grad of the (Nl,C) input
  Tensor exit_tp_target(const Tensor& y);       // where a row-parallel linear writes its (N,C) partial sum
  void exit_tp(const Tensor& y);                // sum over tp into y (Nl,C)
  Tensor exit_tp_backward(const Tensor& dy);    // grad of y (Nl,C) -> grad of the (N,C) output
  void alloc_sp_buffers(int64_t B, int64_t T);
  // Grouped-query attention with fewer kv heads than tp ranks: the ranks of a
  // query group hold the same kv head, so its weight gradient is the sum of
  // their partial ones (full-NKV buffer, all-reduce over tp, own part back).
  void alloc_kv_grad_buffers();
  void sum_shared_kv_grads(const AttentionParams& attn);
  void sp_norm_backward(const NormParams& norm, const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                        const Tensor& mean, const Tensor& rstd);
  ActSet& S() { return sets_[cur_]; }
  // Dropout of the current slot's micro-batch at a site (p = 0 unless training).
  // The spec of one dropout site of the held micro-batch's key (off when not
  // training or p is 0); pos0/head0: the global offsets of this rank's rows.
  DropoutSpec dropout_spec(float p, int layer, DropoutSite site, int64_t pos0, int64_t head0);
  DropoutSpec hidden_dropout(int layer, DropoutSite site);
  DropoutSpec attention_dropout(int layer);
  Tensor dropout_key(const DropoutSpec& d);  // the ops' dropout_key for spec d
  // out = residual + dropout(inp) on (Nl, C) rows; a plain add without dropout.
  void dropout_add(const Tensor& out, const Tensor& inp, const Tensor& residual, const DropoutSpec& d);
  // Gradient of dropout's input from that of its output (Nl, C): dy itself without dropout.
  Tensor dropout_grad(const Tensor& dy, const DropoutSpec& d);
  // prev: where layer l-1's closing add runs (InNextNorm: c.x lacks c.mid,
  // added by this layer's fused norm1); add: where this layer's runs.
  void decode_layer(int l, KvCache& c, int64_t B, int64_t Tq, const std::vector<int32_t>& pos,
                    ResidualAdd prev = ResidualAdd::InLayer, ResidualAdd add = ResidualAdd::InLayer);
  void decode_scratch(KvCache& c, int64_t N);
  // x_in_residual defined: x_in holds only the previous layer's MLP output,
  // and norm1 is the fused add_norm_forward x_in += x_in_residual. add:
  // InNextNorm leaves x_out without resid_mid (the caller's next norm adds it).
  void layer_forward(int l, const Tensor& x_in, const Tensor& x_out, const Tensor& x_in_residual = Tensor(),
                     ResidualAdd add = ResidualAdd::InLayer);
  // Whether layer l of `chunk` may leave its closing add to the next norm.
  ResidualAdd closing_add(int l, int chunk);
  void layer_backward(int l, const Tensor& x_in, const Tensor& dresid);
  bool fused_gelu_mlp() const { return !d_.swiglu && !d_.relu && mlp_fusion_ == MlpFusion::Fused; }
  // add: as layer_forward's (InNextNorm leaves y without resid_mid).
  void mlp_forward(int l, LayerActs& a, const Tensor& y, ResidualAdd add);
  void mlp_backward(int l, LayerActs& a, const Tensor& dresid);
  // Mixture-of-Experts MLP (lib/model/moe_layer.cpp): the same contract as
  // mlp_forward; the experts are replicated over tp ranks, so no tp region is
  // entered. With sequence parallelism every tp rank gathers the whole
  // sequence, runs the MoE on all of it (the gate sees the micro-batch's
  // tokens, as without SP) and keeps its shard of the output; the same over
  // the Ulysses group (each rank then computes the whole sequence's MoE).
  void moe_forward(int l, LayerActs& a, const Tensor& y, ResidualAdd add);
  // The MoE MLP itself: y (N, C) = experts(x (N, C)), its activations in m;
  // seq: the positions per sample of x's rows (the gate's token order).
  void moe_mlp(int l, const Tensor& x, const Tensor& y, MoeActs& m, const DropoutKey& key, int64_t seq);
  // Returns the gradient of norm2_out (this rank's rows), complete: dnorm_,
  // or with sequence parallelism this rank's shard of it (dnorm_sh_).
  Tensor moe_backward(int l, LayerActs& a, const Tensor& dresid);
  // The backward of moe_mlp: x, dy (N, C) its input and output gradient;
  // writes the input gradient to dx (N, C).
  void moe_mlp_backward(int l, LayerActs& a, const Tensor& x, const Tensor& dy, const Tensor& dx);
  void norm_forward(const NormParams& norm, const Tensor& out, const Tensor& mean,
                    const Tensor& rstd, const Tensor& inp);
  // sum = residual + dropout(inp), then the norm of sum into out: the fused
  // add_norm_forward op without dropout, dropout_add + norm_forward with.
  void dropout_add_norm(const NormParams& norm, const Tensor& sum, const Tensor& inp, const Tensor& residual,
                        const DropoutSpec& d, const Tensor& out, const Tensor& mean, const Tensor& rstd);
  // dinp += the input gradient (Accum::Overwrite: dinp = it; not with sequence parallelism).
  void norm_backward(const NormParams& norm, const Tensor& dinp, const Tensor& dout,
                     const Tensor& inp, const Tensor& mean, const Tensor& rstd, Accum accum = Accum::Add);
  // The norm's backward op with its weight (and, for LayerNorm, bias)
  // gradients added into dweight / dbias: the parameters' own gradients
  // (norm_backward) or the shard sums sequence parallelism reduces first
  // (sp_norm_backward).
  void norm_backward_op(const NormParams& norm, const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dweight, const Tensor& dbias,
                        Accum accum = Accum::Add);
  // Post-norm blocks (ModelDims::post_norm): what the attention's qkv and
  // the MLP's fc multiply, and the residual the MLP branch is added to.
  Tensor attn_input(const LayerActs& a, const Tensor& x) const;
  const Tensor& mlp_input(const LayerActs& a) const { return d_.post_norm ? a.norm1_out : a.norm2_out; }
  const Tensor& mlp_residual(const LayerActs& a) const { return d_.post_norm ? a.norm1_out : a.resid_mid; }
  // The attention branch's backward from dresid (the gradient of resid_mid)
  // down to dnorm_, the gradient of the attention's input through it.
  void attention_branch_backward(int l, LayerActs& a, const Tensor& x, const Tensor& dresid);
  void post_norm_layer_backward(int l, const Tensor& x, const Tensor& dresid);
  // Projected embedding (ModelDims::projects): tokens -> emb_in -> project_in,
  // plus the positions, into S().resid[0]; and its backward from dresid_.
  void projected_embedding_forward(const Tensor& tokens);
  void projected_embedding_backward(const Tensor& tokens, const Tensor& demb);
  // On the last stage: the final norm's output, or the last layer's output
  // (post-norm, no final norm); and the head's input, that or project_out's
  // output (projected embedding).
  Tensor final_output();
  Tensor head_input();
  // Views into the acquired unit tensors (the unit must be acquired), by the
  // blocks' typed handles (layout().layers / embed / head).
  Tensor w(ParamRef r) const;   // parameter
  Tensor dw(ParamRef r) const;  // gradient
  Tensor opt(ParamRef r, bool grad) const;  // undefined if the block has no such tensor
  Tensor unit_view(ParamRef r, const std::vector<Tensor>& acquired, const char* what) const;
  const LayerParams& lp(int l) const { return layout_.layers[static_cast<size_t>(l)]; }
  void use_params(int unit);
  void drop_params(int unit);
  void use_grads(int unit);
  void grads_done(int unit);
  // The weight gradient a layer's linear layer adds to: dw(weight), or while
  // stage_backward defers, undefined (the GEMM is skipped) after a copy of
  // dout and inp went into the newest deferred set.
  Tensor weight_grad(int l, ParamRef weight, const Tensor& dout, const Tensor& inp);
  struct DeferredWeightGrad {
    ParamRef weight;
    int unit = 0;
    Tensor dout, inp;  // (N, OC), (N, C) copies
  };
  std::deque<std::vector<DeferredWeightGrad>> deferred_;  // one set per deferring backward, oldest first
  bool defer_weights_ = false;
  ActivationQuantization act_quant_;
  bool act_quant_on_ = false;
  Tensor act_ranges_;
  bool quantizes(int l, int which) const {
    return act_quant_on_ && !act_quant_.bits.empty() && act_quant_.bits[static_cast<size_t>(l)][which] > 0;
  }
  // Quantizes x in place as the input of layer l's linear layer `which` (0-3).
  void quantize_input(int l, int which, const Tensor& x);
  Tensor proj_input(int l, LayerActs& a);  // what the attention proj multiplies
  std::vector<int> forward_order(int chunk = 0) const;
  std::vector<int> backward_order(int chunk = 0) const;

  ModelConfig cfg_;
  DType compute_ = DType::F32;
  ModelDims d_;
  TpComm tp_;
  PipeStage stage_;
  int64_t Cl_ = 0, NHl_ = 0, Fl_ = 0, Vl_ = 0, vocab_start_ = 0;  // this tp rank's slices
  int64_t NKVl_ = 0, QKVl_ = 0;  // kv heads of this tp rank, its qkv width (NHl + 2*NKVl)*HS
  // Heads inside attention: this tp rank's, or with Ulysses this sp rank's
  // share of them (NHa = NHl/U; NKVa = NKVl/U, or 1 replicated kv head).
  int64_t NHa_ = 0, NKVa_ = 0, QKVa_ = 0, Ca_ = 0;
  SpComm sp_;
  HeadSplit qkv_split_, out_split_;  // qkv rows [q | k | v] and attention-output rows over sp
  UlyssesScratch uly_;
  Tensor uly_qkv_, dattn_a_, dqkv_a_;  // (B,T,QKVl) local qkv; (B,UT,Ca), (B,UT,QKVa) attention grads
  ModelLayout layout_;
  Device dev_;
  Stream stream_;
  std::unique_ptr<FlatParamStore> flat_;  // set for the default (flat) layout
  ParamStore* store_ = nullptr;
  std::vector<Range> units_;
  std::vector<Tensor> unit_params_, unit_grads_;  // acquired units (else undefined)
  bool hold_ = false;                               // hold_params
  // LoRA (lib/model/lora.cpp, ModelConfig::lora): each target's base weight,
  // left (dim, rows) and right (dim, in) tensors and row block, per unit.
  // While a unit is held, w() of an adapted weight is its effective weight
  // (W + s left^T right per block, s = scaling / dim) and dw() a scratch
  // whose blocks become the left and right gradients in grads_done; the
  // weight's own gradient stays zero (frozen).
  struct LoraSlot {
    int32_t base = -1, left = -1, right = -1;
    int64_t row0 = 0, rows = 0;
  };
  std::vector<std::vector<LoraSlot>> lora_slots_;       // per unit
  std::vector<std::vector<int32_t>> frozen_;            // per unit: lr_scale 0 tensors that are not adapted
  std::map<int32_t, Tensor> lora_w_, lora_dw_;          // by base param index, while held
  float lora_s_ = 0.f;
  void init_lora();
  void lora_acquire(int unit);        // the effective weights of the unit's adapted weights
  void lora_grads_begin(int unit);    // zeroed scratch gradients for them
  void lora_fold_grads(int unit);     // left / right gradients from the scratch (while the unit's weights are held)
  void zero_frozen_grads(int unit);   // the gradients of frozen tensors that are not adapted
  int64_t B_ = 0, T_ = 0;
  std::vector<ActSet> sets_;        // activation slots (one unless pipelined)
  RecomputeConfig recompute_;
  MlpFusion mlp_fusion_ = MlpFusion::Fused;
  LayerActs scratch_;               // shared by recomputed layers (or attn_out when selective)
  int n_slots_ = 1, cur_ = 0;
  Tensor losses_;                   // (B*T) f32
  HeadLoss* head_loss_ = nullptr;   // set_head_loss
  Tensor lengths_;                  // set_lengths
  Tensor shifts_;                   // set_shifts
  Tensor loss_sink_;  // see set_loss_sink
  Tensor dloss_scale_;  // see set_dloss_scale
  float loss_sink_weight_ = 1.0f;
  Tensor moe_sink_;  // see set_moe_loss_sink
  float moe_sink_weight_ = 1.0f;
  float aux_grad_ = 0.f;  // gradient of the loss w.r.t. each l_aux in the running backward
  Distill distill_;       // see set_distillation
  Tensor kd_losses_, kd_rows_;  // (B*T) f32 per-row KL; (B*T) i32 zeros (every row counts in the mean)
  Tensor kd_sink_;        // see set_kd_loss_sink
  float kd_sink_weight_ = 1.0f;
  void distill_into_dlogits(const Tensor& tokens, float loss_weight, const DropoutKey& key);  // before the lm loss
  void add_distill_grad();  // after it: the KD gradient into dlogits
  bool recomputing_ = false;  // a fully recomputed layer's second forward runs (recompute.cpp)
  Tensor ce_max_, ce_stats_;        // (B*T), (2, B*T) f32: vocab-parallel softmax statistics
  // Backward scratch.
  Tensor dresid_, dnorm_, dqkv_, dqkv2_, dattn_, dfc_, dact_;
  Tensor dpost_;             // (N, C) post-norm: the gradient of resid_out, then of norm1_out
  // Projected embedding: a (0, C) table (no token is in it: positions
  // alone), (N, C) position rows, and the (N, P) gradients of emb_in / head_in.
  Tensor no_rows_, emb_pos_, demb_in_, dhead_in_;
  // Sequence-parallel scratch: full-sequence (N,C) tensor and permute buffer,
  // the sharded norm input gradient, per-rank norm weight gradients.
  Tensor sp_full_, sp_tmp_, dnorm_sh_, sp_dw_, sp_db_;
  Tensor moe_full_;  // MoE layers: the full-sequence output (forward) / output gradient (backward)
  // MoE layers under DeepSpeed-Ulysses (moe_layer.cpp): the whole sequence's
  // input, output (or output gradient), input gradient and gather scratch.
  Tensor moe_ux_, moe_uy_, moe_udx_, moe_utmp_;
  // Replicated kv heads (NKV < TP): this rank's qkv weight / bias gradient
  // (QKVl, C), (QKVl); the full-NKV k and v gradient exchange buffer.
  Tensor kv_dw_, kv_db_, kv_full_;
};

}  // namespace ds
