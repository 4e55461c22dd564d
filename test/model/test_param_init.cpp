// Sharded initialization (lib/model/param_init.h): every shard of every layout
// (TP 2 and 4, PP 2 with virtual stages, TP x PP, grouped-query attention with
// a kv head replicated over tp ranks, the padded vocabulary) initialises to
// exactly the slices of the single-process model's weights, bit for bit, as
// does any sub-range of a shard (a ZeRO partition).
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "lib/model/param_init.h"
#include "lib/model/tp_shard.h"
#include "test/model/tiny_model.h"

using namespace ds;

namespace {

Tensor init(const ModelConfig& cfg, const ModelLayout& l) {
  Tensor t = Tensor::empty({l.total}, DType::F32);
  init_params(cfg, l, 11, 0.05f, t.data<float>());
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void check_layout(const ModelConfig& cfg, const ShardCoords& s) {
  INFO("tp " << s.tp << " rank " << s.tp_rank << ", pp " << s.pp << " rank " << s.pp_rank << ", vp " << s.vp);
  const ModelLayout full = build_layout(cfg), local = build_layout(cfg, s);
  const Tensor full_w = init(cfg, full);
  Tensor want = Tensor::empty({local.total}, DType::F32);
  slice_tp_params(local, full, full_w, want);  // what the full-model init kept of it
  const Tensor got = init(cfg, local);
  REQUIRE(same_bits(got, want));
  // A sub-range (as a ZeRO-3 partition initialises its own part only).
  const int64_t b = local.total / 3, e = 2 * local.total / 3 + 1;
  std::vector<float> part(e - b);
  init_params(cfg, local, 11, 0.05f, part.data(), b, e);
  REQUIRE(std::memcmp(part.data(), got.data<float>() + b, (e - b) * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("a shard's initial weights are the full model's slices, bit for bit") {
  for (bool llama : {false, true}) {
    ModelConfig cfg = test::tiny_model(llama);
    cfg.num_layers = 4;
    cfg.num_heads = 4;
    cfg.padded_vocab_size = padded_vocab(cfg.vocab_size, 8, 4);
    INFO((llama ? "llama" : "gpt2"));
    for (int tp : {2, 4})
      for (int r = 0; r < tp; ++r) check_layout(cfg, {.tp = tp, .tp_rank = r});
    for (int s = 0; s < 2; ++s) {
      check_layout(cfg, {.pp = 2, .pp_rank = s});
      check_layout(cfg, {.pp = 2, .pp_rank = s, .vp = 2});
      for (int r = 0; r < 2; ++r) check_layout(cfg, {.tp = 2, .tp_rank = r, .pp = 2, .pp_rank = s});
    }
    if (llama) {  // one kv head replicated over two tp ranks
      cfg.num_kv_heads = 2;
      for (int r = 0; r < 4; ++r) check_layout(cfg, {.tp = 4, .tp_rank = r});
    }
  }
}

TEST_CASE("expert tensor parallelism: each expert's fc rows and proj columns split over tp, experts over ep") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama (SwiGLU: [gate | up] rows, each split)" : "gpt2"));
    ModelConfig cfg = test::tiny_model(llama);
    cfg.moe.num_experts = {4};
    cfg.moe.expert_interval = 1;
    cfg.moe.expert_tensor_parallelism = true;
    const ModelLayout full = build_layout(cfg);
    const Tensor full_w = init(cfg, full);
    const int64_t E = 4, C = cfg.hidden_size, F = model_dims(cfg).F, blocks = llama ? 2 : 1;
    for (int ep : {1, 2})
      for (int er = 0; er < ep; ++er)
        for (int tr = 0; tr < 2; ++tr) {
          const ShardCoords s{.tp = 2, .tp_rank = tr, .ep = ep, .ep_rank = er};
          INFO("ep " << ep << " rank " << er << ", tp rank " << tr);
          check_layout(cfg, s);
          const ModelLayout local = build_layout(cfg, s);
          const Tensor w = init(cfg, local);
          const int64_t El = E / ep, Fl = F / 2;
          // Each element by index arithmetic: local (e, i, c) of fc is full
          // (er * El + e, block * F + tr * Fl + i', c); proj (e, c, j) is full
          // (er * El + e, c, tr * Fl + j).
          const ParamSpec& fc = local.find("layers.0.mlp.experts.fc.weight");
          const ParamSpec& ffc = full.find("layers.0.mlp.experts.fc.weight");
          REQUIRE(fc.shape == Shape{El, blocks * Fl, C});
          for (int64_t e = 0; e < El; ++e)
            for (int64_t i = 0; i < blocks * Fl; ++i)
              for (int64_t c = 0; c < C; c += 7) {
                const int64_t row = (i / Fl) * F + tr * Fl + i % Fl;
                REQUIRE(w.data<float>()[fc.offset + (e * blocks * Fl + i) * C + c] ==
                        full_w.data<float>()[ffc.offset + ((er * El + e) * blocks * F + row) * C + c]);
              }
          const ParamSpec& pj = local.find("layers.0.mlp.experts.proj.weight");
          const ParamSpec& fpj = full.find("layers.0.mlp.experts.proj.weight");
          REQUIRE(pj.shape == Shape{El, C, Fl});
          for (int64_t e = 0; e < El; ++e)
            for (int64_t c = 0; c < C; c += 5)
              for (int64_t j = 0; j < Fl; ++j)
                REQUIRE(w.data<float>()[pj.offset + (e * C + c) * Fl + j] ==
                        full_w.data<float>()[fpj.offset + ((er * El + e) * C + c) * F + tr * Fl + j]);
          // Split weights are no gradient-norm duplicates; the replicated router is, on tp rank 1.
          const std::vector<Range> dup = duplicate_ranges(local);
          auto in_dup = [&](int64_t at) {
            for (const Range& r : dup)
              if (at >= r.begin && at < r.end) return true;
            return false;
          };
          CHECK_FALSE(in_dup(fc.offset));
          CHECK_FALSE(in_dup(pj.offset + pj.numel - 1));
          CHECK(in_dup(local.find("layers.0.mlp.gate.weight").offset) == (tr == 1));
        }
  }
}

TEST_CASE("init values depend on the seed, the weight and the element only") {
  const ModelConfig cfg = test::tiny_model(false);
  const ModelLayout full = build_layout(cfg);
  const Tensor a = init(cfg, full);
  Tensor b = Tensor::empty({full.total}, DType::F32);
  init_params(cfg, full, 12, 0.05f, b.data<float>());
  CHECK_FALSE(same_bits(a, b));
  const ParamSpec& wte = full.find("embed.wte");
  const ParamSpec& ln = full.find("layers.0.norm1.weight");
  CHECK(a.data<float>()[ln.offset] == 1.f);
  CHECK(a.data<float>()[wte.offset] != a.data<float>()[wte.offset + 1]);
}
