// Module matching for DeepSpeed Compression (compression.h).
#include "lib/train/compression.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "lib/core/dtype.h"
#include "lib/core/error.h"
#include "lib/core/log.h"

namespace ds {

namespace {

constexpr const char* kLinear[4] = {"self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                                    "mlp.dense_4h_to_h"};

}  // namespace

// (The word embedding is a VocabParallelEmbedding, which init_compression does not replace.)
std::vector<std::string> megatron_module_names(const ModelConfig& m) {
  std::vector<std::string> names;
  if (m.position != PositionKind::Rope) names.push_back("language_model.embedding.position_embeddings");
  for (int l = 0; l < m.num_layers; ++l)
    for (const char* lin : kLinear) names.push_back("language_model.encoder.layers." + std::to_string(l) + "." + lin);
  if (m.untie_embeddings) names.push_back("language_model.output_layer");
  return names;
}

namespace {

// Calls use(layer, linear 0-3, group index) for every layer linear layer a
// group's patterns pick (technique: the config key, for the messages).
template <class Group, class Use>
void match_modules(const ModelConfig& m, const std::vector<Group>& groups, const char* technique, Use&& use) {
  const std::vector<std::string> names = megatron_module_names(m);
  std::vector<std::string> claimed(names.size());
  const std::string where = std::string("compression_training.") + technique;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    for (const std::string& pattern : g.modules) {
      std::regex re;
      try {
        re = std::regex(pattern);
      } catch (const std::regex_error& e) {
        DS_USER_ERROR("config: {}.different_groups.{}.modules: '{}' is not a regular expression ({})", where, g.name,
                      pattern, e.what());
      }
      for (size_t i = 0; i < names.size(); ++i) {
        if (!std::regex_search(names[i], re)) continue;
        DS_USER_CHECK(claimed[i].empty() || claimed[i] == g.name,
                      "config: {}: {} is already added to compression by group '{}'; group '{}' claims it again (as "
                      "DeepSpeed, an error)", where, names[i], claimed[i], g.name);
        claimed[i] = g.name;
        const std::string& n = names[i];
        const std::string layers = "language_model.encoder.layers.";
        DS_USER_CHECK(n.rfind(layers, 0) == 0,
                      "config: {}.different_groups.{}.modules '{}' picks {}: dstrain compresses the linear layers of "
                      "the transformer layers only; narrow the pattern (e.g. 'encoder.layers')", where, g.name,
                      pattern, n);
        const size_t dot = n.find('.', layers.size());
        const int l = std::stoi(n.substr(layers.size(), dot - layers.size()));
        const std::string lin = n.substr(dot + 1);
        for (int k = 0; k < 4; ++k)
          if (lin == kLinear[k]) use(l, k, gi);
      }
    }
  }
}

constexpr const char* kWeight[4] = {"attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"};

float f16(float v) { return f16_to_f32(f32_to_f16(v)); }  // one f16 result
float round_even(float v) { return std::nearbyint(v); }

}  // namespace

ActivationQuantization activation_quantization(const TrainConfig& cfg) {
  const CompressionConfig& c = cfg.compression;
  ActivationQuantization q;
  if (!c.act_quant) return q;
  q.symmetric = c.act_symmetric;
  q.calibrate_static = c.act_static;
  q.bits.assign(static_cast<size_t>(cfg.model.num_layers), {0, 0, 0, 0});
  match_modules(cfg.model, c.act_groups, "activation_quantization", [&](int l, int k, size_t g) {
    q.bits[static_cast<size_t>(l)][k] = c.act_groups[g].bits;
  });
  return q;
}

WeightQuantizer::WeightQuantizer(const TrainConfig& cfg, const ModelLayout& layout) {
  const CompressionConfig& c = cfg.compression;
  groups_ = c.wq_groups;
  symmetric_ = c.wq_symmetric;
  verbose_ = c.wq_verbose;
  heads_ = cfg.model.num_heads;
  head_size_ = cfg.model.hidden_size / cfg.model.num_heads;
  if (!c.weight_quant) return;
  match_modules(cfg.model, c.wq_list, "weight_quantization", [&](int l, int k, size_t g) {
    const WeightQuantGroup& grp = c.wq_list[g];
    const ParamSpec& p = layout.find("layers." + std::to_string(l) + "." + kWeight[k]);
    DS_USER_CHECK(p.numel % groups_ == 0,
                  "compression_training.weight_quantization: quantize_groups {} does not divide the {} elements of {} "
                  "(DeepSpeed cuts each weight into that many equal groups)", groups_, p.numel, p.name);
    w_.push_back({.name = p.name, .offset = p.offset, .rows = p.shape[0], .cols = p.shape[1], .qkv = k == 0,
                  .bits = grp.start_bits, .target = grp.target_bits, .period = grp.period});
  });
  std::sort(w_.begin(), w_.end(), [](const Weight& a, const Weight& b) { return a.offset < b.offset; });
}

bool WeightQuantizer::quantized(const std::string& name) const {
  if (qsteps_ == 0) return false;
  for (const Weight& w : w_)
    if (w.name == name) return true;
  return false;
}

void WeightQuantizer::quantize(const Tensor& params) {
  DS_CHECK(params.dtype() == DType::F16 && params.device().is_cpu(), "MoQ: f16 host weights expected, got {}",
           dtype_name(params.dtype()));
  ++qsteps_;
  uint16_t* base = params.data<uint16_t>();
  std::vector<float> v;
  for (Weight& w : w_) {
    if (w.bits != w.target && qsteps_ >= w.period) {
      w.period <<= 1;
      w.bits -= 1;
      if (verbose_)
        DS_LOG("Quantization settings: current bit-precision = {}, step = {}, quantization period = {} ({})", w.bits,
               qsteps_, w.period, w.name);
    }
    // Megatron's order of the values: query_key_value holds each head's q, k
    // and v rows together, ours all q rows, then k, then v.
    const int64_t n = w.rows * w.cols;
    auto source_row = [&](int64_t r) {
      if (!w.qkv) return r;
      const int64_t h = r / (3 * head_size_), part = (r / head_size_) % 3, i = r % head_size_;
      return part * heads_ * head_size_ + h * head_size_ + i;
    };
    v.resize(static_cast<size_t>(n));
    uint16_t* x = base + w.offset;
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t col = 0; col < w.cols; ++col) v[r * w.cols + col] = f16_to_f32(x[source_row(r) * w.cols + col]);
    const float q = static_cast<float>(int64_t{1} << w.bits);
    const int64_t per = n / groups_;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups_; ++g) {
      float* y = v.data() + g * per;
      float lo = y[0], hi = y[0];
      for (int64_t i = 1; i < per; ++i) lo = std::min(lo, y[i]), hi = std::max(hi, y[i]);
      if (symmetric_) {
        const float scale = f16(f16(2.f * std::max(std::fabs(lo), std::fabs(hi))) / q);
        for (int64_t i = 0; i < per; ++i)
          y[i] = f16(std::clamp(round_even(f16(y[i] / scale)), -q / 2, q / 2 - 1) * scale);
      } else {
        const float scale = f16(f16(hi - lo) / q);
        const float zp = f16(round_even(f16(lo / scale)) * scale);
        for (int64_t i = 0; i < per; ++i)
          y[i] = f16(f16(std::clamp(round_even(f16(f16(y[i] - zp) / scale)), 0.f, q - 1) * scale) + zp);
      }
    }
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t col = 0; col < w.cols; ++col) x[source_row(r) * w.cols + col] = f32_to_f16(v[r * w.cols + col]);
  }
}

}  // namespace ds
