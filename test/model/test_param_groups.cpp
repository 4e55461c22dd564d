// Parameter groups and the blocks' typed handles (lib/model/param_group.h,
// blocks.h): every parameter of every layout belongs to a group; weight decay
// follows the group's rule, which is Megatron's (no decay on biases and 1-D
// tensors, decay on matrices and embeddings); the handles of each layer, the
// embeddings and the head name exactly the tensors the checkpoint names
// promise, on the shards that hold them, and nothing else.
#include <catch2/catch.hpp>
#include <set>
#include <vector>
#include <string>

#include "lib/model/blocks.h"
#include "lib/model/param_init.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

std::string name_of(const ModelLayout& l, ParamRef r) { return r.defined() ? l[r].name : std::string("-"); }

// Every defined handle of the layout, by name; each parameter exactly once.
std::set<std::string> handle_names(const ModelLayout& l) {
  std::set<std::string> out;
  auto add = [&](ParamRef r) {
    if (!r.defined()) return;
    REQUIRE(r.index < static_cast<int32_t>(l.params.size()));
    REQUIRE(out.insert(l[r].name).second);
  };
  add(l.embed.wte);
  add(l.embed.wpe);
  for (const LayerParams& p : l.layers)
    for (ParamRef r : {p.norm1.weight, p.norm1.bias, p.attn.qkv.weight, p.attn.qkv.bias, p.attn.proj.weight,
                       p.attn.proj.bias, p.norm2.weight, p.norm2.bias, p.mlp.fc.weight, p.mlp.fc.bias,
                       p.mlp.proj.weight, p.mlp.proj.bias})
      add(r);
  add(l.head.final_norm.weight);
  add(l.head.final_norm.bias);
  add(l.head.head);
  return out;
}

void check_layout(const ModelConfig& cfg, const ShardCoords& s) {
  INFO("tp " << s.tp << "/" << s.tp_rank << " pp " << s.pp << "/" << s.pp_rank << " vp " << s.vp);
  const ModelLayout l = build_layout(cfg, s);
  REQUIRE(l.groups.size() == 1);
  REQUIRE(l.groups[0].name == "dense");
  REQUIRE(l.groups[0].reduces_over(ParallelAxis::Data));
  REQUIRE(l.groups[0].reduces_over(ParallelAxis::Ulysses));
  REQUIRE_FALSE(l.groups[0].reduces_over(ParallelAxis::Tensor));
  std::set<std::string> names;
  for (const ParamSpec& p : l.params) {
    INFO(p.name);
    REQUIRE(p.group == 0);
    const bool bias = p.name.ends_with(".bias"), norm = p.name.find("norm") != std::string::npos;
    REQUIRE(p.decay == !(bias || norm));  // Megatron's rule, as dstrain trained before groups
    names.insert(p.name);
  }
  REQUIRE(handle_names(l) == names);
  // Each held layer's handles carry its own layer's names.
  for (int layer = 0; layer < cfg.num_layers; ++layer) {
    const LayerParams& p = l.layers[static_cast<size_t>(layer)];
    const std::string pre = "layers." + std::to_string(layer) + ".";
    if (!l.holds_layer(layer)) {
      REQUIRE_FALSE(p.attn.qkv.weight.defined());
      continue;
    }
    REQUIRE(name_of(l, p.norm1.weight) == pre + "norm1.weight");
    REQUIRE(name_of(l, p.attn.qkv.weight) == pre + "attn.qkv.weight");
    REQUIRE(name_of(l, p.attn.proj.weight) == pre + "attn.proj.weight");
    REQUIRE(name_of(l, p.norm2.weight) == pre + "norm2.weight");
    REQUIRE(name_of(l, p.mlp.fc.weight) == pre + "mlp.fc.weight");
    REQUIRE(name_of(l, p.mlp.proj.weight) == pre + "mlp.proj.weight");
    REQUIRE(l[p.attn.qkv.weight].layer == layer);
  }
  REQUIRE(l.embed.wte.defined() == (s.first_stage() || (s.last_stage() && !cfg.untie_embeddings)));
  REQUIRE(l.head.final_norm.weight.defined() == s.last_stage());
  REQUIRE(l.head.head.defined() == (s.last_stage() && cfg.untie_embeddings));
}

}  // namespace

TEST_CASE("every layout's parameters are in the dense group, decay by Megatron's rule, and have handles") {
  for (bool llama : {false, true}) {
    ModelConfig cfg = test::tiny_model(llama);
    cfg.num_layers = 4;
    cfg.num_heads = 4;
    if (llama) cfg.num_kv_heads = 2;
    for (const ShardCoords& s : {ShardCoords{}, ShardCoords{2, 1, 1, 0, 1}, ShardCoords{1, 0, 2, 0, 1},
                                 ShardCoords{1, 0, 2, 1, 2}, ShardCoords{2, 0, 2, 1, 1}, ShardCoords{4, 3, 1, 0, 1}})
      check_layout(cfg, s);
  }
}

TEST_CASE("decay rules of a parameter group") {
  ParamGroupSpec g = dense_param_group();
  REQUIRE(g.decays("layers.0.attn.qkv.weight", {12, 4}));
  REQUIRE(g.decays("embed.wte", {50, 4}));
  REQUIRE_FALSE(g.decays("layers.0.attn.qkv.bias", {12}));
  REQUIRE_FALSE(g.decays("layers.0.norm1.weight", {4}));
  REQUIRE_FALSE(g.decays("odd.bias", {3, 4}));  // a 2-D bias still takes none (Megatron: name or 1-D)
  g.decay = DecayRule::All;
  REQUIRE(g.decays("layers.0.norm1.weight", {4}));
  g.decay = DecayRule::None;
  REQUIRE_FALSE(g.decays("embed.wte", {50, 4}));
}

// Expert parallelism: a rank holds block ep_rank of each MoE layer's experts
// (dim 0 of the stacked weights), the dense weights whole; initialised
// in place, its values are that block of the single-process initialization.
TEST_CASE("expert-parallel shards hold their block of experts, initialised as the full model's") {
  ModelConfig cfg = test::tiny_model(false);
  cfg.num_layers = 2;
  cfg.moe.num_experts = {4};
  cfg.moe.expert_interval = 1;
  const ModelLayout full = build_layout(cfg);
  std::vector<float> want(static_cast<size_t>(full.total));
  init_params(cfg, full, 7, 0.02f, want.data(), 0, full.total);
  for (int ep : {2, 4}) {
    for (int r = 0; r < ep; ++r) {
      INFO("ep " << ep << " rank " << r);
      ShardCoords s;
      s.ep = ep;
      s.ep_rank = r;
      const ModelLayout l = build_layout(cfg, s);
      REQUIRE(l.groups.size() == 2);
      REQUIRE(l.groups[1].splits_over(ParallelAxis::Expert));
      REQUIRE(l.groups[1].reduces_over(ParallelAxis::ExpertData));
      REQUIRE_FALSE(l.groups[1].reduces_over(ParallelAxis::Data));
      std::vector<float> got(static_cast<size_t>(l.total));
      init_params(cfg, l, 7, 0.02f, got.data(), 0, l.total);
      int experts = 0;
      for (const ParamSpec& p : l.params) {
        INFO(p.name);
        const ParamSpec& f = full.find(p.name);
        REQUIRE(p.full_shape == f.shape);
        REQUIRE(p.ep_split == (p.name.find(".experts.") != std::string::npos));
        int64_t from = 0;
        if (p.ep_split) {
          ++experts;
          REQUIRE(p.shape[0] == 4 / ep);
          REQUIRE(p.numel * ep == f.numel);
          from = r * p.numel;
        } else {
          REQUIRE(p.shape == f.shape);
        }
        for (int64_t i = 0; i < p.numel; ++i) REQUIRE(got[p.offset + i] == want[f.offset + from + i]);
      }
      REQUIRE(experts == 2 * 3);  // fc.weight, fc.bias, proj.weight per layer
    }
  }
  ShardCoords bad;
  bad.ep = 3;
  REQUIRE_THROWS_WITH(build_layout(cfg, bad),
                      Catch::Contains("4 experts do not split over --moe-expert-parallel-size 3"));
}
