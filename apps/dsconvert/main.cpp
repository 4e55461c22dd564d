// dsconvert: rewrites a dstrain checkpoint offline, like Megatron-DeepSpeed's
// deepspeed_to_megatron --target_tp / --target_pp.
//   dsconvert --load DIR [--tag global_stepN] --save OUTDIR --target-tp N --target-dp M [--target-pp P]
//             [--target-vp V] [--target-ds-sequence-parallel-size U] [--zero-stage S]
//       -> OUTDIR/global_stepN laid out for TP N x PP P (V virtual stages per rank) x Ulysses U x DP M,
//          ZeRO stage S (defaults: the saved PP, virtual stages, Ulysses size and ZeRO stage; V is 1 when P
//          changes)
//   dsconvert --load DIR [--tag global_stepN] --export-hf OUTDIR
//       -> Hugging Face model.safetensors + config.json from a checkpoint of any layout
// Both carry the tokenizer files the checkpoint holds (verified by checksum).
// User errors print one line naming the input and exit 1; nothing half-written is left.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "lib/ckpt/convert.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/hf.h"
#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/core/progress.h"
#include "lib/core/run_main.h"

namespace fs = std::filesystem;

namespace {

struct Args {
  std::string load, tag, save, export_hf;
  int target_tp = 0, target_dp = 0, target_pp = 0, target_vp = 0, target_ulysses = 0, zero_stage = -1;
};

// The target config: the saved one re-targeted to the new TP, PP, Ulysses
// and virtual stages, with the new ZeRO stage and the gradient accumulation
// re-derived for the new DP size (global batch kept). `a` has its defaults
// resolved.
ds::TrainConfig target_config(const nlohmann::json& saved, const Args& a, const ds::TrainConfig& src) {
  const int layers = src.model.num_layers;
  DS_USER_CHECK(layers % (int64_t{a.target_pp} * a.target_vp) == 0,
                "--target-pp {} --target-vp {}: num_layers {} is not divisible by {}", a.target_pp, a.target_vp,
                layers, int64_t{a.target_pp} * a.target_vp);
  const ds::ParallelRequest to{.tp = a.target_tp, .pp = a.target_pp, .ulysses = a.target_ulysses,
                               .sequence_parallel = src.parallel.sequence_parallel,
                               .layers_per_virtual_stage = a.target_vp > 1 ? layers / (a.target_pp * a.target_vp) : 0};
  nlohmann::json c = ds::retarget_config(saved, to, ds::BatchOnRetarget::Keep);
  if (a.zero_stage >= 0) c["zero_optimization"]["stage"] = a.zero_stage;
  const int64_t world = int64_t{a.target_tp} * a.target_pp * a.target_ulysses * a.target_dp;
  DS_USER_CHECK(world <= (1 << 30), "--target-tp {} x --target-pp {} x --target-ds-sequence-parallel-size {} x "
                "--target-dp {} = {} ranks is more than dsconvert supports", a.target_tp, a.target_pp,
                a.target_ulysses, a.target_dp, world);
  return ds::train_config_from_json(c, static_cast<int>(world));  // validates the layout
}

int run(const Args& a) {
  if (!a.export_hf.empty()) ds::check_export_dir(a.export_hf, "--export-hf");  // before reading anything
  if (!a.save.empty()) ds::check_output_dir(a.save, "--save");
  const std::string step = ds::find_step_dir(a.load, a.tag);
  DS_USER_CHECK(!step.empty(), "--load {}: no checkpoint there ('latest' missing; give --tag global_stepN)", a.load);
  ds::StepState state = ds::read_step_state(step);
  DS_USER_CHECK(state.config.is_object(), "checkpoint file '{}/state.json': field 'config' is missing", step);
  const nlohmann::json config = state.config;
  const ds::ParallelLayout saved_layout = ds::saved_parallel_layout(config, step);
  const ds::TrainConfig src = ds::train_config_from_json(config, saved_layout.world);
  ds::SavedStep saved = ds::open_saved_step(step, std::move(state), src.model);
  // Progress of the reading (bytes checksummed and read; the shards add to the total as they are reached).
  std::error_code size_ec;
  const auto model_bytes = fs::file_size(fs::path(step) / "model.safetensors", size_ec);
  ds::Progress reading(ds::ProgressOptions{.label = "dsconvert: reading " + step,
                                           .total = size_ec ? 0 : static_cast<int64_t>(model_bytes)});
  saved.progress = &reading;
  if (!a.export_hf.empty()) {
    const ds::StepTokenizer tok = ds::read_step_tokenizer(saved.dir, saved.state);  // the copies, verified
    const ds::SafetensorsFile model = ds::open_saved_model(saved);  // checksum, every weight present as F32
    reading.finish();
    // One weight at a time from the checkpoint: the whole model is never in memory.
    auto weight = [&](const std::string& name) {
      ds::Tensor w = ds::Tensor::empty(saved.full.find(name).shape, ds::DType::F32);
      ds::read_full_weight(saved, model, saved.full, name, w.data<float>());
      return w;
    };
    ds::export_hf_streamed(saved.model, saved.full, weight, a.export_hf, {}, &tok);
    std::printf("dsconvert: exported %s as a Hugging Face model to %s\n", step.c_str(), a.export_hf.c_str());
    return 0;
  }
  DS_USER_CHECK(a.target_tp >= 1 && a.target_dp >= 1, "--save needs --target-tp N and --target-dp M (both >= 1)");
  Args r = a;  // defaults: the saved pipeline layout (no virtual stages when PP changes)
  if (r.target_pp == 0) r.target_pp = saved.sizes.pp;
  if (r.target_vp == 0) r.target_vp = r.target_pp == saved.sizes.pp ? saved.sizes.vp : 1;
  if (r.target_ulysses == 0) r.target_ulysses = saved_layout.ulysses;
  DS_USER_CHECK(r.target_ulysses >= 1, "--target-ds-sequence-parallel-size {} must be >= 1", r.target_ulysses);
  DS_USER_CHECK(r.target_pp >= 1 && r.target_vp >= 1 && (r.target_vp == 1 || r.target_pp > 1),
                "--target-pp {} --target-vp {}: both must be >= 1, and virtual stages need --target-pp > 1",
                r.target_pp, r.target_vp);
  ds::ReshapeTarget t;
  const ds::TrainConfig tc = target_config(config, r, src);
  t.model = tc.model;
  t.sizes = {.tp = r.target_tp, .pp = r.target_pp, .vp = r.target_vp};
  t.dp = tc.layout.sdp();  // ZeRO partitions over the sequence-data-parallel ranks (Ulysses x DP)
  t.zero_stage = tc.zero.stage;
  t.config = tc.resolved;
  const fs::path out(a.save);
  const fs::path final_step = out / fs::path(step).filename();
  DS_USER_CHECK(!fs::exists(final_step), "--save {}: '{}' already exists; choose another output directory", a.save,
                final_step.string());
  const bool created = !fs::exists(out);
  try {
    ds::write_reshaped(saved, t, a.save);
  } catch (...) {  // leave nothing half-written: the new directory, or the temporary step directory
    std::error_code ec;
    if (created) fs::remove_all(out, ec);
    else fs::remove_all(out / (".tmp-" + fs::path(step).filename().string()), ec);
    throw;
  }
  std::printf("dsconvert: wrote %s for %s (ZeRO stage %d)\n", final_step.c_str(), tc.layout.describe().c_str(),
              t.zero_stage);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsconvert: reshape a dstrain checkpoint for another tensor/pipeline/data-parallel layout, or "
               "export it as a Hugging Face model"};
  Args a;
  app.add_option("--load", a.load, "Checkpoint directory (holds 'latest' and global_stepN/)")->required();
  app.add_option("--tag", a.tag, "Step directory to read (default: the one 'latest' names)");
  auto* save = app.add_option("--save", a.save, "Output checkpoint directory");
  auto* hf = app.add_option("--export-hf", a.export_hf, "Output directory for a Hugging Face export");
  save->excludes(hf);
  app.add_option("--target-tp", a.target_tp, "Target tensor_model_parallel_size")->needs(save);
  app.add_option("--target-dp", a.target_dp, "Target number of data-parallel ranks")->needs(save);
  app.add_option("--target-pp", a.target_pp, "Target pipeline_model_parallel_size (default: the saved one)")
      ->needs(save);
  app.add_option("--target-vp", a.target_vp,
                 "Target virtual pipeline stages per rank (default: the saved ones if PP is unchanged, else 1)")
      ->needs(save);
  app.add_option("--target-ds-sequence-parallel-size", a.target_ulysses,
                 "Target DeepSpeed-Ulysses sequence parallel size (default: the saved one)")
      ->needs(save);
  app.add_option("--zero-stage", a.zero_stage, "Target ZeRO stage (default: the saved one)")->needs(save);
  try {
    app.parse(argc, argv);
    if (a.save.empty() && a.export_hf.empty()) throw CLI::ValidationError("give --save OUTDIR or --export-hf OUTDIR");
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "dsconvert: error: %s (see dsconvert --help)\n", e.what());
    return 1;
  }
  return ds::run_main("dsconvert", [&] {
    return run(a);
  });
}
