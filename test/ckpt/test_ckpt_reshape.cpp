// Checkpoint reshaping, in process: a fabricated optimizer state with known
// values is saved as TP2 x DP2 (ZeRO-1) and PP2 x TP2 x DP2 shards, then loaded
// (and rewritten offline) for other TP / PP / DP layouts; every element must equal the fabricated
// full state sliced for the target, with the padded vocabulary rows cut or
// zero-filled when the target pads the vocabulary differently.
#include <catch2/catch.hpp>
#include <filesystem>
#include <unistd.h>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/convert.h"
#include "lib/core/error.h"
#include "lib/model/tp_shard.h"
#include "lib/parallel/zero_partition.h"
#include "test/model/tiny_model.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kStep = 7, kIteration = 10;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("dstrain_reshape_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// tiny model with 4 heads so that TP4 divides it; padded vocabulary vp.
ModelConfig model(bool llama, int vp = 40) {
  ModelConfig m = test::tiny_model(llama);
  m.num_heads = 4;
  m.padded_vocab_size = vp;
  return m;
}

// The fabricated value of element i of the saved full buffer `which` (0 params, 1 m, 2 v).
float value(int which, int64_t i) { return which == 0 ? -0.5f - i : which == 1 ? 0.25f + i : 1.0f + 2.0f * i; }

// The fabricated state in the layout `to`, built from the saved layout `from`
// by formula: weight elements past the saved ones (extra vocabulary rows) are 0.
Tensor expected_full(int which, const ModelLayout& from, const ModelLayout& to) {
  Tensor t = Tensor::zeros({to.total}, DType::F32);
  for (const ParamSpec& p : to.params) {
    const ParamSpec& f = from.find(p.name);
    for (int64_t k = 0; k < std::min(p.numel, f.numel); ++k) t.data<float>()[p.offset + k] = value(which, f.offset + k);
  }
  return t;
}

// A pipeline split: pp stages with vp virtual stages per rank.
struct Pipe {
  int pp = 1, vp = 1;
};

// Saves the fabricated state as pp x tp x dp ZeRO-1 shards under dir. With
// `poison_tied`, a later stage's tied wte moments are garbage: a reshaping
// load must take the first stage's copy.
void save_fabricated(const fs::path& dir, const ModelConfig& cfg, int tp, int dp, Pipe pipe = {},
                     bool poison_tied = false) {
  const ModelLayout full = build_layout(cfg);
  Tensor p = expected_full(0, full, full), m = expected_full(1, full, full), v = expected_full(2, full, full);
  TrainState st;
  st.iteration = kIteration;
  st.consumed_samples = 80;
  for (int pr = 0; pr < pipe.pp; ++pr) {
    for (int tr = 0; tr < tp; ++tr) {
      const ModelLayout local = build_layout(cfg, {tp, tr, pipe.pp, pr, pipe.vp});
      Tensor lm = Tensor::empty({local.total}, DType::F32), lv = Tensor::empty({local.total}, DType::F32);
      slice_tp_params(local, full, m, lm);
      slice_tp_params(local, full, v, lv);
      const ParamSpec* wte = local.try_find("embed.wte");
      if (poison_tied && pr > 0 && wte) {
        std::fill_n(lm.data<float>() + wte->offset, wte->numel, -999.0f);
        std::fill_n(lv.data<float>() + wte->offset, wte->numel, 999.0f);  // exp_avg_sq is never negative
      }
      const ZeroPartition part = make_zero_partition(local.total, dp);
      for (int r = 0; r < dp; ++r) {
        Range g = part.owned_real(r);
        CheckpointData d{&full, p, adam_states(lm.view(g.begin, {g.size()}), lv.view(g.begin, {g.size()})), g.begin, g.end, kStep, r, dp};
        d.opt_layout = &local;
        d.shard = {tp, tr, pipe.pp, pr, pipe.vp};
        write_checkpoint_files(dir.string(), st, d, nlohmann::json{{"note", "fabricated"}});
      }
    }
  }
  commit_checkpoint(dir.string(), kIteration);
}

bool equal(const float* a, const float* b, int64_t n) { return std::equal(a, a + n, b); }

// Loads dir into target (stage pr, tp rank tr) of (pp, tp, dp, ZeRO-1
// ranges) of `cfg`, every dp rank, and compares with the fabricated state
// saved in layout `saved_full`.
void check_load_rank(const fs::path& dir, const ModelConfig& cfg, const ModelLayout& saved_full, int tp, int dp,
                     Pipe pipe, int pr, int tr) {
  const ModelLayout full = build_layout(cfg);
  const Tensor ep = expected_full(0, saved_full, full), em = expected_full(1, saved_full, full),
               ev = expected_full(2, saved_full, full);
  const ModelLayout local = build_layout(cfg, {tp, tr, pipe.pp, pr, pipe.vp});
  Tensor lm = Tensor::empty({local.total}, DType::F32), lv = Tensor::empty({local.total}, DType::F32);
  slice_tp_params(local, full, em, lm);
  slice_tp_params(local, full, ev, lv);
  const ZeroPartition part = make_zero_partition(local.total, dp);
  for (int r = 0; r < dp; ++r) {
    INFO("target PP" << pipe.pp << " (vp " << pipe.vp << ") TP" << tp << " DP" << dp << ": stage " << pr
                     << ", tp rank " << tr << ", dp rank " << r);
    Range g = part.owned_real(r);
    Tensor p = Tensor::zeros({full.total}, DType::F32);
    Tensor m = Tensor::zeros({g.size()}, DType::F32), v = Tensor::zeros({g.size()}, DType::F32);
    CheckpointData d{&full, p, adam_states(m, v), g.begin, g.end, 0, r, dp};
    d.opt_layout = &local;
    d.shard = {tp, tr, pipe.pp, pr, pipe.vp};
    d.model = &cfg;
    TrainState st;
    REQUIRE(load_checkpoint(dir.string(), st, d));
    CHECK(st.iteration == kIteration);
    CHECK(st.consumed_samples == 80);
    CHECK(d.opt_step == kStep);
    CHECK(equal(p.data<float>(), ep.data<float>(), full.total));
    CHECK(equal(m.data<float>(), lm.data<float>() + g.begin, g.size()));
    CHECK(equal(v.data<float>(), lv.data<float>() + g.begin, g.size()));
  }
}

// Loads dir into every rank of (pp, tp, dp, ZeRO-1 ranges) of `cfg` and
// compares with the fabricated state saved in layout `saved_full`.
void check_load(const fs::path& dir, const ModelConfig& cfg, const ModelLayout& saved_full, int tp, int dp,
                Pipe pipe = {}) {
  for (int pr = 0; pr < pipe.pp; ++pr)
    for (int tr = 0; tr < tp; ++tr) check_load_rank(dir, cfg, saved_full, tp, dp, pipe, pr, tr);
}

}  // namespace

TEST_CASE("a TP2 x DP2 ZeRO-1 checkpoint loads into other TP and DP layouts element for element") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const ModelConfig src = model(llama);
    const ModelLayout saved_full = build_layout(src);
    fs::path dir = temp_dir(llama ? "load_llama" : "load_gpt2");
    save_fabricated(dir, src, 2, 2);
    REQUIRE(fs::exists(dir / "global_step10" / "optim_tp01_rank00001_of_00002.safetensors"));
    SECTION("TP1 DP1") { check_load(dir, src, saved_full, 1, 1); }
    SECTION("TP1 DP3") { check_load(dir, src, saved_full, 1, 3); }
    SECTION("TP2 DP2 (same layout)") { check_load(dir, src, saved_full, 2, 2); }
    SECTION("TP4 DP1, vocabulary padded to 44") { check_load(dir, model(llama, 44), saved_full, 4, 1); }
    SECTION("TP4 DP3") { check_load(dir, model(llama, 40), saved_full, 4, 3); }
    fs::remove_all(dir);
  }
}

TEST_CASE("write_reshaped rewrites a checkpoint for another layout offline") {
  const ModelConfig src = model(false);
  const ModelLayout saved_full = build_layout(src);
  fs::path dir = temp_dir("convert_src"), out = temp_dir("convert_out") / "ck";
  save_fabricated(dir, src, 2, 2);
  ReshapeTarget t;
  t.model = model(false, 44);
  t.sizes.tp = 4;
  t.dp = 3;
  t.zero_stage = 1;
  t.config = {{"note", "converted"}};
  write_reshaped(open_saved_step(find_step_dir(dir.string()), t.model), t, out.string());
  REQUIRE(fs::exists(out / "latest"));
  REQUIRE(fs::exists(out / "global_step10" / "optim_tp03_rank00002_of_00003.safetensors"));
  const nlohmann::json state = read_step_state(out / "global_step10").raw;
  CHECK(state.at("tensor_model_parallel_size") == 4);
  CHECK(state.at("optimizer_shards") == 3);
  CHECK(state.at("config").at("note") == "converted");
  SECTION("the converted files load as TP4 x DP3 without reshaping") {
    check_load(out, t.model, saved_full, 4, 3);
  }
  SECTION("and back into a single process (vocabulary rows 44 -> 40 cut)") { check_load(out, src, saved_full, 1, 1); }
  SECTION("ZeRO-0 target: one shard per tp rank") {
    ReshapeTarget z = t;
    z.zero_stage = 0;
    fs::path out0 = out.parent_path() / "z0";
    write_reshaped(open_saved_step(find_step_dir(dir.string()), z.model), z, out0.string());
    REQUIRE(fs::exists(out0 / "global_step10" / "optim_tp02_rank00000_of_00001.safetensors"));
    check_load(out0, src, saved_full, 1, 2);
  }
  fs::remove_all(dir);
  fs::remove_all(out.parent_path());
}

TEST_CASE("a PP2 x TP2 x DP2 checkpoint reshapes to a single process and back, element for element") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama (untied)" : "gpt2 (tied wte on the first and last stage)"));
    ModelConfig src = model(llama);
    src.num_layers = 4;  // 2 stages x 2 virtual stages of 1 layer
    const ModelLayout saved_full = build_layout(src);
    const fs::path dir = temp_dir(llama ? "pp_llama" : "pp_gpt2"), out = temp_dir(llama ? "pp_out_l" : "pp_out_g");
    save_fabricated(dir, src, 2, 2, {2, 1}, true);  // the last stage's tied wte is garbage
    REQUIRE(fs::exists(dir / "global_step10" / "optim_pp01_tp01_rank00001_of_00002.safetensors"));
    SECTION("loaded as PP1 TP1 DP1 (the first stage's wte)") { check_load(dir, src, saved_full, 1, 1); }
    SECTION("loaded as PP2 (2 virtual stages) TP1 DP3") { check_load(dir, src, saved_full, 1, 3, {2, 2}); }
    SECTION("loaded as PP4 TP4 DP1, vocabulary padded to 44") {
      ModelConfig t = src;
      t.padded_vocab_size = 44;
      check_load(dir, t, saved_full, 4, 1, {4, 1});
    }
    SECTION("rewritten for a single process, then back to PP2 (2 virtual stages) x TP2 x DP2") {
      ReshapeTarget one;
      one.model = src;
      one.config = {{"note", "single"}};
      write_reshaped(open_saved_step(find_step_dir(dir.string()), src), one, (out / "one").string());
      REQUIRE(fs::exists(out / "one" / "global_step10" / "optim_rank00000_of_00001.safetensors"));
      check_load(out / "one", src, saved_full, 1, 1);
      ReshapeTarget back = one;
      back.sizes.tp = back.dp = back.sizes.pp = back.sizes.vp = 2;
      write_reshaped(open_saved_step(find_step_dir((out / "one").string()), src), back, (out / "back").string());
      const nlohmann::json state = read_step_state(out / "back" / "global_step10").raw;
      CHECK(state.at("pipeline_model_parallel_size") == 2);
      CHECK(state.at("virtual_pipeline_stages") == 2);
      REQUIRE(fs::exists(out / "back" / "global_step10" / "optim_pp01_tp01_rank00001_of_00002.safetensors"));
      check_load(out / "back", src, saved_full, 2, 2, {2, 2});  // the same layout: shards read as written
      check_load(out / "back", src, saved_full, 1, 1);
    }
    fs::remove_all(dir);
    fs::remove_all(out);
  }
}

TEST_CASE("reshaping refuses a checkpoint of another model with one clear line") {
  fs::path dir = temp_dir("refuse");
  save_fabricated(dir, model(false), 2, 1);
  ModelConfig other = model(false);
  other.num_layers = 3;
  try {
    open_saved_step(find_step_dir(dir.string()), other);
    FAIL("expected a UserError");
  } catch (const UserError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("different model config") != std::string::npos);
  }
  // Without a model config the loader cannot reshape and says so.
  const ModelLayout full = build_layout(model(false));
  Tensor p = Tensor::zeros({full.total}, DType::F32), m = Tensor::zeros({full.total}, DType::F32),
         v = Tensor::zeros({full.total}, DType::F32);
  CheckpointData d{&full, p, adam_states(m, v), 0, full.total, 0, 0, 1};
  TrainState st;
  REQUIRE_THROWS_WITH(load_checkpoint(dir.string(), st, d),
                      Catch::Contains("saved with tensor_model_parallel_size 2, this job uses 1"));
  REQUIRE_THROWS_WITH(find_step_dir((dir / "missing").string()), Catch::Contains("is not a directory"));
  REQUIRE_THROWS_WITH(find_step_dir(dir.string(), "global_step99"), Catch::Contains("does not exist"));
  fs::remove_all(dir);
}

namespace {

// Three named states of another optimizer: element i of state k of the full model.
float state_value(int k, int64_t i) { return k == 0 ? 0.5f + i : k == 1 ? 2.0f * i : -1.0f - i; }
OptimizerStates three_states(int64_t n, int64_t first, const ModelLayout* local = nullptr,
                             const ModelLayout* full = nullptr) {
  OptimizerStates s{{"momentum_buffer", {}, false}, {"sum", {}, true}, {"third", {}, false}};
  for (int k = 0; k < 3; ++k) {
    s[k].t = Tensor::empty({n}, DType::F32);
    if (!local) {
      for (int64_t i = 0; i < n; ++i) s[k].t.data<float>()[i] = state_value(k, first + i);
      continue;
    }
    Tensor f = Tensor::empty({full->total}, DType::F32), l = Tensor::empty({local->total}, DType::F32);
    for (int64_t i = 0; i < full->total; ++i) f.data<float>()[i] = state_value(k, i);
    slice_tp_params(*local, *full, f, l);
    s[k].t.copy_from(l.view(first, {n}));
  }
  return s;
}

}  // namespace

TEST_CASE("optimizer state of any names is saved, loaded and reshaped by name; another optimizer's is refused") {
  const ModelConfig cfg = model(false);
  const ModelLayout full = build_layout(cfg);
  const Tensor p = expected_full(0, full, full);
  const fs::path dir = temp_dir("named_states");
  TrainState st;
  st.iteration = kIteration;
  for (int tr = 0; tr < 2; ++tr) {  // TP2 x DP2
    const ModelLayout local = build_layout(cfg, {2, tr, 1, 0, 1});
    const ZeroPartition part = make_zero_partition(local.total, 2);
    for (int r = 0; r < 2; ++r) {
      const Range g = part.owned_real(r);
      CheckpointData d{&full, p, three_states(g.size(), g.begin, &local, &full), g.begin, g.end, kStep, r, 2};
      d.opt_layout = &local;
      d.shard = {2, tr, 1, 0, 1};
      write_checkpoint_files(dir.string(), st, d, nlohmann::json::object());
    }
  }
  commit_checkpoint(dir.string(), kIteration);
  auto load = [&](int tp, int tr, int dp, int r, OptimizerStates want) {
    const ModelLayout local = build_layout(cfg, {tp, tr, 1, 0, 1});
    const Range g = make_zero_partition(local.total, dp).owned_real(r);
    Tensor lp = Tensor::zeros({full.total}, DType::F32);
    for (OptimizerStateTensor& s : want) s.t = Tensor::zeros({g.size()}, DType::F32);
    CheckpointData d{&full, lp, want, g.begin, g.end, 0, r, dp};
    d.opt_layout = &local;
    d.shard = {tp, tr, 1, 0, 1};
    d.model = &cfg;
    TrainState got;
    REQUIRE(load_checkpoint(dir.string(), got, d));
    CHECK(d.opt_step == kStep);
    const OptimizerStates expect = three_states(g.size(), g.begin, &local, &full);
    for (size_t k = 0; k < expect.size(); ++k) {
      INFO(expect[k].name << " at tp " << tp << "/" << tr << " dp " << dp << "/" << r);
      CHECK(equal(d.opt_state[k].t.data<float>(), expect[k].t.data<float>(), g.size()));
    }
  };
  const OptimizerStates names = three_states(0, 0);
  SECTION("same layout") { load(2, 1, 2, 1, names); }
  SECTION("reshaped to one process") { load(1, 0, 1, 0, names); }
  SECTION("reshaped to TP4 DP3 offline, the names carried") {
    ReshapeTarget t;
    t.model = cfg;
    t.sizes.tp = 4;
    t.dp = 3;
    t.config = nlohmann::json::object();
    const fs::path out = temp_dir("named_states_out");
    write_reshaped(open_saved_step(find_step_dir(dir.string()), cfg), t, out.string());
    const SavedStep s = open_saved_step(find_step_dir(out.string()), cfg);
    const OptimizerStates saved = saved_state_names(s);
    REQUIRE(state_names(saved) == "momentum_buffer, sum, third");
    CHECK(saved[1].non_negative);
    CHECK_FALSE(saved[0].non_negative);
    fs::remove_all(out);
  }
  SECTION("an Adam run refuses it, naming both sets") {
    const ModelLayout local = build_layout(cfg, {2, 0, 1, 0, 1});
    Tensor lp = Tensor::zeros({full.total}, DType::F32), m = Tensor::zeros({10}, DType::F32), v = m.clone();
    CheckpointData d{&full, lp, adam_states(m, v), 0, 10, 0, 0, 2};
    d.opt_layout = &local;
    d.shard = {2, 0, 1, 0, 1};
    d.model = &cfg;
    TrainState got;
    REQUIRE_THROWS_WITH(load_checkpoint(dir.string(), got, d),
                        Catch::Contains("holds the optimizer state momentum_buffer, sum, third") &&
                            Catch::Contains("this run's optimizer keeps exp_avg, exp_avg_sq"));
    CHECK(lp.data<float>()[0] == 0.f);  // nothing touched
  }
  fs::remove_all(dir);
}
