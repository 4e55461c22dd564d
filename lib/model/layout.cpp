// Builds the flat parameter layout for GPT-2 and LLaMA style models.
// Order: embeddings, then each layer's weights contiguous (so a layer is one
// range: ZeRO-3 gathers and pipeline stages cut on layer boundaries), then the
// final norm and (if untied) the output head.
#include "lib/model/layout.h"

#include "lib/core/error.h"

namespace ds {

ModelDims model_dims(const ModelConfig& m) {
  ModelDims d;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.NH = m.num_heads;
  DS_USER_CHECK(d.NH > 0 && d.C % d.NH == 0, "model: hidden_size {} must be divisible by num_heads {}",
                d.C, d.NH);
  d.HS = d.C / d.NH;
  d.swiglu = m.activation == Activation::SwiGLU;
  d.F = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : (d.swiglu ? (4 * d.C * 2 / 3) / 64 * 64 : 4 * d.C);
  d.V = m.vocab_size;
  d.Vp = m.padded_vocab_size > 0 ? m.padded_vocab_size : m.vocab_size;
  d.maxT = m.max_position_embeddings;
  d.bias = m.bias;
  d.untied = m.untie_embeddings;
  d.rope = m.position == PositionKind::Rope;
  d.rmsnorm = m.norm == NormKind::RMSNorm;
  d.gpt2 = m.family == ModelFamily::GPT2;
  DS_USER_CHECK(d.V > 0 && d.Vp >= d.V, "model: vocab size {} / padded {} invalid", d.V, d.Vp);
  DS_USER_CHECK(!d.rope || d.HS % 2 == 0, "model: rope needs an even head size, got {}", d.HS);
  return d;
}

namespace {

struct Builder {
  ModelLayout out;
  void add(const std::string& name, Shape shape, int layer, bool decay, InitKind init) {
    ParamSpec p;
    p.name = name;
    p.shape = std::move(shape);
    p.numel = shape_numel(p.shape);
    p.offset = out.total;
    p.layer = layer;
    p.decay = decay;
    p.init = init;
    out.total += p.numel;
    out.params.push_back(std::move(p));
  }
};

}  // namespace

ModelLayout build_layout(const ModelConfig& m) {
  ModelDims d = model_dims(m);
  Builder b;
  int64_t C = d.C, F = d.F;
  b.add("embed.wte", {d.Vp, C}, -1, true, InitKind::Normal);
  if (!d.rope) b.add("embed.wpe", {d.maxT, C}, -1, true, InitKind::Normal);
  for (int l = 0; l < d.L; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    b.add(p + "norm1.weight", {C}, l, false, InitKind::Ones);
    if (!d.rmsnorm) b.add(p + "norm1.bias", {C}, l, false, InitKind::Zeros);
    b.add(p + "attn.qkv.weight", {3 * C, C}, l, true, InitKind::Normal);
    if (d.bias) b.add(p + "attn.qkv.bias", {3 * C}, l, false, InitKind::Zeros);
    b.add(p + "attn.proj.weight", {C, C}, l, true, InitKind::ScaledNormal);
    if (d.bias) b.add(p + "attn.proj.bias", {C}, l, false, InitKind::Zeros);
    b.add(p + "norm2.weight", {C}, l, false, InitKind::Ones);
    if (!d.rmsnorm) b.add(p + "norm2.bias", {C}, l, false, InitKind::Zeros);
    b.add(p + "mlp.fc.weight", {(d.swiglu ? 2 : 1) * F, C}, l, true, InitKind::Normal);
    if (d.bias) b.add(p + "mlp.fc.bias", {(d.swiglu ? 2 : 1) * F}, l, false, InitKind::Zeros);
    b.add(p + "mlp.proj.weight", {C, F}, l, true, InitKind::ScaledNormal);
    if (d.bias) b.add(p + "mlp.proj.bias", {C}, l, false, InitKind::Zeros);
  }
  b.add("final_norm.weight", {C}, d.L, false, InitKind::Ones);
  if (!d.rmsnorm) b.add("final_norm.bias", {C}, d.L, false, InitKind::Zeros);
  if (d.untied) b.add("head.weight", {d.Vp, C}, d.L, true, InitKind::Normal);
  return b.out;
}

int64_t count_parameters(const ModelConfig& m) { return build_layout(m).total; }

const ParamSpec* ModelLayout::try_find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamSpec& ModelLayout::find(const std::string& name) const {
  const ParamSpec* p = try_find(name);
  DS_CHECK(p != nullptr, "no parameter named '{}' in the model layout", name);
  return *p;
}

}  // namespace ds
