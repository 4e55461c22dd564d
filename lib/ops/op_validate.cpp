// validate_<op>(args): the shape, dtype and device checks of every op, in the
// order of the declarations in lib/ops/op_args.h. Called by the dispatcher
// (lib/ops/ops.cpp) before the call reaches ds::cpu or ds::cuda. Dtype rules
// are the declaration's: statistics and master state f32, ids i32, every
// other tensor a float dtype (f32, bf16, f16; the CUDA backend also asks one
// compute dtype per call, its kernels being templated on it). Fields whose
// comment says "or undefined" are optional here even where one backend still
// needs them (lib/cpu says so itself).
#include "lib/ops/op_validate.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace ds::ops {
namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Leading rows of a (..., C) tensor.
int64_t rows_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.numel() / t.size(-1); }

// The checks of one op call; every message names the op and the field.
class Check {
 public:
  explicit Check(const char* op) : op_(op) {}

  // Every defined tensor field is on the device type of the first one.
  template <class Args>
  void devices(const Args& a) const {
    const Tensor* key = nullptr;
    const char* key_name = "";
    fields(a, [&](const Tensor& t, const char* name, Role) {
      if (!t.defined()) return;
      if (!key) {
        key = &t;
        key_name = name;
        return;
      }
      DS_CHECK(t.device().type == key->device().type, "{}: tensor '{}' is on {}, but '{}' is on {}",
               op_, name, device_name(t.device()), key_name, device_name(key->device()));
    });
  }
  void defined(const Tensor& t, const char* name) const {
    DS_CHECK(t.defined(), "{}: tensor '{}' is undefined", op_, name);
  }
  // Defined, with a float dtype (f32, bf16, f16).
  void floating(const Tensor& t, const char* name) const {
    defined(t, name);
    DS_CHECK(is_float(t.dtype()), "{}: tensor '{}' has dtype {}, expected f32, bf16 or f16", op_,
             name, dtype_name(t.dtype()));
  }
  void dtype(const Tensor& t, DType dt, const char* name) const {
    defined(t, name);
    DS_CHECK(t.dtype() == dt, "{}: tensor '{}' has dtype {}, expected {}", op_, name,
             dtype_name(t.dtype()), dtype_name(dt));
  }
  // `t` holds exactly `n` elements (its shape may be any factorisation).
  void numel(const Tensor& t, int64_t n, const char* name, const char* expect) const {
    DS_CHECK(t.numel() == n, "{}: tensor '{}' has shape {} ({} elements), expected {} = {}", op_,
             name, shape_str(t.shape()), t.numel(), expect, n);
  }
  void same_shape(const Tensor& t, const Tensor& ref, const char* name, const char* ref_name) const {
    DS_CHECK(t.shape() == ref.shape(), "{}: '{}' has shape {} but '{}' has shape {}", op_, name,
             shape_str(t.shape()), ref_name, shape_str(ref.shape()));
  }
  // An f32 statistic of `n` elements.
  void stat(const Tensor& t, int64_t n, const char* name, const char* expect = "N") const {
    dtype(t, DType::F32, name);
    numel(t, n, name, expect);
  }
  const char* op() const { return op_; }

 private:
  const char* op_;
};

// ---- embedding ---------------------------------------------------------------

struct EmbedDims {
  int64_t B, T, C;
};
EmbedDims check_embedding(const Check& c, const Tensor& x, const char* x_name, const Tensor& tokens,
                          const Tensor& wte, const char* wte_name, const Tensor& wpe,
                          const char* wpe_name, int64_t pos_offset, int64_t row_offset, const Tensor& lengths,
                          int64_t pad_row, const Tensor& shifts) {
  c.dtype(tokens, DType::I32, "tokens");
  c.floating(wte, wte_name);
  c.floating(x, x_name);
  DS_CHECK(tokens.dim() == 2, "{}: tokens must be (B, T), got {}", c.op(), shape_str(tokens.shape()));
  DS_CHECK(wte.dim() == 2, "{}: {} must be (Vlocal, C), got {}", c.op(), wte_name,
           shape_str(wte.shape()));
  const EmbedDims d{tokens.size(0), tokens.size(1), wte.size(1)};
  DS_CHECK(x.shape() == Shape({d.B, d.T, d.C}), "{}: {} has shape {}, expected (B, T, C) = {}",
           c.op(), x_name, shape_str(x.shape()), shape_str({d.B, d.T, d.C}));
  if (lengths.defined()) {
    c.dtype(lengths, DType::I32, "lengths");
    c.numel(lengths, d.B, "lengths", "(B)");
  }
  if (!wpe.defined()) return d;
  c.floating(wpe, wpe_name);
  DS_CHECK(wpe.dim() == 2 && wpe.size(1) == d.C, "{}: {} has shape {}, expected (maxT, {})",
           c.op(), wpe_name, shape_str(wpe.shape()), d.C);
  DS_CHECK(pos_offset >= 0 && row_offset >= 0 && row_offset + pos_offset + d.T <= wpe.size(0),
           "{}: positions [{}, {}) from row {} exceed {} rows {}", c.op(), pos_offset, pos_offset + d.T, row_offset,
           wpe_name, wpe.size(0));
  DS_CHECK(pad_row < wpe.size(0), "{}: pad_row {} outside {} rows {}", c.op(), pad_row, wpe_name, wpe.size(0));
  if (shifts.defined()) {
    DS_CHECK(lengths.defined(), "{}: shifts need lengths (they move real positions only)", c.op());
    c.dtype(shifts, DType::I32, "shifts");
    c.numel(shifts, d.B, "shifts", "(B)");
    if (shifts.device().is_cpu() && lengths.device().is_cpu())
      for (int64_t b = 0; b < d.B; ++b) {
        const int64_t s = shifts.data<int32_t>()[b], n = std::min<int64_t>(lengths.data<int32_t>()[b], d.T);
        DS_CHECK(s >= 0 && row_offset + pos_offset + s + n <= wpe.size(0),
                 "{}: sample {} shifted by {} reads positions past {} rows {}", c.op(), b, s, wpe_name, wpe.size(0));
      }
  }
  return d;
}

// ---- norms -------------------------------------------------------------------

struct NormDims {
  int64_t N, C;
};
NormDims check_norm(const Check& c, const Tensor& inp, const Tensor& weight) {
  c.floating(inp, "inp");
  c.floating(weight, "weight");
  DS_CHECK(inp.dim() >= 1, "{}: inp must be (N, C), got {}", c.op(), shape_str(inp.shape()));
  const NormDims d{rows_of(inp), inp.size(-1)};
  c.numel(weight, d.C, "weight", "C");
  return d;
}
// An optional (C) float vector: a bias or a weight/bias gradient.
void check_channels(const Check& c, const Tensor& t, int64_t C, const char* name) {
  if (!t.defined()) return;
  c.floating(t, name);
  c.numel(t, C, name, "C");
}
// dout (required) and dinp (optional) of a norm backward: the shape of inp.
void check_norm_grads(const Check& c, const Tensor& dout, const Tensor& dinp, const Tensor& inp) {
  c.floating(dout, "dout");
  c.same_shape(dout, inp, "dout", "inp");
  if (!dinp.defined()) return;
  c.floating(dinp, "dinp");
  c.same_shape(dinp, inp, "dinp", "inp");
}

// ---- matmul ------------------------------------------------------------------

struct MatmulDims {
  int64_t N, C, OC;
};
MatmulDims check_matmul(const Check& c, const Tensor& inp, const Tensor& weight, const Tensor& out,
                        const char* out_name, const char* inp_name = "inp") {
  c.floating(inp, inp_name);
  c.floating(weight, "weight");
  c.floating(out, out_name);
  DS_CHECK(weight.dim() == 2, "{}: weight must be (OC, C), got {}", c.op(), shape_str(weight.shape()));
  const MatmulDims d{rows_of(inp), weight.size(1), weight.size(0)};
  DS_CHECK(inp.dim() >= 1 && inp.size(-1) == d.C, "{}: {} has shape {}, expected (N, {}) for weight {}",
           c.op(), inp_name, shape_str(inp.shape()), d.C, shape_str(weight.shape()));
  DS_CHECK(out.dim() >= 1 && out.size(-1) == d.OC && rows_of(out) == d.N,
           "{}: {} has shape {}, expected (N={}, OC={})", c.op(), out_name, shape_str(out.shape()),
           d.N, d.OC);
  return d;
}

// ---- dropout -------------------------------------------------------------------

// key: the args' dropout_key, the per-step part of the key in the op's memory
// (its device is checked with the other tensors'); the spec's step_key is the
// op layer's pointer into it (lib/ops/ops.cpp), never a caller's.
void check_dropout(const Check& c, const DropoutSpec& d, const Tensor& key) {
  DS_CHECK(d.p >= 0.f && d.p < 1.f, "{}: dropout probability {} is not in [0, 1)", c.op(), d.p);
  DS_CHECK(d.sample0 >= 0 && d.pos0 >= 0 && d.head0 >= 0, "{}: dropout offsets (sample {}, position {}, head {}) "
           "must be >= 0", c.op(), d.sample0, d.pos0, d.head0);
  const int64_t* expect = key.defined() ? key.data<int64_t>() : nullptr;
  DS_CHECK(d.step_key == expect, "{}: dropout.step_key is set but not from tensor 'dropout_key'; pass the "
           "per-step key as that tensor and leave the pointer null", c.op());
  if (!key.defined()) return;
  c.dtype(key, DType::I64, "dropout_key");
  c.numel(key, 2, "dropout_key", "{iteration, first sample}");
}

// ---- attention and rope: packed (B, T, (NH+2*NKV)*HS) ------------------------

struct QkvDims {
  int64_t B, T, NH, NKV, HS;
};
QkvDims check_qkv(const Check& c, const Tensor& qkv, const char* name, int NH, int NKV) {
  c.floating(qkv, name);
  DS_CHECK(qkv.dim() == 3, "{}: {} must be (B, T, (NH+2*NKV)*HS), got {}", c.op(), name,
           shape_str(qkv.shape()));
  const int nkv = NKV == 0 ? NH : NKV;
  DS_CHECK(NH > 0 && nkv > 0 && NH % nkv == 0, "{}: NH={} must be a positive multiple of NKV={}", c.op(), NH,
           nkv);
  DS_CHECK(qkv.size(2) % (NH + 2 * nkv) == 0 && qkv.size(2) > 0,
           "{}: {} last dim {} of {} is not (NH+2*NKV)*HS, NH={}, NKV={}", c.op(), name, qkv.size(2),
           shape_str(qkv.shape()), NH, nkv);
  return {qkv.size(0), qkv.size(1), NH, nkv, qkv.size(2) / (NH + 2 * nkv)};
}
void check_attention(const Check& c, const QkvDims& d, const Tensor& out, const Tensor& lse) {
  c.floating(out, "out");
  c.dtype(lse, DType::F32, "lse");
  const Shape want_out{d.B, d.T, d.NH * d.HS}, want_lse{d.B, d.NH, d.T};
  DS_CHECK(out.shape() == want_out, "{}: out has shape {}, expected (B, T, NH*HS) = {}", c.op(),
           shape_str(out.shape()), shape_str(want_out));
  DS_CHECK(lse.shape() == want_lse, "{}: lse has shape {}, expected (B, NH, T) = {}", c.op(),
           shape_str(lse.shape()), shape_str(want_lse));
}
// Right-padding lengths (AttentionArgs::lengths): (B) i32, each in [1, T]
// (read where the host can: a CPU tensor).
void check_lengths(const Check& c, const QkvDims& d, const Tensor& lengths) {
  if (!lengths.defined()) return;
  c.dtype(lengths, DType::I32, "lengths");
  c.numel(lengths, d.B, "lengths", "(B)");
  if (!lengths.device().is_cpu()) return;
  for (int64_t b = 0; b < d.B; ++b) {
    const int32_t n = lengths.data<int32_t>()[b];
    DS_CHECK(n >= 1 && n <= d.T, "{}: lengths[{}] = {} is outside [1, T = {}]", c.op(), b, n, d.T);
  }
}

void check_rope(const Check& c, const RopeArgs& a) {
  c.devices(a);
  const QkvDims d = check_qkv(c, a.inp, "inp", a.NH, a.NKV);
  c.floating(a.out, "out");
  c.same_shape(a.out, a.inp, "out", "inp");
  const int64_t rot = a.rot_dims == 0 ? d.HS : a.rot_dims;
  DS_CHECK(rot > 0 && rot <= d.HS && rot % 2 == 0, "{}: rotary dims {} must be even and in (0, head size {}]",
           c.op(), rot, d.HS);
}

// ---- pointwise ---------------------------------------------------------------

void check_gelu(const Check& c, const GeluArgs& a, bool backward) {
  c.devices(a);
  const char* out = backward ? "dinp (out)" : "out";
  c.floating(a.inp, "inp");
  c.floating(a.out, out);
  c.numel(a.out, a.inp.numel(), out, "numel(inp)");
  if (!backward) return;
  c.floating(a.dout, "dout");
  c.numel(a.dout, a.inp.numel(), "dout", "numel(inp)");
}
// inp (N, 2F) for out/dout (N, F).
void check_swiglu(const Check& c, const Tensor& half, const char* half_name, const Tensor& inp) {
  c.floating(half, half_name);
  c.floating(inp, "inp");
  const int64_t F = half.dim() ? half.size(-1) : 1, N = rows_of(half);
  DS_CHECK(inp.dim() >= 1 && inp.size(-1) == 2 * F && rows_of(inp) == N,
           "{}: inp has shape {}, expected (N={}, 2F={}) for {} {}", c.op(), shape_str(inp.shape()),
           N, 2 * F, half_name, shape_str(half.shape()));
}

}  // namespace

void validate_embedding_forward(const EmbeddingArgs& a) {
  const Check c("embedding_forward");
  c.devices(a);
  check_embedding(c, a.out, "out", a.tokens, a.wte, "wte", a.wpe, "wpe", a.pos_offset, a.row_offset, a.lengths,
                  a.pad_row, a.shifts);
}

void validate_embedding_backward(const EmbeddingBwdArgs& a) {
  const Check c("embedding_backward");
  c.devices(a);
  check_embedding(c, a.dout, "dout", a.tokens, a.dwte, "dwte", a.dwpe, "dwpe", a.pos_offset, a.row_offset,
                  a.lengths, a.pad_row, a.shifts);
}

void validate_layernorm_forward(const LayerNormArgs& a) {
  const Check c("layernorm_forward");
  c.devices(a);
  const NormDims d = check_norm(c, a.inp, a.weight);
  check_channels(c, a.bias, d.C, "bias");
  c.floating(a.out, "out");
  c.same_shape(a.out, a.inp, "out", "inp");
  if (a.mean.defined()) c.stat(a.mean, d.N, "mean");
  if (a.rstd.defined()) c.stat(a.rstd, d.N, "rstd");
}

void validate_layernorm_backward(const LayerNormBwdArgs& a) {
  const Check c("layernorm_backward");
  c.devices(a);
  const NormDims d = check_norm(c, a.inp, a.weight);
  check_norm_grads(c, a.dout, a.dinp, a.inp);
  check_channels(c, a.dweight, d.C, "dweight");
  check_channels(c, a.dbias, d.C, "dbias");
  c.stat(a.mean, d.N, "mean");
  c.stat(a.rstd, d.N, "rstd");
}

void validate_rmsnorm_forward(const RMSNormArgs& a) {
  const Check c("rmsnorm_forward");
  c.devices(a);
  const NormDims d = check_norm(c, a.inp, a.weight);
  c.floating(a.out, "out");
  c.same_shape(a.out, a.inp, "out", "inp");
  if (a.rstd.defined()) c.stat(a.rstd, d.N, "rstd");
}

void validate_add_norm_forward(const AddNormArgs& a) {
  const Check c("add_norm_forward");
  c.devices(a);
  const NormDims d = check_norm(c, a.sum, a.weight);
  c.floating(a.out, "out");
  c.floating(a.a, "a");
  c.floating(a.b, "b");
  c.same_shape(a.out, a.sum, "out", "sum");
  c.numel(a.a, a.sum.numel(), "a", "numel(sum)");
  c.numel(a.b, a.sum.numel(), "b", "numel(sum)");
  if (a.norm == NormType::RMSNorm)
    DS_CHECK(!a.mean.defined() && !a.bias.defined(), "{}: RMSNorm takes no mean and no bias", c.op());
  check_channels(c, a.bias, d.C, "bias");
  if (a.mean.defined()) c.stat(a.mean, d.N, "mean");
  if (a.rstd.defined()) c.stat(a.rstd, d.N, "rstd");
}

void validate_rmsnorm_backward(const RMSNormBwdArgs& a) {
  const Check c("rmsnorm_backward");
  c.devices(a);
  const NormDims d = check_norm(c, a.inp, a.weight);
  check_norm_grads(c, a.dout, a.dinp, a.inp);
  check_channels(c, a.dweight, d.C, "dweight");
  c.stat(a.rstd, d.N, "rstd");
}

void validate_matmul_forward(const MatmulArgs& a) {
  const Check c("matmul_forward");
  c.devices(a);
  const MatmulDims d = check_matmul(c, a.inp, a.weight, a.out, "out");
  if (!a.bias.defined()) return;
  c.floating(a.bias, "bias");
  c.numel(a.bias, d.OC, "bias", "OC");
}

void validate_matmul_backward(const MatmulBwdArgs& a) {
  const Check c("matmul_backward");
  c.devices(a);
  const MatmulDims d = check_matmul(c, a.inp, a.weight, a.dout, "dout");
  if (a.dinp.defined()) {
    c.floating(a.dinp, "dinp");
    c.same_shape(a.dinp, a.inp, "dinp", "inp");
  }
  if (a.dweight.defined()) {
    c.floating(a.dweight, "dweight");
    c.same_shape(a.dweight, a.weight, "dweight", "weight");
  }
  if (a.dbias.defined()) {
    c.floating(a.dbias, "dbias");
    c.numel(a.dbias, d.OC, "dbias", "OC");
  }
}

void validate_matmul_bias_gelu_forward(const MatmulGeluArgs& a) {
  const Check c("matmul_bias_gelu_forward");
  c.devices(a);
  const MatmulDims d = check_matmul(c, a.inp, a.weight, a.pre, "pre");
  c.floating(a.out, "out");
  c.same_shape(a.out, a.pre, "out", "pre");
  if (!a.bias.defined()) return;
  c.floating(a.bias, "bias");
  c.numel(a.bias, d.OC, "bias", "OC");
}

// The GEMM is dinp (N, C) = dout (N, OC) @ weight (OC, C): check_matmul's
// roles with inp := pre (N, C) and out := dout (N, OC).
void validate_matmul_dgelu_bgrad(const MatmulDgeluArgs& a) {
  const Check c("matmul_dgelu_bgrad");
  c.devices(a);
  const MatmulDims d = check_matmul(c, a.pre, a.weight, a.dout, "dout", "pre");
  c.floating(a.dinp, "dinp");
  c.same_shape(a.dinp, a.pre, "dinp", "pre");
  if (!a.dbias.defined()) return;
  c.floating(a.dbias, "dbias");
  c.numel(a.dbias, d.C, "dbias", "C");
}

void validate_attention_forward(const AttentionArgs& a) {
  const Check c("attention_forward");
  c.devices(a);
  const QkvDims d = check_qkv(c, a.qkv, "qkv", a.NH, a.NKV);
  check_attention(c, d, a.out, a.lse);
  check_lengths(c, d, a.lengths);
  check_dropout(c, a.dropout, a.dropout_key);
}

void validate_attention_backward(const AttentionBwdArgs& a) {
  const Check c("attention_backward");
  c.devices(a);
  const QkvDims d = check_qkv(c, a.qkv, "qkv", a.NH, a.NKV);
  check_attention(c, d, a.out, a.lse);
  check_lengths(c, d, a.lengths);
  check_dropout(c, a.dropout, a.dropout_key);
  c.floating(a.dout, "dout");
  c.floating(a.dqkv, "dqkv");
  c.same_shape(a.dout, a.out, "dout", "out");
  c.same_shape(a.dqkv, a.qkv, "dqkv", "qkv");
}

void validate_kv_attention(const KvAttentionArgs& a) {
  const Check c("kv_attention");
  c.devices(a);
  const QkvDims d = check_qkv(c, a.qkv, "qkv", a.NH, a.NKV);
  c.floating(a.out, "out");
  c.floating(a.k_cache, "k_cache");
  c.floating(a.v_cache, "v_cache");
  c.dtype(a.pos, DType::I32, "pos");
  const Shape want_out{d.B, d.T, d.NH * d.HS};
  DS_CHECK(a.out.shape() == want_out, "kv_attention: out has shape {}, expected (B, Tq, NH*HS) = {}",
           shape_str(a.out.shape()), shape_str(want_out));
  DS_CHECK(a.k_cache.dim() == 3 && a.k_cache.size(0) == d.B && a.k_cache.size(2) == d.NKV * d.HS &&
               a.k_cache.size(1) >= d.T,
           "kv_attention: k_cache has shape {}, expected (B={}, Tmax >= {}, NKV*HS={})",
           shape_str(a.k_cache.shape()), d.B, d.T, d.NKV * d.HS);
  c.same_shape(a.v_cache, a.k_cache, "v_cache", "k_cache");
  c.numel(a.pos, d.B, "pos", "B");
}

void validate_rope_forward(const RopeArgs& a) { check_rope(Check("rope_forward"), a); }
void validate_rope_backward(const RopeArgs& a) { check_rope(Check("rope_backward"), a); }

void validate_gelu_forward(const GeluArgs& a) { check_gelu(Check("gelu_forward"), a, false); }
void validate_gelu_backward(const GeluArgs& a) { check_gelu(Check("gelu_backward"), a, true); }
void validate_relu_forward(const GeluArgs& a) { check_gelu(Check("relu_forward"), a, false); }
void validate_relu_backward(const GeluArgs& a) { check_gelu(Check("relu_backward"), a, true); }

void validate_swiglu_forward(const SwigluArgs& a) {
  const Check c("swiglu_forward");
  c.devices(a);
  check_swiglu(c, a.out, "out", a.inp);
}

void validate_swiglu_backward(const SwigluBwdArgs& a) {
  const Check c("swiglu_backward");
  c.devices(a);
  check_swiglu(c, a.dout, "dout", a.inp);
  c.floating(a.dinp, "dinp");
  c.same_shape(a.dinp, a.inp, "dinp", "inp");
}

void validate_add(const AddArgs& a) {
  const Check c("add");
  c.devices(a);
  c.floating(a.out, "out");
  c.floating(a.a, "a");
  c.floating(a.b, "b");
  c.numel(a.a, a.out.numel(), "a", "numel(out)");
  c.numel(a.b, a.out.numel(), "b", "numel(out)");
}

namespace {

// (B, T, C) tensors: the key needs the sample and position of every row.
void check_dropout_op(const Check& c, const DropoutArgs& a, bool backward) {
  c.devices(a);
  c.floating(a.out, "out");
  c.floating(a.inp, "inp");
  DS_CHECK(a.inp.dim() == 3, "{}: tensor 'inp' must be (B, T, C), got {}", c.op(), shape_str(a.inp.shape()));
  c.same_shape(a.out, a.inp, "out", "inp");
  if (backward)
    DS_CHECK(!a.residual.defined(), "{}: tensor 'residual' must be undefined (the backward is dropout alone)", c.op());
  else if (a.residual.defined())
    c.floating(a.residual, "residual"), c.same_shape(a.residual, a.inp, "residual", "inp");
  check_dropout(c, a.dropout, a.dropout_key);
}

}  // namespace

void validate_dropout_forward(const DropoutArgs& a) { check_dropout_op(Check("dropout_forward"), a, false); }
void validate_dropout_backward(const DropoutArgs& a) { check_dropout_op(Check("dropout_backward"), a, true); }

void validate_cross_entropy(const CrossEntropyArgs& a) {
  const Check c("cross_entropy");
  c.devices(a);
  c.floating(a.logits, "logits");
  DS_CHECK(a.logits.dim() >= 1, "{}: logits must be (N, Vp), got {}", c.op(),
           shape_str(a.logits.shape()));
  const int64_t Vp = a.logits.size(-1), N = rows_of(a.logits);
  DS_CHECK(a.V > 0 && a.V <= Vp, "{}: V={} must be in [1, Vp={}] for logits {}", c.op(), a.V, Vp,
           shape_str(a.logits.shape()));
  c.stat(a.losses, N, "losses");
  c.dtype(a.targets, DType::I32, "targets");
  c.numel(a.targets, N, "targets", "N");
  if (a.dloss_scale.defined()) c.stat(a.dloss_scale, 1, "dloss_scale", "1");
  if (!a.dlogits.defined()) return;
  c.floating(a.dlogits, "dlogits");
  c.same_shape(a.dlogits, a.logits, "dlogits", "logits");
}

void validate_kd_loss(const KdLossArgs& a) {
  const Check c("kd_loss");
  c.devices(a);
  c.floating(a.logits, "logits");
  DS_CHECK(a.logits.dim() >= 1, "{}: logits must be (N, Vp), got {}", c.op(), shape_str(a.logits.shape()));
  const int64_t Vp = a.logits.size(-1), N = rows_of(a.logits);
  DS_CHECK(a.V > 0 && a.V <= Vp, "{}: V={} must be in [1, Vp={}] for logits {}", c.op(), a.V, Vp,
           shape_str(a.logits.shape()));
  DS_CHECK(std::isfinite(a.temp) && a.temp > 0, "{}: temp must be positive, got {}", c.op(), a.temp);
  c.floating(a.teacher, "teacher");
  c.same_shape(a.teacher, a.logits, "teacher", "logits");
  c.stat(a.losses, N, "losses");
  if (!a.dlogits.defined()) return;
  c.floating(a.dlogits, "dlogits");
  c.same_shape(a.dlogits, a.logits, "dlogits", "logits");
  DS_CHECK(a.dlogits.raw() != a.logits.raw(), "{}: dlogits may alias teacher, not logits", c.op());
}

void validate_vocab_parallel_cross_entropy(const VocabParallelCEArgs& a) {
  const Check c("vocab_parallel_cross_entropy");
  c.devices(a);
  c.floating(a.logits, "logits");
  DS_CHECK(a.logits.dim() >= 1, "{}: logits must be (N, Vl), got {}", c.op(),
           shape_str(a.logits.shape()));
  const int64_t N = rows_of(a.logits);
  DS_CHECK(a.V > 0 && a.vocab_start >= 0, "{}: V={} vocab_start={} invalid", c.op(), a.V,
           a.vocab_start);
  c.dtype(a.targets, DType::I32, "targets");
  c.numel(a.targets, N, "targets", "N");
  c.stat(a.rowmax, N, "rowmax");
  if (a.phase != VocabCEPhase::Max) c.stat(a.stats, 2 * N, "stats", "2*N");
  if (a.phase != VocabCEPhase::Finish) return;
  c.stat(a.losses, N, "losses");
  if (!a.dlogits.defined()) return;
  c.floating(a.dlogits, "dlogits");
  c.same_shape(a.dlogits, a.logits, "dlogits", "logits");
}

void validate_adamw_step(const AdamWArgs& a) {
  const Check c("adamw_step");
  c.devices(a);
  c.dtype(a.param, DType::F32, "param");
  const int64_t n = a.param.numel();
  c.floating(a.grad, "grad");
  c.numel(a.grad, n, "grad", "numel(param)");
  c.stat(a.m, n, "m", "numel(param)");
  c.stat(a.v, n, "v", "numel(param)");
  DS_CHECK(a.step >= 1, "{}: step must be >= 1 (1-based), got {}", c.op(), a.step);
  if (a.segments.defined()) {
    DS_CHECK(a.segments.dtype() == DType::I64 && a.segments.dim() == 2 && a.segments.size(1) == 3,
             "{}: segments must be i64 (S, 3) rows {{begin, end, decay}}, got {} {}", c.op(),
             dtype_name(a.segments.dtype()), shape_str(a.segments.shape()));
    if (a.segments.device().is_cpu()) {  // device tables were checked when built on the host
      const int64_t* s = a.segments.data<int64_t>();
      for (int64_t i = 0, prev = 0; i < a.segments.size(0); prev = s[3 * i + 1], ++i)
        DS_CHECK(prev <= s[3 * i] && s[3 * i] <= s[3 * i + 1] && s[3 * i + 1] <= n,
                 "{}: segment {} [{}, {}) is not sorted, disjoint and inside [0, {})", c.op(), i,
                 s[3 * i], s[3 * i + 1], n);
    }
  }
  if (a.scalars.defined()) c.stat(a.scalars, AdamWSlot::Count, "scalars", "AdamWSlot::Count");
  if (!a.param_lowp.defined()) return;
  c.floating(a.param_lowp, "param_lowp");
  c.numel(a.param_lowp, n, "param_lowp", "numel(param)");
}

void validate_optim_step(const OptimStepArgs& a) {
  const Check c("optim_step");
  c.devices(a);
  c.dtype(a.param, DType::F32, "param");
  const int64_t n = a.param.numel();
  const OptimRule r = a.rule;
  const bool zero_one = r == OptimRule::ZeroOneUnwind || r == OptimRule::ZeroOneSync;
  const bool lamb1 = r == OptimRule::OneBitLambMomentum, lamb2 = r == OptimRule::OneBitLambFresh;
  if (r == OptimRule::LambApply || r == OptimRule::OneBitApply || zero_one || lamb2) {
    DS_CHECK(!a.grad.defined(), "{}: rule {} takes no gradient", c.op(), static_cast<int>(r));
  } else {
    c.floating(a.grad, "grad");
    c.numel(a.grad, n, "grad", "numel(param)");
  }
  const bool two = r == OptimRule::AdamL2 || r == OptimRule::AdamW || r == OptimRule::LambMoments ||
                   r == OptimRule::LambApply || r == OptimRule::OneBitMoments || r == OptimRule::OneBitApply ||
                   zero_one || lamb2;
  const bool one = two || r == OptimRule::Adagrad || r == OptimRule::Lion || r == OptimRule::OneBitMomentum ||
                   lamb1 || (r == OptimRule::Sgd && a.t.momentum != 0.f);
  DS_CHECK(one == a.s1.defined() && two == a.s2.defined(), "{}: rule {} takes {} state tensors", c.op(),
           static_cast<int>(r), two ? 2 : one ? 1 : 0);
  if (one) c.stat(a.s1, n, "s1", "numel(param)");
  if (two) c.stat(a.s2, n, "s2", "numel(param)");
  DS_CHECK(zero_one || lamb2 ? a.s3.defined() : (!a.s3.defined() || r == OptimRule::OneBitApply),
           "{}: rule {} {} the state s3", c.op(), static_cast<int>(r), zero_one || lamb2 ? "needs" : "takes no");
  if (a.s3.defined()) c.stat(a.s3, n, "s3", "numel(param)");
  DS_CHECK(a.prev.defined() == (lamb1 || lamb2), "{}: rule {} {} the momentum before the step (prev)", c.op(),
           static_cast<int>(r), lamb1 || lamb2 ? "needs" : "takes no");
  if (a.prev.defined()) c.stat(a.prev, n, "prev", "numel(param)");
  DS_CHECK(a.segments.defined() && a.segments.dtype() == DType::I64 && a.segments.dim() == 2 &&
               a.segments.size(1) == 3,
           "{}: segments must be i64 (S, 3) rows {{begin, end, decay}}", c.op());
  const int64_t S = a.segments.size(0);
  if (a.segments.device().is_cpu()) {
    const int64_t* s = a.segments.data<int64_t>();
    for (int64_t i = 0, prev = 0; i < S; prev = s[3 * i + 1], ++i)
      DS_CHECK(prev <= s[3 * i] && s[3 * i] <= s[3 * i + 1] && s[3 * i + 1] <= n,
               "{}: segment {} [{}, {}) is not sorted, disjoint and inside [0, {})", c.op(), i, s[3 * i],
               s[3 * i + 1], n);
  }
  if (r == OptimRule::LambMoments) {
    DS_CHECK(a.seg_stats.defined() && a.seg_stats.dtype() == DType::F32 && a.seg_stats.numel() == 2 * S,
             "{}: LambMoments writes seg_stats (S, 2) f32, S = {}", c.op(), S);
    DS_CHECK(!a.param_lowp.defined(), "{}: LambMoments does not write param_lowp", c.op());
  } else if (r == OptimRule::LambApply || lamb1) {
    DS_CHECK(a.seg_stats.defined() && a.seg_stats.dtype() == DType::F32 && a.seg_stats.numel() == S,
             "{}: rule {} reads seg_stats (S) f32, S = {}", c.op(), static_cast<int>(r), S);
  } else if (lamb2) {
    DS_CHECK(a.seg_stats.defined() && a.seg_stats.dtype() == DType::F32 && a.seg_stats.numel() == 4 * S,
             "{}: OneBitLambFresh reads and writes seg_stats (S, 4) f32, S = {}", c.op(), S);
  } else {
    DS_CHECK(!a.seg_stats.defined(), "{}: seg_stats is for Lamb only", c.op());
  }
  DS_CHECK(!(lamb1 || lamb2) || !a.param_lowp.defined(), "{}: rule {} does not write param_lowp", c.op(),
           static_cast<int>(r));
  if (!a.param_lowp.defined()) return;
  c.floating(a.param_lowp, "param_lowp");
  c.numel(a.param_lowp, n, "param_lowp", "numel(param)");
}

void validate_step_gate(const StepGateArgs& a) {
  const Check c("step_gate");
  c.devices(a);
  c.stat(a.scalars, AdamWSlot::Count, "scalars", "AdamWSlot::Count");
  c.stat(a.stats, 3, "stats", "3");
  DS_CHECK(a.loss_scale > 0, "{}: loss_scale must be > 0, got {}", c.op(), a.loss_scale);
}

void validate_sum_squares(const SumSquaresArgs& a) {
  const Check c("sum_squares");
  c.devices(a);
  c.stat(a.out, 1, "out", "1");
  c.floating(a.x, "x");
}

void validate_nonfinite_check(const NonFiniteArgs& a) {
  const Check c("nonfinite_check");
  c.devices(a);
  c.stat(a.flag, 1, "flag", "1");
  c.floating(a.x, "x");
}

void validate_onebit_pack(const OneBitPackArgs& a) {
  const Check c("onebit_pack");
  c.devices(a);
  c.dtype(a.x, DType::F32, "x");
  DS_CHECK(a.x.numel() % 8 == 0, "onebit_pack: x has {} elements, not a multiple of 8", a.x.numel());
  c.dtype(a.bits, DType::U8, "bits");
  c.numel(a.bits, a.x.numel() / 8, "bits", "numel(x) / 8");
  c.stat(a.scale, 1, "scale", "1");
  c.stat(a.sumsq, 1, "sumsq", "1");
}

void validate_onebit_server(const OneBitServerArgs& a) {
  const Check c("onebit_server");
  c.devices(a);
  c.dtype(a.x, DType::F32, "x");
  DS_CHECK(a.x.numel() % 8 == 0, "onebit_server: x has {} elements, not a multiple of 8", a.x.numel());
  c.dtype(a.scales, DType::F32, "scales");
  c.dtype(a.bits, DType::U8, "bits");
  c.numel(a.bits, a.scales.numel() * (a.x.numel() / 8), "bits", "numel(scales) * numel(x) / 8");
}

void validate_onebit_unpack(const OneBitUnpackArgs& a) {
  const Check c("onebit_unpack");
  c.devices(a);
  c.dtype(a.out, DType::F32, "out");
  c.dtype(a.bits, DType::U8, "bits");
  c.dtype(a.scales, DType::F32, "scales");
  DS_CHECK(a.chunk > 0, "onebit_unpack: chunk {} must be positive", a.chunk);
  DS_CHECK(a.bits.numel() * 8 >= a.out.numel() && a.scales.numel() * a.chunk >= a.out.numel(),
           "onebit_unpack: {} bytes of signs and {} scales of {} elements for {} elements", a.bits.numel(),
           a.scales.numel(), a.chunk, a.out.numel());
}

void validate_masked_mean(const MaskedMeanArgs& a) {
  const Check c("masked_mean");
  c.devices(a);
  c.stat(a.out, 1, "out", "1");
  c.dtype(a.losses, DType::F32, "losses");
  c.dtype(a.targets, DType::I32, "targets");
  c.numel(a.targets, a.losses.numel(), "targets", "numel(losses)");
}

void validate_scale(const ScaleArgs& a) {
  const Check c("scale");
  c.devices(a);
  c.floating(a.x, "x");
}

void validate_cast(const CastArgs& a) {
  const Check c("cast");
  c.devices(a);
  c.defined(a.out, "out");
  c.defined(a.inp, "inp");
  c.numel(a.out, a.inp.numel(), "out", "numel(inp)");
  const DType din = a.inp.dtype(), dout = a.out.dtype();
  DS_CHECK(din == dout || (is_float(din) && is_float(dout)),
           "{}: unsupported conversion {} -> {} (supported: f32/bf16/f16 between each other, "
           "same-dtype copies)", c.op(), dtype_name(din), dtype_name(dout));
}

// ---- Mixture of Experts ------------------------------------------------------

namespace {

// The (N, K) choice tensors (expert, slot: i32) of a MoE op; returns {N, K}.
struct MoeChoices {
  int64_t N, K;
};
MoeChoices check_moe_choices(const Check& c, const Tensor& expert, const Tensor& slot) {
  c.dtype(expert, DType::I32, "expert");
  DS_CHECK(expert.dim() == 2 && expert.size(1) >= 1, "{}: tensor 'expert' must be (N, K) with K >= 1, got {}",
           c.op(), shape_str(expert.shape()));
  const MoeChoices d{expert.size(0), expert.size(1)};
  DS_CHECK(d.N < (int64_t{1} << 31), "{}: N={} tokens exceed the i32 slot range", c.op(), d.N);
  c.dtype(slot, DType::I32, "slot");
  c.same_shape(slot, expert, "slot", "expert");
  return d;
}
// An (E, C, D) expert buffer with D = `D`; returns E.
int64_t check_moe_buffer(const Check& c, const Tensor& t, const char* name, int64_t D) {
  c.floating(t, name);
  DS_CHECK(t.dim() == 3 && t.size(2) == D, "{}: tensor '{}' has shape {}, expected (E, C, D={})", c.op(), name,
           shape_str(t.shape()), D);
  return t.size(0);
}
// An (N, D) token tensor with N rows; returns D.
int64_t check_moe_tokens(const Check& c, const Tensor& t, const char* name, int64_t N) {
  c.floating(t, name);
  DS_CHECK(t.dim() == 2 && t.size(0) == N, "{}: tensor '{}' has shape {}, expected (N={}, D)", c.op(), name,
           shape_str(t.shape()), N);
  return t.size(1);
}
// An (N, K) f32 tensor of combine weights or their gradient.
void check_moe_weight(const Check& c, const Tensor& t, const char* name, const Tensor& expert) {
  c.dtype(t, DType::F32, name);
  c.same_shape(t, expert, name, "expert");
}

}  // namespace

void validate_moe_gate_forward(const MoeGateArgs& a) {
  const Check c("moe_gate_forward");
  c.devices(a);
  c.dtype(a.logits, DType::F32, "logits");
  DS_CHECK(a.logits.dim() == 2 && a.logits.size(1) >= 1, "{}: tensor 'logits' must be (N, E), got {}", c.op(),
           shape_str(a.logits.shape()));
  const int64_t N = a.logits.size(0), E = a.logits.size(1);
  c.dtype(a.gates, DType::F32, "gates");
  c.same_shape(a.gates, a.logits, "gates", "logits");
  const MoeChoices d = check_moe_choices(c, a.expert, a.slot);
  DS_CHECK(d.N == N, "{}: tensor 'expert' has {} rows but 'logits' has N={}", c.op(), d.N, N);
  DS_CHECK(d.K <= E, "{}: K={} choices per token exceed E={} experts", c.op(), d.K, E);
  check_moe_weight(c, a.weight, "weight", a.expert);
  c.dtype(a.counts, DType::I32, "counts");
  c.numel(a.counts, E, "counts", "E");
  c.stat(a.aux, 1, "aux", "1");
  DS_CHECK(a.capacity >= 0, "{}: capacity={} must be >= 0 (0: dropless)", c.op(), a.capacity);
  DS_CHECK(a.seq >= 0 && (a.seq == 0 || a.logits.size(0) % a.seq == 0),
           "{}: seq={} must be 0 or divide the {} tokens", c.op(), a.seq, a.logits.size(0));
}

void validate_moe_gate_backward(const MoeGateBwdArgs& a) {
  const Check c("moe_gate_backward");
  c.devices(a);
  c.dtype(a.gates, DType::F32, "gates");
  DS_CHECK(a.gates.dim() == 2 && a.gates.size(1) >= 1, "{}: tensor 'gates' must be (N, E), got {}", c.op(),
           shape_str(a.gates.shape()));
  c.dtype(a.dlogits, DType::F32, "dlogits");
  c.same_shape(a.dlogits, a.gates, "dlogits", "gates");
  const MoeChoices d = check_moe_choices(c, a.expert, a.slot);
  DS_CHECK(d.N == a.gates.size(0), "{}: tensor 'expert' has {} rows but 'gates' has N={}", c.op(), d.N,
           a.gates.size(0));
  DS_CHECK(d.K <= a.gates.size(1), "{}: K={} choices per token exceed E={} experts", c.op(), d.K,
           a.gates.size(1));
  check_moe_weight(c, a.dweight, "dweight", a.expert);
}

void validate_moe_dispatch_forward(const MoeDispatchArgs& a) {
  const Check c("moe_dispatch_forward");
  c.devices(a);
  const MoeChoices d = check_moe_choices(c, a.expert, a.slot);
  const int64_t D = check_moe_tokens(c, a.inp, "inp", d.N);
  check_moe_buffer(c, a.out, "out", D);
}

void validate_moe_dispatch_backward(const MoeDispatchBwdArgs& a) {
  const Check c("moe_dispatch_backward");
  c.devices(a);
  const MoeChoices d = check_moe_choices(c, a.expert, a.slot);
  const int64_t D = check_moe_tokens(c, a.dinp, "dinp", d.N);
  check_moe_buffer(c, a.dout, "dout", D);
}

void validate_moe_combine_forward(const MoeCombineArgs& a) {
  const Check c("moe_combine_forward");
  c.devices(a);
  const MoeChoices d = check_moe_choices(c, a.expert, a.slot);
  const int64_t D = check_moe_tokens(c, a.out, "out", d.N);
  check_moe_buffer(c, a.inp, "inp", D);
  check_moe_weight(c, a.weight, "weight", a.expert);
}

void validate_moe_combine_backward(const MoeCombineBwdArgs& a) {
  const Check c("moe_combine_backward");
  c.devices(a);
  const MoeChoices d = check_moe_choices(c, a.expert, a.slot);
  const int64_t D = check_moe_tokens(c, a.dout, "dout", d.N);
  check_moe_buffer(c, a.inp, "inp", D);
  check_moe_buffer(c, a.dinp, "dinp", D);
  c.same_shape(a.dinp, a.inp, "dinp", "inp");
  check_moe_weight(c, a.weight, "weight", a.expert);
  check_moe_weight(c, a.dweight, "dweight", a.expert);
}

void validate_moe_mix_forward(const MoeMixArgs& a) {
  const Check c("moe_mix_forward");
  c.devices(a);
  const int64_t N = a.out.dim() == 2 ? a.out.size(0) : -1;
  check_moe_tokens(c, a.out, "out", N);
  c.same_shape(a.moe, a.out, "moe", "out");
  c.same_shape(a.mlp, a.out, "mlp", "out");
  c.floating(a.moe, "moe");
  c.floating(a.mlp, "mlp");
  c.dtype(a.coef, DType::F32, "coef");
  DS_CHECK(a.coef.dim() == 2 && a.coef.size(0) == N && a.coef.size(1) == 2,
           "{}: tensor 'coef' has shape {}, expected (N={}, 2)", c.op(), shape_str(a.coef.shape()), N);
}

void validate_moe_mix_backward(const MoeMixBwdArgs& a) {
  const Check c("moe_mix_backward");
  c.devices(a);
  const int64_t N = a.dout.dim() == 2 ? a.dout.size(0) : -1;
  check_moe_tokens(c, a.dout, "dout", N);
  for (const auto& [t, name] : {std::pair{&a.dmoe, "dmoe"}, {&a.dmlp, "dmlp"}, {&a.moe, "moe"}, {&a.mlp, "mlp"}}) {
    c.floating(*t, name);
    c.same_shape(*t, a.dout, name, "dout");
  }
  for (const auto& [t, name] : {std::pair{&a.coef, "coef"}, {&a.dcoef, "dcoef"}}) {
    c.dtype(*t, DType::F32, name);
    DS_CHECK(t->dim() == 2 && t->size(0) == N && t->size(1) == 2, "{}: tensor '{}' has shape {}, expected (N={}, 2)",
             c.op(), name, shape_str(t->shape()), N);
  }
}

void validate_act_quantize(const ActQuantArgs& a) {
  const Check c("act_quantize");
  c.devices(a);
  c.floating(a.x, "x");
  DS_CHECK(a.x.dim() >= 1, "{}: x must have at least one dimension", c.op());
  if (a.range.defined()) c.stat(a.range, 2, "range", "2");
  DS_CHECK(a.bits >= 1 && a.bits <= 16, "{}: bits={} must be in [1, 16]", c.op(), a.bits);
  DS_CHECK(a.momentum >= 0 && a.momentum < 1, "{}: momentum={} must be in [0, 1)", c.op(), a.momentum);
}

// Both directions of TokenRowsArgs; positions are range-checked where the
// index is on the host.
void check_token_rows(const Check& c, const TokenRowsArgs& a) {
  c.devices(a);
  c.floating(a.full, "full");
  c.floating(a.part, "part");
  c.dtype(a.index, DType::I32, "index");
  DS_CHECK(a.full.dim() == 3, "{}: tensor 'full' must be (B, T, C), got {}", c.op(), shape_str(a.full.shape()));
  const int64_t B = a.full.size(0), T = a.full.size(1), C = a.full.size(2);
  DS_CHECK(a.index.dim() == 2 && a.index.size(0) == B && a.index.size(1) <= T,
           "{}: tensor 'index' has shape {}, expected (B={}, R <= T={})", c.op(), shape_str(a.index.shape()), B, T);
  const int64_t R = a.index.size(1);
  DS_CHECK(a.part.shape() == Shape({B, R, C}) && a.part.dtype() == a.full.dtype(),
           "{}: tensor 'part' is {} {}, expected {} {}", c.op(), dtype_name(a.part.dtype()),
           shape_str(a.part.shape()), dtype_name(a.full.dtype()), shape_str({B, R, C}));
  if (!a.index.device().is_cpu()) return;
  const int32_t* ix = a.index.data<int32_t>();
  for (int64_t i = 0; i < B * R; ++i)
    DS_CHECK(ix[i] >= 0 && ix[i] < T, "{}: index {} at ({}, {}) is outside [0, {})", c.op(), ix[i], i / R, i % R, T);
}
void validate_token_gather(const TokenRowsArgs& a) { check_token_rows(Check("token_gather"), a); }
void validate_token_scatter(const TokenRowsArgs& a) { check_token_rows(Check("token_scatter"), a); }

void validate_moe_jitter(const MoeJitterArgs& a) {
  const Check c("moe_jitter");
  c.devices(a);
  check_moe_tokens(c, a.inp, "inp", a.inp.dim() == 2 ? a.inp.size(0) : -1);
  c.floating(a.out, "out");
  c.same_shape(a.out, a.inp, "out", "inp");
  DS_CHECK(a.eps >= 0.f && a.eps < 1.f, "{}: eps={} must be in [0, 1)", c.op(), a.eps);
}

}  // namespace ds::ops
