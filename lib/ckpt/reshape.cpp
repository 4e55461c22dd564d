// Checkpoint reshaping: a rank's optimizer range of any (TP, PP, EP, DP/ZeRO)
// layout read from the shards of any other, byte range by byte range; the
// full weights adapted to another padded vocabulary; offline rewriting for
// dsconvert (convert.cpp).
#include "lib/ckpt/reshape.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "lib/model/tp_shard.h"
#include "lib/parallel/zero_partition.h"

namespace fs = std::filesystem;

namespace ds {
namespace {

// Only dim 0 of the vocabulary-parallel weights may differ between two full
// layouts of the same model (Megatron pads the vocabulary per TP size).
bool same_but_vocab(const ParamSpec& a, const ParamSpec& b) {
  if (a.name != b.name || a.shape.size() != b.shape.size()) return false;
  if (a.shape == b.shape) return true;
  if (a.name != "embed.wte" && a.name != "head.weight") return false;
  return std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
}

}  // namespace

SavedStep open_saved_step(const std::string& step_dir, const ModelConfig& model) {
  return open_saved_step(step_dir, read_step_state(step_dir), model);
}

namespace {

// The value at `pointer` of the config a checkpoint was saved with (null when
// it is absent or no config was saved).
nlohmann::json saved_config(const StepState& state, const char* pointer) {
  return state.config.is_object() ? state.config.value(nlohmann::json::json_pointer(pointer), nlohmann::json())
                                  : nlohmann::json();
}

}  // namespace

void check_saved_vocab(const StepState& state, const ModelConfig& model, const std::string& where) {
  auto saved = [&](const char* pointer) { return saved_config(state, pointer); };
  const nlohmann::json v = saved("/model/vocab_size");
  DS_USER_CHECK(!(v.is_number_integer() && model.vocab_size > 0 && v.get<int64_t>() != model.vocab_size),
                "checkpoint '{}' was trained with a vocabulary of {} tokens, the configured tokenizer has {} "
                "(--vocab-file / --tokenizer-model): continue it with the tokenizer it was trained with", where,
                v.dump(), model.vocab_size);
  // The head counts do not show in the weight shapes (NH x HS = C): a
  // different split of the same matrices would load silently and mean nothing.
  const nlohmann::json nh = saved("/model/num_heads"), nkv = saved("/model/num_key_value_heads");
  const int kv = model.num_kv_heads > 0 ? model.num_kv_heads : model.num_heads;
  DS_USER_CHECK(!(nh.is_number_integer() && nh.get<int64_t>() != model.num_heads),
                "checkpoint '{}' has {} attention heads, the configured model {} (model.num_heads / "
                "--num-attention-heads): a checkpoint loads only into the model it was trained as", where, nh.dump(),
                model.num_heads);
  DS_USER_CHECK(!(nkv.is_number_integer() && nkv.get<int64_t>() > 0 && nkv.get<int64_t>() != kv),
                "checkpoint '{}' has {} key-value heads, the configured model {} (model.num_key_value_heads / "
                "--num-key-value-heads): a checkpoint loads only into the model it was trained as", where, nkv.dump(),
                kv);
}

bool saved_expert_tp(const StepState& state) {
  const nlohmann::json v = saved_config(state, "/model/moe/expert_tensor_parallelism");
  return v.is_boolean() && v.get<bool>();
}

SavedStep open_saved_step(const std::string& step_dir, StepState state, const ModelConfig& model) {
  SavedStep s;
  s.dir = step_dir;
  s.state = std::move(state);
  const std::string where = s.dir.string();
  s.sizes = s.state.sizes;
  s.shards = s.state.shards;
  s.model = model;
  s.model.moe.expert_tensor_parallelism = saved_expert_tp(s.state);  // the saved shards' layouts
  check_saved_vocab(s.state, model, where);
  for (const auto& [name, shape] : s.state.layout) {  // the saved padded vocabulary: rows of embed.wte
    if (name != "embed.wte") continue;
    DS_USER_CHECK(shape.size() == 2 && shape[0] <= std::numeric_limits<int>::max(),
                  "checkpoint '{}': state.json gives embed.wte the shape {}, expected (vocabulary, hidden)", where,
                  shape_str(shape));
    s.model.padded_vocab_size = static_cast<int>(shape[0]);
  }
  s.full = build_layout(s.model);
  const auto& saved = s.state.layout;
  DS_USER_CHECK(saved.size() == s.full.params.size(),
                "checkpoint '{}': it has {} weights, the configured model has {} (different model config?)", where,
                saved.size(), s.full.params.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    const ParamSpec& p = s.full.params[i];
    DS_USER_CHECK(saved[i].first == p.name && saved[i].second == p.shape,
                  "checkpoint '{}': weight {} is {} {}, the configured model expects {} {} (different model "
                  "config?)",
                  where, i, saved[i].first, shape_str(saved[i].second), p.name, shape_str(p.shape));
  }
  DS_USER_CHECK(s.model.num_layers % (s.sizes.pp * s.sizes.vp) == 0,
                "checkpoint '{}': {} layers do not split into {} pipeline stages x {} virtual stages", where,
                s.model.num_layers, s.sizes.pp, s.sizes.vp);
  return s;
}

namespace {

// model.safetensors of the step with every weight of s.full checked present.
SafetensorsFile open_model_file(const SavedStep& s) {
  const fs::path file = s.dir / "model.safetensors";
  SafetensorsFile model = SafetensorsFile::open(file.string());
  for (const ParamSpec& p : s.full.params)  // every weight is in the file before anything is allocated
    DS_USER_CHECK(model.has(p.name) && model.shape(p.name) == p.shape && model.dtype_string(p.name) == "F32",
                  "checkpoint file '{}' lacks F32 weight '{}' {}{}", file.string(), p.name, shape_str(p.shape),
                  model.has(p.name) ? fmt::format(" (it holds {} {})", model.dtype_string(p.name),
                                                  shape_str(model.shape(p.name)))
                                    : std::string());
  return model;
}

}  // namespace

SafetensorsFile open_saved_model(const SavedStep& s) {
  verify_step_file(s.dir, s.state, "model.safetensors", s.progress);
  return open_model_file(s);
}

SafetensorsFile open_saved_model_tracked(const SavedStep& s) {
  SafetensorsFile model = open_model_file(s);
  track_step_file(s.dir, s.state, "model.safetensors", model, s.progress);
  return model;
}

void verify_saved_model(const SavedStep& s, const SafetensorsFile& model) {
  verify_step_reads(s.dir, s.state, "model.safetensors", model);
}

namespace {

// How many elements of target_full's weight `name` the saved model holds (the
// rest are vocabulary rows it lacks); UserError when the shapes differ otherwise.
int64_t saved_elements(const SavedStep& s, const ModelLayout& target_full, const std::string& name) {
  const ParamSpec& t = target_full.find(name);
  const ParamSpec* f = s.full.try_find(name);
  DS_USER_CHECK(f && same_but_vocab(*f, t), "checkpoint: weight '{}' is {}, the configured model expects {}", name,
                f ? shape_str(f->shape) : std::string("missing"), shape_str(t.shape));
  return std::min(f->numel, t.numel);
}

}  // namespace

void read_full_weight(const SavedStep& s, const SafetensorsFile& model, const ModelLayout& target_full,
                      const std::string& name, float* out) {
  const ParamSpec& t = target_full.find(name);
  const int64_t n = saved_elements(s, target_full, name);
  model.read_f32(name, 0, n, out);
  check_finite(Tensor::from_blob(out, {n}, DType::F32), model.path(), name);
  std::fill(out + n, out + t.numel, 0.0f);
}

void read_full_params_into(const SavedStep& s, const ModelLayout& target_full, float* out) {
  const SafetensorsFile model = open_saved_model_tracked(s);
  // Every weight in one batch: the file is read front to back as one stream.
  std::vector<SafetensorsFile::F32Read> reads;
  std::vector<int64_t> saved;
  for (const ParamSpec& t : target_full.params) {
    saved.push_back(saved_elements(s, target_full, t.name));
    reads.push_back({t.name, 0, saved.back(), out + t.offset});
  }
  try {
    model.read_f32(std::move(reads));
    for (size_t i = 0; i < target_full.params.size(); ++i) {
      const ParamSpec& t = target_full.params[i];
      check_finite(Tensor::from_blob(out + t.offset, {saved[i]}, DType::F32), model.path(), t.name);
      std::fill(out + t.offset + saved[i], out + t.offset + t.numel, 0.0f);  // vocabulary rows the saved model lacks
    }
  } catch (const UserError&) {
    verify_saved_model(s, model);  // a corrupt file is named as such, not by the value it turned into
    throw;
  }
  verify_saved_model(s, model);
}

Tensor read_full_params(const SavedStep& s, const ModelLayout& target_full) {
  Tensor out = Tensor::empty({target_full.total}, DType::F32);
  read_full_params_into(s, target_full, out.data<float>());
  return out;
}

void read_local_params(const SavedStep& s, const SafetensorsFile& model, const ModelLayout& local, int64_t begin,
                       int64_t end, float* out) {
  DS_CHECK(begin >= 0 && begin <= end && end <= local.total, "read_local_params: [{}, {}) outside {} elements",
           begin, end, local.total);
  std::vector<SafetensorsFile::F32Read> reads;
  for (const ParamSpec& p : local.params) {
    if (p.offset + p.numel <= begin || p.offset >= end) continue;
    const ParamSpec* f = s.full.try_find(p.name);
    ParamSpec target;
    target.name = p.name;
    target.shape = p.full_shape;
    target.numel = shape_numel(p.full_shape);
    DS_USER_CHECK(f && same_but_vocab(*f, target), "checkpoint: weight '{}' is {}, the configured model expects {}",
                  p.name, f ? shape_str(f->shape) : std::string("missing"), shape_str(p.full_shape));
    // Each run of this shard's weight in the full weight; elements past the
    // saved ones (vocabulary rows the saved model lacks) are zero.
    for_each_shard_run(p, local.shard, [&](int64_t full_off, int64_t local_off, int64_t n) {
      const int64_t lo = std::max(begin, p.offset + local_off), hi = std::min(end, p.offset + local_off + n);
      if (lo >= hi) return;
      const int64_t src = full_off + (lo - p.offset - local_off);  // element of the full weight at lo
      const int64_t saved_n = std::clamp(f->numel - src, int64_t{0}, hi - lo);
      float* dst = out + (lo - begin);
      reads.push_back({p.name, src, saved_n, dst});
      std::fill(dst + saved_n, dst + (hi - lo), 0.0f);
    });
  }
  // One batch: the runs are read in file order, scattered slices as one stream.
  model.read_f32(reads);
  for (const SafetensorsFile::F32Read& r : reads)
    check_finite(Tensor::from_blob(r.out, {r.count}, DType::F32), model.path(), r.name);
}

namespace {

// What a target range wants of one saved weight: elements [full, full + n)
// of the (saved) full weight, into the range's buffer at `dst`.
struct Want {
  int64_t full = 0, n = 0, dst = 0;
};

// One read: elements [src, src + n) of a saved shard's local state into dst.
struct Piece {
  int64_t src = 0, n = 0, dst = 0;
};

}  // namespace

int64_t read_reshaped_state(const SavedStep& s, const ModelLayout& full, const ModelLayout& local, int64_t begin,
                            int64_t end, OptimizerStates& state) {
  prepare_host_states(state, end - begin);
  // What [begin, end) of the target's local layout holds, per saved weight, in
  // the saved full weight's element order (a padded vocabulary row the saved
  // model lacks stays zero, as read_full_weight leaves it).
  std::map<std::string, std::vector<Want>> wants;
  for (const ParamSpec& p : local.params) {
    if (p.offset + p.numel <= begin || p.offset >= end) continue;
    const ParamSpec* f = s.full.try_find(p.name);
    const ParamSpec& t = full.find(p.name);
    DS_USER_CHECK(f && same_but_vocab(*f, t), "checkpoint: weight '{}' is {}, the configured model expects {}",
                  p.name, f ? shape_str(f->shape) : std::string("missing"), shape_str(t.shape));
    std::vector<Want>& w = wants[p.name];
    for_each_shard_run(p, local.shard, [&](int64_t fo, int64_t lo, int64_t n) {
      const int64_t a = std::max(begin, p.offset + lo), b = std::min(end, p.offset + lo + n);
      const int64_t from = fo + (a - p.offset - lo), count = std::min(b - a, f->numel - from);
      if (count > 0) w.push_back({from, count, a - begin});
    });
    std::sort(w.begin(), w.end(), [](const Want& x, const Want& y) { return x.full < y.full; });
  }
  // Each saved (pp, tp, ep) shard in turn: the overlap of its runs with the
  // wants, read from its files, then the files are closed. A weight a shard
  // holds whole (replicated over tp, or not split) is read from the first
  // shard that holds it; a tied wte from the first stage (the later stage's copy is the same).
  std::set<std::string> whole_done;
  int64_t step = -1;
  for (int pr = 0; pr < s.sizes.pp; ++pr) {
    for (int r = 0; r < s.sizes.tp; ++r) {
      for (int e = 0; e < s.sizes.ep; ++e) {
        const ShardCoords at = s.sizes.at(r, pr).at_ep(e);
        const ModelLayout src = build_layout(s.model, at);
        std::vector<Piece> pieces;
        std::vector<std::string> whole;
        for (const ParamSpec& q : src.params) {
          if (!src.first_stage() && q.name == "embed.wte") continue;
          auto it = wants.find(q.name);
          if (it == wants.end() || whole_done.count(q.name)) continue;
          if (q.shape == q.full_shape) whole.push_back(q.name);
          const std::vector<Want>& w = it->second;
          for_each_shard_run(q, src.shard, [&](int64_t fo, int64_t lo, int64_t n) {
            // The wants overlapping [fo, fo + n): from the last one starting before fo.
            auto k = std::upper_bound(w.begin(), w.end(), fo, [](int64_t x, const Want& y) { return x < y.full; });
            if (k != w.begin()) --k;
            for (; k != w.end() && k->full < fo + n; ++k) {
              const int64_t a = std::max(fo, k->full), b = std::min(fo + n, k->full + k->n);
              if (a < b) pieces.push_back({q.offset + lo + (a - fo), b - a, k->dst + (a - k->full)});
            }
          });
        }
        whole_done.insert(whole.begin(), whole.end());
        if (pieces.empty() && step >= 0) continue;
        SavedStateFiles files(s, at, src.total, state);
        step = files.step();
        std::sort(pieces.begin(), pieces.end(), [](const Piece& x, const Piece& y) { return x.src < y.src; });
        std::vector<Piece> merged;  // neighbours in both the source and the destination: one read
        for (const Piece& p : pieces) {
          if (!merged.empty() && merged.back().src + merged.back().n == p.src &&
              merged.back().dst + merged.back().n == p.dst)
            merged.back().n += p.n;
          else
            merged.push_back(p);
        }
        for (size_t i = 0; i < state.size(); ++i)
          for (const Piece& p : merged) files.read(i, p.src, p.src + p.n, state[i].t.data<float>() + p.dst);
        files.verify();
      }
    }
  }
  return step;
}

}  // namespace ds
