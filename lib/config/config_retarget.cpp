// A saved config and its layout: the parallel request of a config, the
// layout a checkpoint's resolved config was trained with, and that config
// re-targeted to another layout (dsgen, dsconvert). Every saved field that
// depends on the layout is named here and nowhere else.
#include <algorithm>
#include <limits>
#include <optional>

#include "lib/config/config_internal.h"
#include "lib/core/error.h"

namespace ds {

using nlohmann::json;

namespace {

constexpr int64_t kMaxBatch = int64_t{1} << 30;
constexpr int kMaxSize = 1 << 16;

// An integer field of the saved config in [lo, hi]; `fallback` when absent
// (no fallback: the field is required).
int64_t saved_int(const json& obj, const char* key, int64_t lo, int64_t hi, const std::string& where,
                  const char* path, std::optional<int64_t> fallback = std::nullopt) {
  auto it = obj.find(key);
  if (it == obj.end() && fallback) return *fallback;
  DS_USER_CHECK(it != obj.end() && it->is_number_integer() && it->get<int64_t>() >= lo && it->get<int64_t>() <= hi,
                "checkpoint file '{}/state.json': field 'config.{}{}' must be an integer in [{}, {}]", where, path,
                key, lo, hi);
  return it->get<int64_t>();
}

// Whether the model has an MoE layer, as MoeConfig::enabled for a valid
// config, but safe before validate_moe_model has checked the expert list
// against the layers (the layout is derived first).
bool has_moe_layers(const ModelConfig& m) {
  const MoeConfig& moe = m.moe;
  return moe.expert_interval >= 1 && m.num_layers >= moe.expert_interval &&
         std::any_of(moe.num_experts.begin(), moe.num_experts.end(), [](int e) { return e > 1; });
}

// The expert-parallel size of a saved model.moe section (1 without MoE layers).
int saved_ep(const json& moe, int num_layers, const std::string& where) {
  ModelConfig m;
  m.num_layers = num_layers;
  m.moe.expert_interval = static_cast<int>(saved_int(moe, "expert_interval", 1, 1 << 16, where, "model.moe.", 2));
  if (auto e = moe.find("num_experts"); e != moe.end()) {
    m.moe.num_experts.clear();
    for (const json& v : e->is_array() ? *e : json::array({*e}))
      m.moe.num_experts.push_back(v.is_number_integer() ? static_cast<int>(v.get<int64_t>()) : 1);
  }
  if (!has_moe_layers(m)) return 1;
  return static_cast<int>(saved_int(moe, "expert_parallel_size", 1, kMaxSize, where, "model.moe.", 1));
}

}  // namespace

ParallelRequest parallel_request(const ParallelConfig& p, const ModelConfig& m) {
  return {.tp = p.tp, .pp = p.pp, .ulysses = p.sp, .sequence_parallel = p.sequence_parallel,
          .layers_per_virtual_stage = p.num_layers_per_virtual_stage,
          .ep = has_moe_layers(m) ? m.moe.expert_parallel_size : 1};
}

json retarget_config(json c, const ParallelRequest& to, BatchOnRetarget batch) {
  DS_USER_CHECK(c.is_object(), "a saved config must be a JSON object");
  json& par = c["parallel"];
  if (!par.is_object()) par = json::object();
  par["tensor_model_parallel_size"] = to.tp;
  par["pipeline_model_parallel_size"] = to.pp;
  par["ds_sequence_parallel_size"] = to.ulysses;
  par["sequence_parallel"] = to.sequence_parallel;
  par["num_layers_per_virtual_pipeline_stage"] = to.layers_per_virtual_stage;
  if (auto m = c.find("model"); m != c.end() && m->is_object() && m->contains("moe") && (*m)["moe"].is_object())
    (*m)["moe"]["expert_parallel_size"] = to.ep;
  // A distilled student read back (dsgen, dsconvert, a teacher) runs without its teacher.
  if (auto t = c.find("training"); t != c.end() && t->is_object()) t->erase("distillation");
  // Where the saving job kept its optimizer state (host, an NVMe path of its
  // machines) is that job's placement: the re-targeted config keeps it in memory.
  if (auto z = c.find("zero_optimization"); z != c.end() && z->is_object()) z->erase("offload_optimizer");
  c.erase("aio");
  c.erase("sequence_parallel_size");  // DeepSpeed's spelling of the Ulysses degree (never in a resolved config)
  c.erase(kGas);  // re-derived for the new data-parallel size
  if (batch == BatchOnRetarget::Drop) c.erase(kTbs);
  return c;
}

TrainConfig retargeted_train_config(const json& saved, const ParallelRequest& to, int world, BatchOnRetarget batch) {
  return train_config_from_json(retarget_config(saved, to, batch), world);
}

ParallelLayout saved_parallel_layout(const json& c, const std::string& where) {
  DS_USER_CHECK(c.is_object(), "checkpoint file '{}/state.json': field 'config' must be an object", where);
  const int64_t tbs = saved_int(c, kTbs, 1, kMaxBatch, where, ""), mbs = saved_int(c, kMbs, 1, kMaxBatch, where, ""),
                gas = saved_int(c, kGas, 1, kMaxBatch, where, "");
  auto par = c.find("parallel");
  DS_USER_CHECK(par != c.end() && par->is_object(), "checkpoint file '{}/state.json': field 'config.parallel' must "
                "be an object", where);
  ParallelRequest r;
  r.tp = static_cast<int>(saved_int(*par, "tensor_model_parallel_size", 1, kMaxSize, where, "parallel.", 1));
  r.pp = static_cast<int>(saved_int(*par, "pipeline_model_parallel_size", 1, kMaxSize, where, "parallel.", 1));
  r.ulysses = static_cast<int>(saved_int(*par, "ds_sequence_parallel_size", 1, kMaxSize, where, "parallel.", 1));
  r.layers_per_virtual_stage =
      static_cast<int>(saved_int(*par, "num_layers_per_virtual_pipeline_stage", 0, kMaxSize, where, "parallel.", 0));
  auto sp = par->find("sequence_parallel");
  r.sequence_parallel = sp != par->end() && sp->is_boolean() && sp->get<bool>();
  const int64_t replica = int64_t{r.tp} * r.pp * r.ulysses;
  DS_USER_CHECK(tbs % (mbs * gas) == 0 && tbs / (mbs * gas) * replica <= std::numeric_limits<int>::max(),
                "checkpoint '{}': inconsistent batch sizes in its config ({} {}, {} {}, {} {})", where, kTbs, tbs, kMbs,
                mbs, kGas, gas);
  const int world = static_cast<int>(tbs / (mbs * gas) * replica);
  int layers = 0;
  int64_t seq = 0;
  if (auto m = c.find("model"); m != c.end() && m->is_object()) {
    layers = static_cast<int>(saved_int(*m, "num_layers", 0, 1 << 16, where, "model.", 0));
    seq = saved_int(*m, "seq_length", 0, int64_t{1} << 40, where, "model.", 0);
    if (auto moe = m->find("moe"); moe != m->end() && moe->is_object()) r.ep = saved_ep(*moe, layers, where);
  }
  return make_parallel_layout(r, world, layers, seq);
}

}  // namespace ds
