// Checkpoint reshaping: full optimizer state from any (TP, PP, DP/ZeRO)
// layout's shards, sliced for any other; offline rewriting for dsconvert.
#include "lib/ckpt/reshape.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "lib/model/tp_shard.h"
#include "lib/parallel/zero_partition.h"

namespace fs = std::filesystem;

namespace ds {
namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  DS_USER_CHECK(f.good(), "checkpoint: cannot read '{}'", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Calls fn(full_off, local_off, count) for each contiguous run of local
// weight p (tp rank r of tp) inside its full weight. The same runs as
// lib/model/tp_shard.cpp uses to slice and gather parameters.
template <class Fn>
void for_each_run(const ParamSpec& p, int tp, int r, Fn fn) {
  if (p.split == TpSplit::Replicated || tp == 1) return fn(int64_t{0}, int64_t{0}, p.numel);
  const int64_t rows = p.full_shape[0];
  const int64_t inner = shape_numel(p.full_shape) / rows;
  if (p.split == TpSplit::Rows) {
    const int64_t block = rows / p.split_groups, local = block / tp;
    for (int g = 0; g < p.split_groups; ++g) fn((g * block + r * local) * inner, g * local * inner, local * inner);
    return;
  }
  const int64_t cols = p.full_shape[1], lc = cols / tp;
  for (int64_t i = 0; i < rows; ++i) fn(i * cols + r * lc, i * lc, lc);
}

// full (full.total) <- local (local.total) at local's tp rank and stage. A
// tied wte on a later stage is skipped: the first stage's copy is the one.
void place_local(const ModelLayout& local, const ModelLayout& full, const float* src, float* dst) {
  for (const ParamSpec& p : local.params) {
    if (!local.first_stage() && p.name == "embed.wte") continue;
    const ParamSpec& f = full.find(p.name);
    for_each_run(p, local.tp, local.tp_rank, [&](int64_t fo, int64_t lo, int64_t n) {
      std::memcpy(dst + f.offset + fo, src + p.offset + lo, n * sizeof(float));
    });
  }
}

// Only dim 0 of the vocabulary-parallel weights may differ between two full
// layouts of the same model (Megatron pads the vocabulary per TP size).
bool same_but_vocab(const ParamSpec& a, const ParamSpec& b) {
  if (a.name != b.name || a.shape.size() != b.shape.size()) return false;
  if (a.shape == b.shape) return true;
  if (a.name != "embed.wte" && a.name != "head.weight") return false;
  return std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
}

}  // namespace

std::string find_step_dir(const std::string& dir, const std::string& tag) {
  DS_USER_CHECK(fs::is_directory(dir), "checkpoint: '{}' is not a directory", dir);
  std::string t = tag;
  if (t.empty()) {
    fs::path latest = fs::path(dir) / "latest";
    if (!fs::exists(latest)) return "";
    t = read_text(latest);
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    DS_USER_CHECK(fs::is_directory(fs::path(dir) / t), "checkpoint: '{}' names '{}', which does not exist",
                  latest.string(), t);
  }
  fs::path step = fs::path(dir) / t;
  DS_USER_CHECK(fs::is_directory(step), "checkpoint: '{}' does not exist", step.string());
  return step.string();
}

nlohmann::json read_step_state(const fs::path& step) {
  try {
    return nlohmann::json::parse(read_text(step / "state.json"));
  } catch (const nlohmann::json::exception& e) {
    DS_USER_ERROR("checkpoint '{}': state.json is corrupt: {}", step.string(), e.what());
  }
}

TrainState read_train_state(const nlohmann::json& j) {
  TrainState st;
  st.iteration = j.at("iteration").get<int64_t>();
  st.consumed_samples = j.at("consumed_samples").get<int64_t>();
  st.skipped_steps = j.at("skipped_steps").get<int64_t>();
  st.loss_scale = j.at("loss_scale").get<double>();
  st.good_steps = j.at("good_steps").get<int64_t>();
  st.hysteresis_left = j.at("hysteresis_left").get<int64_t>();
  return st;
}

SavedStep open_saved_step(const std::string& step_dir, const ModelConfig& model) {
  SavedStep s;
  s.dir = step_dir;
  s.state = read_step_state(s.dir);
  const std::string where = s.dir.string();
  try {
    s.tp = s.state.value("tensor_model_parallel_size", 1);
    s.shards = s.state.at("optimizer_shards").get<int>();
    const nlohmann::json& saved = s.state.at("layout");
    DS_USER_CHECK(saved.is_array() && !saved.empty(), "checkpoint '{}': state.json has no layout", where);
    s.pp = s.state.value("pipeline_model_parallel_size", 1);
    s.vp = s.state.value("virtual_pipeline_stages", 1);
    s.model = model;
    for (const auto& w : saved)  // the saved padded vocabulary: rows of embed.wte
      if (w[0].get<std::string>() == "embed.wte") s.model.padded_vocab_size = static_cast<int>(w[1][0].get<int64_t>());
    s.full = build_layout(s.model);
    DS_USER_CHECK(saved.size() == s.full.params.size(),
                  "checkpoint '{}': it has {} weights, the configured model has {} (different model config?)", where,
                  saved.size(), s.full.params.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      const ParamSpec& p = s.full.params[i];
      std::string name = saved[i][0].get<std::string>();
      Shape shape = saved[i][1].get<Shape>();
      DS_USER_CHECK(name == p.name && shape == p.shape,
                    "checkpoint '{}': weight {} is {} {}, the configured model expects {} {} (different model "
                    "config?)",
                    where, i, name, shape_str(shape), p.name, shape_str(p.shape));
    }
  } catch (const nlohmann::json::exception& e) {
    DS_USER_ERROR("checkpoint '{}': state.json is incomplete: {}", where, e.what());
  }
  DS_USER_CHECK(s.tp >= 1 && s.pp >= 1 && s.vp >= 1 && s.shards >= 1,
                "checkpoint '{}': tensor_model_parallel_size {} / pipeline_model_parallel_size {} / "
                "virtual_pipeline_stages {} / optimizer_shards {}",
                where, s.tp, s.pp, s.vp, s.shards);
  DS_USER_CHECK(s.model.num_layers % (s.pp * s.vp) == 0,
                "checkpoint '{}': {} layers do not split into {} pipeline stages x {} virtual stages", where,
                s.model.num_layers, s.pp, s.vp);
  return s;
}

Tensor adapt_full(const ModelLayout& from, const ModelLayout& to, const Tensor& buf) {
  Tensor out = Tensor::zeros({to.total}, DType::F32);
  const float* src = buf.data<float>();  // (from.total)
  float* dst = out.data<float>();        // (to.total)
  for (const ParamSpec& t : to.params) {
    const ParamSpec* f = from.try_find(t.name);
    DS_USER_CHECK(f && same_but_vocab(*f, t), "checkpoint: weight '{}' is {}, the configured model expects {}",
                  t.name, f ? shape_str(f->shape) : std::string("missing"), shape_str(t.shape));
    std::memcpy(dst + t.offset, src + f->offset, std::min(f->numel, t.numel) * sizeof(float));
  }
  return out;
}

Tensor read_full_params(const SavedStep& s, const ModelLayout& target_full) {
  const fs::path file = s.dir / "model.safetensors";
  SafetensorsFile model = SafetensorsFile::open(file.string());
  Tensor saved = Tensor::empty({s.full.total}, DType::F32);
  for (const ParamSpec& p : s.full.params) {
    DS_USER_CHECK(model.has(p.name) && model.shape(p.name) == p.shape && model.dtype(p.name) == DType::F32,
                  "checkpoint '{}': model.safetensors lacks f32 weight '{}' {}", s.dir.string(), p.name,
                  shape_str(p.shape));
    saved.view(p.offset, p.shape).copy_from(model.get(p.name));
  }
  return adapt_full(s.full, target_full, saved);
}

int64_t read_moment_range(const fs::path& step, int shards, int tp, int tp_rank, int64_t local_total, int64_t begin,
                          int64_t end, Tensor& m, Tensor& v, int pp, int pp_rank) {
  m = Tensor::zeros({end - begin}, DType::F32);
  v = Tensor::zeros({end - begin}, DType::F32);
  int64_t covered = 0, opt_step = 0;
  for (int r = 0; r < shards; ++r) {
    fs::path f = step / optimizer_shard_name(r, shards, tp, tp_rank, pp, pp_rank);
    DS_USER_CHECK(fs::exists(f), "checkpoint '{}': optimizer shard '{}' is missing", step.string(),
                  f.filename().string());
    SafetensorsFile sf = SafetensorsFile::open(f.string());
    auto meta = sf.metadata();
    DS_USER_CHECK(meta.count("begin") && meta.count("end") && meta.count("total") && meta.count("step"),
                  "checkpoint '{}': optimizer shard metadata is incomplete", f.string());
    int64_t b = std::stoll(meta.at("begin")), e = std::stoll(meta.at("end"));
    DS_USER_CHECK(std::stoll(meta.at("total")) == local_total,
                  "checkpoint '{}': optimizer shard for {} parameters, model has {}", f.string(), meta.at("total"),
                  local_total);
    opt_step = std::stoll(meta.at("step"));
    int64_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo >= hi) continue;
    Tensor sm = sf.get("exp_avg"), sv = sf.get("exp_avg_sq");
    DS_USER_CHECK(sm.numel() == e - b && sv.numel() == e - b, "checkpoint '{}': shard size does not match its range",
                  f.string());
    std::copy_n(sm.data<float>() + (lo - b), hi - lo, m.data<float>() + (lo - begin));
    std::copy_n(sv.data<float>() + (lo - b), hi - lo, v.data<float>() + (lo - begin));
    covered += hi - lo;
  }
  DS_USER_CHECK(covered == end - begin, "checkpoint '{}': optimizer shards cover {} of {} elements", step.string(),
                covered, end - begin);
  return opt_step;
}

FullMoments assemble_full_moments(const SavedStep& s) {
  FullMoments f;
  f.m = Tensor::zeros({s.full.total}, DType::F32);
  f.v = Tensor::zeros({s.full.total}, DType::F32);
  for (int pr = 0; pr < s.pp; ++pr) {
    for (int r = 0; r < s.tp; ++r) {  // one source (stage, tp rank)'s local moments at a time
      const ModelLayout local = build_layout(s.model, s.tp, r, s.pp, pr, s.vp);
      Tensor m, v;
      f.step = read_moment_range(s.dir, s.shards, s.tp, r, local.total, 0, local.total, m, v, s.pp, pr);
      place_local(local, s.full, m.data<float>(), f.m.data<float>());
      place_local(local, s.full, v.data<float>(), f.v.data<float>());
    }
  }
  return f;
}

void read_reshaped(const SavedStep& s, const CheckpointData& d, Tensor& params, Tensor& m, Tensor& v,
                   int64_t& opt_step) {
  DS_CHECK(d.model != nullptr, "read_reshaped needs the model config");
  const ModelLayout& full = *d.layout;
  const ModelLayout& local = d.opt_layout ? *d.opt_layout : full;  // the target stage's tp-rank layout
  params = read_full_params(s, full);
  FullMoments fm = assemble_full_moments(s);
  opt_step = fm.step;
  const int64_t n = d.opt_end - d.opt_begin;
  m = Tensor::empty({n}, DType::F32);
  v = Tensor::empty({n}, DType::F32);
  Tensor local_buf = Tensor::empty({local.total}, DType::F32);
  for (auto [src, dst] : {std::pair{&fm.m, &m}, std::pair{&fm.v, &v}}) {
    Tensor adapted = adapt_full(s.full, full, *src);
    *src = Tensor();  // release the saved-layout copy early
    slice_tp_params(local, full, adapted, local_buf);
    std::copy_n(local_buf.data<float>() + d.opt_begin, n, dst->data<float>());
  }
}

namespace {

// Writes the optimizer shards of target (stage pr, tp rank tr): every ZeRO
// range of its local layout, cut from the full moments.
void write_target_rank(const std::string& out_dir, const TrainState& st, const ReshapeTarget& t,
                       const ModelLayout& full, const Tensor& params, const Tensor& m_full, const Tensor& v_full,
                       int64_t opt_step, int world, int pr, int tr) {
  const ModelLayout local = build_layout(t.model, t.tp, tr, t.pp, pr, t.vp);
  Tensor lm = Tensor::empty({local.total}, DType::F32), lv = Tensor::empty({local.total}, DType::F32);
  slice_tp_params(local, full, m_full, lm);
  slice_tp_params(local, full, v_full, lv);
  const ZeroPartition part = make_zero_partition(local.total, world);
  for (int r = 0; r < world; ++r) {
    const Range rg = world == 1 ? Range{0, local.total} : part.owned_real(r);
    CheckpointData d{&full, params, lm.view(rg.begin, {rg.size()}), lv.view(rg.begin, {rg.size()}),
                     rg.begin, rg.end, opt_step, r, world};
    d.opt_layout = &local;
    d.tp = t.tp;
    d.tp_rank = tr;
    d.pp = t.pp;
    d.pp_rank = pr;
    d.vp = t.vp;
    write_checkpoint_files(out_dir, st, d, t.config);
  }
}

}  // namespace

void write_reshaped(const SavedStep& s, const ReshapeTarget& t, const std::string& out_dir) {
  const ModelLayout full = build_layout(t.model);
  Tensor params = read_full_params(s, full);
  FullMoments fm = assemble_full_moments(s);
  Tensor m_full = adapt_full(s.full, full, fm.m), v_full = adapt_full(s.full, full, fm.v);
  const int64_t opt_step = fm.step;
  fm = FullMoments{};  // release the saved-layout copies
  const TrainState st = read_train_state(s.state);
  const int world = t.zero_stage >= 1 ? t.dp : 1;  // stage 0: one shard holds the whole (pp, tp) rank
  for (int pr = 0; pr < t.pp; ++pr)
    for (int tr = 0; tr < t.tp; ++tr) write_target_rank(out_dir, st, t, full, params, m_full, v_full, opt_step,
                                                        world, pr, tr);
  commit_checkpoint(out_dir, st.iteration);
}

}  // namespace ds
