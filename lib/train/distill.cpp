#include "lib/train/distill.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/error.h"
#include "lib/gen/model_source.h"

namespace ds {

std::unique_ptr<GptModel> load_teacher(const TrainConfig& cfg, Device dev, DType compute) {
  const DistillConfig& d = cfg.distill;
  gen::ModelSource src;
  src.load = d.load_teacher;
  gen::LoadedModel lm = gen::load_model(src, 1);
  ModelConfig& t = lm.model;
  const ModelConfig& s = cfg.model;
  auto agree = [&](const char* flag, int given, int saved) {
    DS_USER_CHECK(given == 0 || given == saved, "{} {}: the teacher in '{}' has {}", flag, given, lm.where, saved);
  };
  agree("--num-layers-teacher", d.num_layers, t.num_layers);
  agree("--hidden-size-teacher", d.hidden_size, t.hidden_size);
  agree("--num-attention-heads-teacher", d.num_attention_heads, t.num_heads);
  if (!d.num_experts.empty()) {
    std::vector<int> saved = t.moe.num_experts;
    if (saved.empty()) saved = {1};
    DS_USER_CHECK(d.num_experts == saved, "--num-experts-teacher {}: the teacher in '{}' has {}",
                  fmt::format("{}", fmt::join(d.num_experts, " ")), lm.where, fmt::format("{}", fmt::join(saved, " ")));
  }
  DS_USER_CHECK(t.vocab_size == s.vocab_size && t.padded_vocab_size == s.padded_vocab_size,
                "--load-teacher '{}': the teacher's vocabulary ({} ids, padded to {}) is not the student's ({}, padded "
                "to {}); distillation compares their distributions over the same ids",
                lm.where, t.vocab_size, t.padded_vocab_size, s.vocab_size, s.padded_vocab_size);
  DS_USER_CHECK(t.position == PositionKind::Rope || t.max_position_embeddings >= s.seq_length,
                "--load-teacher '{}': the teacher has {} learned positions, fewer than the student's sequence length "
                "{}", lm.where, t.max_position_embeddings, s.seq_length);
  t.hidden_dropout = s.hidden_dropout;
  t.attention_dropout = s.attention_dropout;
  t.moe.expert_parallel_size = 1;
  FlatStoreOptions forward_only;
  forward_only.forward_only = true;
  auto teacher = std::make_unique<GptModel>(t, dev, 0, TpComm{}, PipeStage{}, compute, forward_only);
  teacher->store().set_full_params(lm.params);
  return teacher;
}

GptModel::Distill distill_settings(const TrainConfig& cfg, GptModel& teacher) {
  return {.teacher = &teacher,
          .beta = cfg.distill.beta_ce,
          .temp = cfg.distill.temperature,
          .seq_length = cfg.model.seq_length,
          .seed = cfg.seed + 0x9E3779B97F4A7C15ull};
}

}  // namespace ds
