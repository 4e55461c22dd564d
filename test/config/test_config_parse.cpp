// parse_train_config: DeepSpeed keys, our strict sections, Megatron flags over
// the file, family defaults, derived values, validation messages, warnings.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/optim/lr_schedule.h"
#include "test/config/temp_dir.h"

using namespace ds;
using nlohmann::json;
using Catch::Matchers::Contains;

namespace {

using test::TempDir;

TrainConfig parse(std::vector<std::string> args, int world = 1) {
  args.insert(args.begin(), "dstrain");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  return parse_train_config(static_cast<int>(args.size()), argv.data(), world);
}

// Writes `j` as the config file and parses it with extra flags.
TrainConfig parse_json(const json& j, std::vector<std::string> flags = {}, int world = 1) {
  TempDir d;
  const std::string path = d.path + "/ds_config.json";
  std::ofstream(path) << j.dump(2);
  flags.insert(flags.begin(), {"--config", path});
  return parse(flags, world);
}

json base() { return {{"train_micro_batch_size_per_gpu", 2}, {"training", {{"train_iters", 100}}}}; }

json with(json j, const json& patch) {
  j.merge_patch(patch);
  return j;
}

bool has_warning(const TrainConfig& c, const std::string& s) {
  for (const auto& w : c.warnings)
    if (w.find(s) != std::string::npos) return true;
  return false;
}

// Redirects fd 2 into a temp file for the lifetime of the object.
struct StderrCapture {
  FILE* tmp = std::tmpfile();
  int saved = -1;
  StderrCapture() {
    std::fflush(stderr);
    saved = dup(2);
    dup2(fileno(tmp), 2);
  }
  std::string finish() {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::rewind(tmp);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, n);
    std::fclose(tmp);
    return out;
  }
};

}  // namespace

TEST_CASE("flags alone give a complete config", "[config]") {
  auto c = parse({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                  "--micro-batch-size", "2", "--train-iters", "10", "--data-path", "a/b_text_document"},
                 2);
  CHECK(c.model.num_layers == 2);
  CHECK(c.model.hidden_size == 64);
  CHECK(c.model.num_heads == 4);
  CHECK(c.model.ffn_hidden_size == 256);
  CHECK(c.model.max_position_embeddings == 32);  // defaults to seq_length
  CHECK(c.batch.dp_size == 2);
  CHECK(c.batch.train_batch_size == 4);
  CHECK(c.batch.grad_accum_steps == 1);
  CHECK(c.optim.decay_iters == 10);  // = train_iters
  CHECK(c.data.data_path == std::vector<std::string>{"a/b_text_document"});
  CHECK(c.warnings.empty());
  CHECK(c.config_path.empty());
}

TEST_CASE("DeepSpeed keys map onto the config", "[config]") {
  json j = {{"train_batch_size", 32},
            {"gradient_accumulation_steps", 2},
            {"gradient_clipping", 0.5},
            {"steps_per_print", 5},
            {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 3e-4}, {"betas", {0.8, 0.99}}, {"eps", 1e-6},
                                                         {"weight_decay", 0.01}}}}},
            {"fp16", {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 12}, {"loss_scale_window", 500},
                      {"hysteresis", 3}, {"min_loss_scale", 2}}},
            {"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 1000}, {"allgather_bucket_size", 2000},
                                   {"overlap_comm", true}, {"contiguous_gradients", false},
                                   {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}}}},
            {"csv_monitor", {{"enabled", true}, {"output_path", "logs/"}, {"job_name", "run1"}}},
            {"training", {{"train_iters", 50}}}};
  auto c = parse_json(j, {}, 4);
  CHECK(c.batch.micro_batch_size == 4);
  CHECK(c.optim.spec.type == "Adam");
  CHECK(c.optim.lr == Approx(3e-4));
  CHECK(c.optim.beta1 == Approx(0.8));
  CHECK(c.optim.beta2 == Approx(0.99));
  CHECK(c.optim.eps == Approx(1e-6));
  CHECK(c.optim.weight_decay == Approx(0.01));
  CHECK(c.optim.grad_clip == Approx(0.5));
  CHECK(c.log.steps_per_print == 5);
  CHECK(c.log.log_interval == 5);  // steps_per_print is the default log interval
  CHECK(c.precision.precision == Precision::FP16);
  CHECK(c.precision.initial_scale_power == 12);
  CHECK(c.precision.loss_scale_window == 500);
  CHECK(c.precision.hysteresis == 3);
  CHECK(c.precision.min_loss_scale == 2);
  CHECK(c.zero.stage == 2);
  CHECK(c.zero.reduce_bucket_size == 1000);
  CHECK(c.zero.allgather_bucket_size == 2000);
  CHECK(c.zero.overlap_comm);
  CHECK_FALSE(c.zero.contiguous_gradients);
  CHECK(c.zero.offload_optimizer == OffloadDevice::CPU);
  CHECK(c.zero.offload_pin_memory);
  CHECK(c.log.csv_enabled);
  CHECK(c.log.csv_path == "logs/");
  CHECK(c.log.csv_job_name == "run1");
  CHECK(c.warnings.empty());
}

TEST_CASE("zero_optimization.overlap_comm defaults as DeepSpeed's: on at stage 3 only", "[config]") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    json j = base();
    j["zero_optimization"] = {{"stage", stage}};
    CHECK(parse_json(j, {}, 2).zero.overlap_comm == (stage == 3));
    j["zero_optimization"]["overlap_comm"] = stage != 3;  // said explicitly: as said
    CHECK(parse_json(j, {}, 2).zero.overlap_comm == (stage != 3));
  }
  json j = base();
  j["zero_optimization"] = {{"stage", 1}};
  CHECK(parse_json(j, {"--overlap-grad-reduce"}, 2).zero.overlap_comm);
}

TEST_CASE("unknown keys in our sections are errors naming the key", "[config][strict]") {
  CHECK_THROWS_WITH(parse_json(with(base(), {{"model", {{"nmu_layers", 4}}}})), Contains("'model.nmu_layers'"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"training", {{"trian_iters", 4}}}})), Contains("'training.trian_iters'"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"data", {{"datapath", "x"}}}})), Contains("'data.datapath'"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"parallel", {{"tp", 2}}}})), Contains("'parallel.tp'"));
  CHECK_THROWS_AS(parse_json(with(base(), {{"model", {{"nmu_layers", 4}}}})), UserError);
  // Wrong types name the key too.
  CHECK_THROWS_WITH(parse_json(with(base(), {{"model", {{"num_layers", "12"}}}})), Contains("model.num_layers"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"model", {{"norm", "batchnorm"}}}})),
                    Contains("'model.norm' is \"batchnorm\"; expected one of: layernorm, rmsnorm"));
}

TEST_CASE("DeepSpeed keys we do not implement are warned about by name", "[config][warn]") {
  json j = with(base(), {{"communication_data_type", "fp32"},
                         {"prescale_gradients", true},
                         {"zero_optimization", {{"stage", 1}, {"mics_shard_size", 2}, {"reduce_scatter", true}}},
                         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"foo", 1}}}}},
                         {"tensorboard", {{"enabled", false}, {"output_path", "x"}}},
                         {"wandb", {{"enabled", true}}},
                         {"wall_clock_breakdown", false},
                         {"memory_breakdown", true}});
  StderrCapture cap;
  TrainConfig c;
  try {
    c = parse_json(j);
  } catch (...) {
    cap.finish();
    throw;
  }
  const std::string err = cap.finish();
  CHECK(has_warning(c, "DeepSpeed key 'communication_data_type' is not implemented"));
  CHECK_FALSE(has_warning(c, "prescale_gradients"));  // f32 reduction: either value is the same
  CHECK(has_warning(c, "'zero_optimization.mics_shard_size'"));
  CHECK(has_warning(c, "'optimizer.params.foo'"));
  CHECK(has_warning(c, "'wandb' (enabled)"));
  CHECK(has_warning(c, "'memory_breakdown' = true"));
  CHECK_FALSE(has_warning(c, "tensorboard"));       // disabled: nothing ignored
  CHECK_FALSE(has_warning(c, "reduce_scatter"));    // true is what we do
  CHECK_FALSE(has_warning(c, "wall_clock_breakdown"));
  CHECK(c.warnings.size() == 5);
  CHECK_THAT(err, Contains("warning: config: DeepSpeed key 'communication_data_type' is not implemented by dstrain"));
  CHECK_FALSE(c.log.wall_clock_breakdown);
  CHECK(parse_json(with(base(), {{"wall_clock_breakdown", true}})).log.wall_clock_breakdown);
  CHECK(parse_json(with(base(), {{"wall_clock_breakdown", true}})).warnings.empty());
  CHECK(parse_json(with(base(), {{"data_types", {{"grad_accum_dtype", "fp32"}}}})).warnings.empty());
  CHECK_THROWS_WITH(parse_json(with(base(), {{"prescale_gradients", 2}})), Contains("prescale_gradients"));
}

TEST_CASE("DeepSpeed features dstrain lacks: refused where they change the training, else one line", "[config]") {
  // Refused when on, silent when off.
  for (const char* sec : {"amp", "torch_autocast", "progressive_layer_drop"}) {
    INFO(sec);
    CHECK_THROWS_WITH(parse_json(with(base(), {{sec, {{"enabled", true}}}})),
                      Contains(std::string("'") + sec + ".enabled' is true") && Contains("not implemented by dstrain"));
    CHECK(parse_json(with(base(), {{sec, {{"enabled", false}, {"opt_level", "O1"}}}})).warnings.empty());
  }
  CHECK_THROWS_WITH(parse_json(with(base(), {{"fp16", {{"enabled", true}, {"fp16_master_weights_and_grads", true}}}})),
                    Contains("'fp16.fp16_master_weights_and_grads' is true: master weights and gradients in 16 bits"));
  CHECK(parse_json(with(base(), {{"fp16", {{"enabled", true}, {"fp16_master_weights_and_grads", false}}}}))
            .warnings.empty());
  // ZeRO++'s quantized communication: refused at stage 3, inert below it (as upstream).
  for (const char* key : {"zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"}) {
    INFO(key);
    CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {key, true}}}})),
                      Contains(std::string("'zero_optimization.") + key + "' is true: ZeRO++'s quantized"));
    const TrainConfig c = parse_json(with(base(), {{"zero_optimization", {{"stage", 2}, {key, true}}}}));
    CHECK(has_warning(c, std::string(key) + "' has no effect below stage 3"));
    CHECK(c.warnings.size() == 1);
  }
  CHECK(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"zero_quantized_weights", false},
                                                        {"zeropp_loco_param", {{"err_beta", 0.8}}}}}}))
            .warnings.empty());
  // hpZ and MiCS: the same values, another partition: one line each.
  const TrainConfig hpz = parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"zero_hpz_partition_size", 8}}}}));
  CHECK(has_warning(hpz, "'zero_optimization.zero_hpz_partition_size' 8 (hpZ's secondary partition) is not implemented"));
  CHECK(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"zero_hpz_partition_size", 1}}}})).warnings.empty());
  CHECK(has_warning(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"mics_shard_size", 4}}}})),
                    "(MiCS) is not implemented"));
  // The deprecated offload aliases mean what DeepSpeed makes of them.
  const TrainConfig alias = parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"cpu_offload", true},
                                                                            {"cpu_offload_param", true}}}}));
  CHECK(alias.zero.offload_optimizer == OffloadDevice::CPU);
  CHECK(alias.zero.offload_param == OffloadDevice::CPU);
  CHECK(has_warning(alias, "'zero_optimization.cpu_offload' is deprecated (as in DeepSpeed): read as "
                           "offload_optimizer.device cpu"));
  CHECK(parse_json(with(base(), {{"zero_optimization", {{"stage", 2}, {"cpu_offload", false}}}})).zero.offload_optimizer ==
        OffloadDevice::None);
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 2}, {"cpu_offload", true},
                                                                    {"offload_optimizer", {{"device", "cpu"}}}}}})),
                    Contains("'zero_optimization.cpu_offload' (deprecated) and 'zero_optimization.offload_optimizer' "
                             "are both given"));
  CHECK(has_warning(parse_json(with(base(), {{"zero_optimization", {{"stage", 2}, {"cpu_offload_use_pin_memory", true}}}})),
                    "cpu_offload_use_pin_memory' is deprecated and sets nothing"));
  // load_from_fp32_weights is read (the trainer honours it); sparse_attention is inert upstream for GPT models.
  CHECK_FALSE(parse_json(with(base(), {{"zero_optimization", {{"stage", 1}, {"load_from_fp32_weights", false}}}}))
                  .zero.load_from_fp32_weights);
  CHECK(parse_json(base()).zero.load_from_fp32_weights);
  CHECK(has_warning(parse_json(with(base(), {{"sparse_attention", {{"mode", "fixed"}}}})), "SparseSelfAttention"));
  // gradient_predivide_factor changes only the rounding of an f32 reduction.
  CHECK(parse_json(with(base(), {{"gradient_predivide_factor", 4.0}})).warnings.empty());
  CHECK_THROWS_WITH(parse_json(with(base(), {{"gradient_predivide_factor", 0}})),
                    Contains("'gradient_predivide_factor' must be > 0, got 0"));
}

TEST_CASE("Compression and data efficiency: refused when they would act, noted when inert", "[config]") {
  auto quant = [](bool on) {
    return json{{"weight_quantization",
                 {{"shared_parameters", {{"enabled", on}, {"quantizer_kernel", false}}},
                  {"different_groups", {{"wq1", {{"params", {{"start_bits", 12}, {"target_bits", 4}}}}}}}}}};
  };
  // Weight (MoQ) and activation quantization are implemented (test/train/test_compression.cpp); MoQ is fp16-only.
  CHECK_THROWS_WITH(parse_json(with(base(), {{"compression_training", quant(true)}})),
                    Contains("weight_quantization (MoQ: quantizing in the optimizer step) is only supported with fp16"));
  json pruning = {{"sparse_pruning", {{"shared_parameters", {{"enabled", true}}}}}};
  CHECK_THROWS_WITH(parse_json(with(base(), {{"compression_training", pruning}})),
                    Contains("'compression_training.sparse_pruning.shared_parameters.enabled' is true"));
  // Activation quantization is implemented (test/train/test_compression.cpp); its groups are required.
  json act = {{"activation_quantization", {{"shared_parameters", {{"enabled", true}}}}}};
  CHECK_THROWS_WITH(parse_json(with(base(), {{"compression_training", act}})),
                    Contains("'compression_training.activation_quantization.different_groups' is required"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"compression_training", {{"layer_reduction", {{"enabled", true}}}}}})),
                    Contains("'compression_training.layer_reduction.enabled' is true: Megatron-DeepSpeed cannot run "
                             "it either"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"compression_training", 3}})),
                    Contains("'compression_training' must be a JSON object"));
  const TrainConfig inert = parse_json(with(base(), {{"compression_training", quant(false)}}));
  CHECK(has_warning(inert, "'compression_training' enables no technique"));
  CHECK(inert.warnings.size() == 1);  // no "key not implemented" line besides it

  // The data-sampling curriculum without Megatron's flag is inert (one line); DeepSpeed's parser still asserts
  // that an enabled section names its metrics. With the flag: test/train/test_data_sampling.cpp.
  json sampling = {{"enabled", true},
                   {"data_sampling",
                    {{"enabled", true}, {"curriculum_learning", {{"enabled", true}, {"curriculum_metrics", json::object()}}}}}};
  const TrainConfig s = parse_json(with(base(), {{"data_efficiency", sampling}}));
  CHECK(has_warning(s, "--data-efficiency-curriculum-learning"));
  CHECK(s.warnings.size() == 1);
  sampling["data_sampling"]["curriculum_learning"]["enabled"] = false;  // off: nothing to say
  CHECK(parse_json(with(base(), {{"data_efficiency", sampling}})).warnings.empty());
  sampling["data_sampling"]["curriculum_learning"] = {{"enabled", true}};
  CHECK_THROWS_WITH(parse_json(with(base(), {{"data_efficiency", sampling}})),
                    Contains("curriculum_learning.curriculum_metrics' must be given"));
  // data_efficiency/gpt's flags: the curriculum flag needs the section; the index maps go together.
  CHECK_THROWS_WITH(parse_json(base(), {"--data-efficiency-curriculum-learning"}),
                    Contains("--data-efficiency-curriculum-learning needs data_efficiency.data_sampling"));
  CHECK_THROWS_WITH(parse_json(base(), {"--train-doc-idx-path", "/d/doc_idx.npy"}),
                    Contains("--train-doc-idx-path, --train-sample-idx-path and --train-shuffle-idx-path go together"));
}

TEST_CASE("random-LTD: DeepSpeed's section with Megatron-DeepSpeed's --random-ltd", "[config]") {
  auto section = [](const json& patch = json::object()) {
    json r = {{"enabled", true},
              {"total_layer_num", 12},
              {"random_ltd_layer_num", 3},
              {"random_ltd_layer_id", {5, 1, 2}},
              {"model_mask_name", "attention_mask"},
              {"model_type", "decoder"},
              {"hidden_state_order", "seq_batch_dim"},
              {"random_ltd_schedule",
               {{"min_value", 128},
                {"max_value", 1024},
                {"schedule_type", "fixed_linear"},
                {"schedule_config", {{"require_steps", 200}, {"seq_per_step", 16}}}}}};
    r.merge_patch(patch);
    return with(base(), {{"data_efficiency", {{"enabled", true}, {"data_routing", {{"enabled", true}, {"random_ltd", r}}}}}});
  };
  const TrainConfig c = parse_json(section(), {"--random-ltd"});
  REQUIRE(c.random_ltd.active());
  CHECK(c.random_ltd.layer_ids == std::vector<int>{1, 2, 5});
  CHECK(c.random_ltd.schedule.min_value == 128);
  CHECK(c.random_ltd.schedule.max_value == 1024);
  CHECK(c.random_ltd.schedule.require_steps == 200);
  CHECK(c.random_ltd.schedule.seq_per_step == 16);
  // The resolved config (what a checkpoint saves) reads back to the same settings.
  const TrainConfig back = ds::train_config_from_json(c.resolved, 1);
  CHECK(back.random_ltd.active());
  CHECK(back.random_ltd.layer_ids == c.random_ltd.layer_ids);
  CHECK(back.random_ltd.schedule.max_value == 1024);
  // Upstream: the section alone converts no layer; the flag alone fails its assertion.
  const TrainConfig inert = parse_json(section());
  CHECK(!inert.random_ltd.active());
  CHECK(has_warning(inert, "enabled without --random-ltd: no layer drops tokens"));
  CHECK_THROWS_WITH(parse_json(base(), {"--random-ltd"}),
                    Contains("--random-ltd needs data_efficiency.data_routing.random_ltd.enabled true"));
  // DeepSpeed's keys and their rules.
  json no_ids = section();
  no_ids["data_efficiency"]["data_routing"]["random_ltd"].erase("random_ltd_layer_id");
  CHECK_THROWS_WITH(parse_json(no_ids, {"--random-ltd"}),
                    Contains("'data_efficiency.data_routing.random_ltd.random_ltd_layer_id' is required"));
  CHECK_THROWS_WITH(parse_json(section({{"random_ltd_layer_num", 2}}), {"--random-ltd"}),
                    Contains("random_ltd_layer_num' is 2 but random_ltd_layer_id lists 3 layers"));
  CHECK_THROWS_WITH(parse_json(section({{"model_type", "encoder"}}), {"--random-ltd"}),
                    Contains("model_type' is \"encoder\""));
  CHECK_THROWS_WITH(parse_json(section({{"random_ltd_schedule", {{"schedule_type", "fixed_root"}}}}), {"--random-ltd"}),
                    Contains("supports only \"fixed_linear\""));
  CHECK_THROWS_WITH(parse_json(section({{"random_ltd_schedule", {{"schedule_config", {{"require_steps", 0}}}}}}),
                               {"--random-ltd"}),
                    Contains("require_steps' must be a positive integer"));
  CHECK_THROWS_WITH(parse_json(section({{"layer_token_lr_schedule", {{"enabled", true}}}}), {"--random-ltd"}),
                    Contains("layer-token learning-rate schedule"));
  CHECK_THROWS_WITH(parse_json(section({{"random_ltd_layer_id", {1, 2, 12}}}), {"--random-ltd"}),
                    Contains("names layer 12, but the model has 12 layers"));
  // Layouts it cannot run in, each named.
  CHECK_THROWS_WITH(parse_json(section(), {"--random-ltd", "--pipeline-model-parallel-size", "2"}, 2),
                    Contains("--random-ltd with --pipeline-model-parallel-size 2"));
  CHECK_THROWS_WITH(
      parse_json(section(), {"--random-ltd", "--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2),
      Contains("--random-ltd with --sequence-parallel"));
  CHECK_THROWS_WITH(parse_json(section(), {"--random-ltd", "--position-embedding-type", "rope"}),
                    Contains("--random-ltd with rotary position embeddings"));
}

TEST_CASE("data_types.grad_accum_dtype: fp32 or the compute dtype", "[config]") {
  auto types = [](const std::string& acc, const std::string& precision) {
    json j = with(base(), {{"data_types", {{"grad_accum_dtype", acc}}}});
    if (!precision.empty()) j[precision] = {{"enabled", true}};
    return parse_json(j);
  };
  CHECK(parse_json(base()).precision.grad_accum == ds::DType::F32);  // default: fp32 accumulation
  CHECK(parse_json(with(base(), {{"bf16", {{"enabled", true}}}})).precision.grad_accum == ds::DType::F32);
  CHECK(types("fp32", "bf16").precision.grad_accum == ds::DType::F32);
  CHECK(types("bf16", "bf16").precision.grad_accum == ds::DType::BF16);
  CHECK(types("bfloat16", "bf16").precision.grad_accum == ds::DType::BF16);
  CHECK(types("fp16", "fp16").precision.grad_accum == ds::DType::F16);
  CHECK(types("fp16", "fp16").warnings.empty());
  CHECK_THROWS_WITH(types("bf16", ""), Contains("'data_types.grad_accum_dtype' is 'bf16' but the model computes in "
                                                "fp32"));
  CHECK_THROWS_WITH(types("fp16", "bf16"), Contains("'data_types.grad_accum_dtype' is 'fp16' but the model computes "
                                                    "in bf16"));
  CHECK_THROWS_WITH(types("int8", "bf16"), Contains("'data_types.grad_accum_dtype' is 'int8'"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"data_types", {{"grad_accum_dtype", 16}}}})),
                    Contains("data_types.grad_accum_dtype"));
  // The flag that turns bf16 on is applied before the check (flags patch the JSON).
  CHECK(parse_json(with(base(), {{"data_types", {{"grad_accum_dtype", "bf16"}}}}), {"--bf16"}).precision.grad_accum ==
        ds::DType::BF16);
  CHECK(has_warning(parse_json(with(base(), {{"data_types", {{"grad_accum_dtype", "fp32"}, {"other", 1}}}})),
                    "data_types.other"));
  json off = with(base(), {{"data_types", {{"grad_accum_dtype", "bf16"}}},
                           {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  off["bf16"] = {{"enabled", true}};
  // On a GPU the host AdamW reads f32 gradients; on the CPU backend the step
  // reads the shard where it is.
  CHECK_THROWS_WITH(parse_json(off, {"--device", "cuda"}),
                    Contains("'bf16' with zero_optimization.offload_optimizer.device cpu on a GPU is not supported"));
  CHECK(parse_json(off).precision.grad_accum == ds::DType::BF16);
}

TEST_CASE("flags override the file", "[config][flags]") {
  json j = with(base(), {{"model", {{"hidden_size", 128}, {"num_heads", 4}, {"num_layers", 2}}},
                         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"betas", {0.9, 0.999}}}}}},
                         {"data", {{"split", "98,2,0"}}}});
  auto c = parse_json(j, {"--hidden-size", "256", "--lr", "2e-4", "--adam-beta2", "0.95", "--split", "90,5,5",
                          "--data-path", "0.3", "a", "0.7", "b", "--zero-stage", "1", "--bf16"});
  CHECK(c.model.hidden_size == 256);
  CHECK(c.model.num_layers == 2);
  CHECK(c.optim.lr == Approx(2e-4));
  CHECK(c.optim.beta1 == Approx(0.9));
  CHECK(c.optim.beta2 == Approx(0.95));
  CHECK(c.data.split == "90,5,5");
  CHECK(c.data.data_path == std::vector<std::string>{"0.3", "a", "0.7", "b"});
  CHECK(c.zero.stage == 1);
  CHECK(c.precision.precision == Precision::BF16);
  // --bf16 wins over the file's fp16.
  CHECK(parse_json(with(base(), {{"fp16", {{"enabled", true}}}}), {"--bf16"}).precision.precision == Precision::BF16);
}

TEST_CASE("Megatron batch flags derive gradient accumulation", "[config][flags][batch]") {
  json j = {{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 4}};
  auto c = parse_json(j, {"--global-batch-size", "128"}, 4);
  CHECK(c.batch.train_batch_size == 128);
  CHECK(c.batch.micro_batch_size == 4);
  CHECK(c.batch.grad_accum_steps == 8);  // 128 / (4 * 4)
  c = parse({"--global-batch-size", "64", "--micro-batch-size", "2"}, 8);
  CHECK(c.batch.grad_accum_steps == 4);
  CHECK_THROWS_WITH(parse({"--global-batch-size", "60", "--micro-batch-size", "2"}, 8),
                    Contains("train_batch_size 60 is not divisible by train_micro_batch_size_per_gpu 2 * data "
                             "parallel size 8 (= 16)"));
  // File triple inconsistent with the world size.
  CHECK_THROWS_WITH(parse_json(j, {}, 2), Contains("train_batch_size 64 != train_micro_batch_size_per_gpu 4 * "
                                                   "gradient_accumulation_steps 4 * data parallel size 2 (= 32)"));
}

TEST_CASE("model family defaults and explicit overrides", "[config][family]") {
  auto g = parse_json(base());
  CHECK(g.model.family == ModelFamily::GPT2);
  CHECK(g.model.norm == NormKind::LayerNorm);
  CHECK(g.model.activation == Activation::GELU);
  CHECK(g.model.position == PositionKind::Learned);
  CHECK(g.model.bias);
  CHECK_FALSE(g.model.untie_embeddings);
  CHECK(g.model.ffn_hidden_size == 3072);

  auto l = parse_json(with(base(), {{"model", {{"family", "llama"}, {"hidden_size", 4096}, {"num_heads", 32},
                                               {"num_layers", 2}, {"seq_length", 4096}}}}));
  CHECK(l.model.family == ModelFamily::LLaMA);
  CHECK(l.model.norm == NormKind::RMSNorm);
  CHECK(l.model.activation == Activation::SwiGLU);
  CHECK(l.model.position == PositionKind::Rope);
  CHECK_FALSE(l.model.bias);
  CHECK(l.model.untie_embeddings);
  CHECK(l.model.ffn_hidden_size == 10880);  // int(4*4096*2/3/64)*64

  auto o = parse_json(with(base(), {{"model", {{"family", "LLaMA"}, {"bias", true}, {"position", "learned"}}}}));
  CHECK(o.model.bias);
  CHECK(o.model.position == PositionKind::Learned);
  CHECK(o.model.norm == NormKind::RMSNorm);

  // GPT-2 family turned LLaMA-like with Megatron flags.
  auto f = parse_json(base(), {"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                               "--disable-bias-linear", "--untie-embeddings-and-output-weights"});
  CHECK(f.model.activation == Activation::SwiGLU);
  CHECK(f.model.ffn_hidden_size == 2048);  // C = 768
  CHECK(f.model.norm == NormKind::RMSNorm);
  CHECK(f.model.position == PositionKind::Rope);
  CHECK_FALSE(f.model.bias);
  CHECK(f.model.untie_embeddings);
}

TEST_CASE("vocab padding is applied when the vocab size is known", "[config][vocab]") {
  auto c = parse_json(with(base(), {{"model", {{"vocab_size", 50257}}}}));
  CHECK(c.model.padded_vocab_size == 50304);
  c = parse_json(with(base(), {{"model", {{"vocab_size", 50257}}}}), {"--tensor-model-parallel-size", "2"}, 2);
  CHECK(c.model.padded_vocab_size == 50432);
  CHECK(parse_json(base()).model.padded_vocab_size == 0);  // resolved later from the tokenizer
}

TEST_CASE("validation errors name the fields and values", "[config][validate]") {
  auto model = [](const json& m) { return with(base(), {{"model", m}}); };
  CHECK_THROWS_WITH(parse_json(model({{"hidden_size", 100}, {"num_heads", 12}})),
                    Contains("model.hidden_size 100 is not divisible by model.num_heads 12"));
  CHECK_THROWS_WITH(parse_json(model({{"num_heads", 12}}), {"--tensor-model-parallel-size", "5"}, 5),
                    Contains("model.num_heads 12 is not divisible by tensor_model_parallel_size 5"));
  CHECK_THROWS_WITH(parse_json(model({{"hidden_size", 64}, {"num_heads", 4}, {"ffn_hidden_size", 102}}),
                               {"--tensor-model-parallel-size", "4"}, 4),
                    Contains("model.ffn_hidden_size 102 is not divisible by tensor_model_parallel_size 4"));
  CHECK_THROWS_WITH(parse_json(model({{"seq_length", 2048}, {"max_position_embeddings", 1024}})),
                    Contains("model.seq_length 2048 exceeds model.max_position_embeddings 1024"));
  // RoPE has no position table: no limit.
  CHECK_NOTHROW(parse_json(model({{"seq_length", 2048}, {"max_position_embeddings", 1024}, {"position", "rope"}})));
  CHECK_THROWS_WITH(parse_json(base(), {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, 6),
                    Contains("world size 6 is not divisible by tensor_model_parallel_size 2 * "
                             "pipeline_model_parallel_size 2"));
  CHECK_THROWS_WITH(parse_json(model({{"num_layers", 10}}), {"--pipeline-model-parallel-size", "4"}, 4),
                    Contains("model.num_layers 10 is not divisible by pipeline_model_parallel_size 4"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}})),
                    Contains("fp16.enabled and bf16.enabled are both true"));
  CHECK_THROWS_WITH(parse_json(base(), {"--fp16", "--bf16"}), Contains("fp16.enabled and bf16.enabled are both true"));
  CHECK_THROWS_WITH(parse_json(base(), {"--lr", "-1e-3"}), Contains("must be a finite number >= 0, got -0.001"));
  CHECK_THROWS_WITH(parse_json(base(), {"--lr", "1e-3", "--min-lr", "1e-2"}), Contains("min_lr 0.01 must be in [0, lr 0.001]"));
  CHECK_THROWS_WITH(parse_json(model({{"num_layers", 4}}), {"--pipeline-model-parallel-size", "2", "--zero-stage", "3"}, 2),
                    Contains("zero_optimization.stage 3 cannot be combined with pipeline_model_parallel_size 2"));
  CHECK_THROWS_WITH(parse_json(base(), {"--zero-stage", "4"}), Contains("zero_optimization.stage (--zero-stage) must be 0-3, got 4"));
  CHECK(parse_json(base(), {"--attention-backend", "flash2"}).attention_backend == AttentionBackend::Flash2);
  CHECK_THROWS_WITH(parse_json(base(), {"--attention-backend", "flash3"}),
                    Contains("flash3 not in {flash,flash2,plain,cudnn}"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"training", {{"train_iters", 100}, {"attention_backend", "flash3"}}}})),
                    Contains("training.attention_backend (--attention-backend) 'flash3' must be flash, flash2, plain or cudnn"));
  CHECK_THROWS_WITH(parse_json(base(), {"--split", "90,x"}), Contains("data.split '90,x'"));
  // An over-large hidden size is reported against --hidden-size, never as a wrapped derived size.
  for (const char* act : {"gelu", "swiglu"}) {
    INFO(act);
    std::vector<std::string> f = {"--hidden-size", "2000000000", "--num-attention-heads", "1"};
    if (std::string(act) == "swiglu") f.push_back("--swiglu");
    CHECK_THROWS_WITH(parse_json(base(), f), Contains("model.hidden_size (--hidden-size) 2000000000 is too large") &&
                                                 !Contains("ffn_hidden_size") && !Contains(" -"));
  }
  CHECK_THROWS_WITH(parse_json(base(), {"--split", "0x10,1"}),
                    Contains("data.split '0x10,1': '0x10' is not a non-negative number"));
  CHECK_THROWS_WITH(parse_json(base(), {"--split", "1, 2"}), Contains("' 2' is not a non-negative number"));
  CHECK_THROWS_WITH(parse_json(base(), {"--data-path", "0x10", "a", "1", "b"}), Contains("'0x10' is not a weight"));
  CHECK_THROWS_WITH(parse_json(base(), {"--data-path", "0.5", "a", "0.5"}), Contains("needs pairs"));
  CHECK_THROWS_WITH(parse_json(base(), {"--vocab-file", "v.json"}), Contains("data.merge_file ''"));
  CHECK_THROWS_WITH(parse_json(base(), {"--lr-warmup-iters", "200"}),
                    Contains("lr warmup iterations 200 must be fewer than lr decay iterations 100"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"offload_optimizer", {{"device", "disk"}}}}}})),
                    Contains("offload_optimizer.device 'disk' is not supported"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}}}})),
                    Contains("offload_optimizer.device nvme needs zero_optimization.stage 3"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}}}}}})),
                    Contains("offload_optimizer.nvme_path must name a directory"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"sub_group_size", 0}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}}}})),
                    Contains("zero_optimization.sub_group_size must be > 0, got 0"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 1.5}}}}}})),
                    Contains("offload_optimizer.ratio 1.5 must be in [0, 1]"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.3}}}}}})),
                    Contains("partial offloading is only supported with zero_optimization.stage 3"));
  CHECK(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.3}}}}}}))
            .zero.offload_ratio == 0.3);  // the CPU backend: nothing to place, any ratio trains the same
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.3}}}}}}),
                               {"--device", "cuda"}),
                    Contains("partial offload (part of the optimizer state on the GPU) is not implemented"));
  // NVMe offload with a GPU model: the host optimizer through the tier, f32
  // gradients (the same rule as cpu); offload_param stays on the CPU backend.
  CHECK(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}}}}),
                   {"--device", "cuda"})
            .zero.offload_optimizer == OffloadDevice::NVMe);
  {
    json nv = with(base(), {{"data_types", {{"grad_accum_dtype", "bf16"}}},
                            {"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}}}});
    nv["bf16"] = {{"enabled", true}};
    CHECK_THROWS_WITH(parse_json(nv, {"--device", "cuda"}),
                      Contains("'bf16' with zero_optimization.offload_optimizer.device nvme on a GPU is not supported"));
  }
  // offload_param on a GPU: with the optimizer offloaded too (cpu or nvme).
  CHECK(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}, {"offload_param", {{"device", "nvme"}}}}}}),
                   {"--device", "cuda"})
            .zero.offload_param == OffloadDevice::NVMe);
  const TrainConfig pc = parse_json(
      with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}}}, {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}}}}),
      {"--device", "cuda"});
  CHECK(pc.zero.offload_param == OffloadDevice::CPU);
  CHECK(pc.zero.param_pin_memory);  // the host parameter shard page-locked
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}}}}),
                               {"--device", "cuda"}),
                    Contains("zero_optimization.offload_param with a GPU (--device cuda) needs offload_optimizer too"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}}}, {"offload_param", {{"device", "nvme"}}}}}})),
                    Contains("offload_param.device nvme needs offload_optimizer.device nvme too"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"aio", {{"block_size", 1000}}}, {"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}}}})),
                    Contains("aio.block_size 1000 must be a positive multiple of 4096"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "MuAdam"}}}})),
                    Contains("optimizer.type 'MuAdam' is not supported"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "ZeroOneAdam"}}}, {"zero_optimization", {{"stage", 2}}}})),
                    Contains("0/1 Adam is not compatible with ZeRO (as in DeepSpeed); set zero_optimization.stage 0"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "OneBitLamb"}}}, {"zero_optimization", {{"stage", 1}}}})),
                    Contains("1bit-Lamb is not compatible with ZeRO"));
  // The 1-bit family runs on GPUs.
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"})
    CHECK(parse_json(with(base(), {{"optimizer", {{"type", type}}}, {"zero_optimization", {{"stage", 0}}}}),
                     {"--device", "cuda"})
              .optim.spec.type == type);
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "ZeroOneAdam"}, {"params", {{"var_update_scaler", 0}}}}}})),
                    Contains("'optimizer.params.var_update_scaler' must be >= 1, got 0"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "OneBitLamb"}, {"params", {{"factor_min", 5.0}}}}}})),
                    Contains("must satisfy 0 < factor_min <= factor_max"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "OneBitLamb"}}}}), {"--ds-sequence-parallel-size", "2"}, 2),
                    Contains("optimizer.type OneBitLamb with DeepSpeed-Ulysses"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "Lamb"}}}, {"fp16", {{"enabled", true}, {"loss_scale", 128}}}})),
                    Contains("optimizer.type Lamb requires dynamic loss scaling with fp16 (as in DeepSpeed)"));
  {
    const TrainConfig z = parse_json(with(base(), {{"optimizer", {{"type", "zerooneadam"}, {"params", {{"var_freeze_step", 7}, {"local_step_clipper", 8}}}}}}));
    CHECK(z.optim.spec.type == "ZeroOneAdam");
    CHECK(z.optim.spec.var_freeze_step == 7);
    CHECK(z.optim.spec.local_step_clipper == 8);
    CHECK(z.optim.spec.var_update_scaler == 16);  // DeepSpeed's defaults
    CHECK(z.optim.spec.local_step_scaler == 32678);
    CHECK_FALSE(z.optim.spec.compress_param_groups);  // fp32: one compression unit per tensor
    CHECK(parse_json(with(base(), {{"optimizer", {{"type", "OneBitAdam"}}}, {"fp16", {{"enabled", true}}}}))
              .optim.spec.compress_param_groups);  // fp16: per parameter group, as DeepSpeed's fp16 wrapper
    CHECK_FALSE(parse_json(with(base(), {{"optimizer", {{"type", "OneBitLamb"}}}, {"fp16", {{"enabled", true}}}}))
                    .optim.spec.compress_param_groups);  // (1-bit Lamb flattens everything anyway)
    const TrainConfig l = parse_json(with(base(), {{"optimizer", {{"type", "OneBitLamb"}, {"params", {{"freeze_step", 9}, {"coeff_beta", 0.8}}}}}}));
    CHECK(l.optim.spec.freeze_step == 9);
    CHECK(l.optim.spec.coeff_beta == 0.8f);
    CHECK(l.optim.spec.factor_max == 4.0f);
    CHECK(l.optim.spec.factor_threshold == 0.1f);
  }
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "OneBitAdam"}}}, {"zero_optimization", {{"stage", 1}}}})),
                    Contains("1bit-Adam is not compatible with ZeRO (as in DeepSpeed); set zero_optimization.stage 0"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"freeze_step", 0}}}}}})),
                    Contains("'optimizer.params.freeze_step' must be >= 1, got 0"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"comm_backend_name", "gloo"}}}}}})),
                    Contains("'optimizer.params.comm_backend_name' 'gloo' must be nccl, mpi, compressed or hccl"));
  CHECK(parse_json(with(base(), {{"optimizer", {{"type", "onebitadam"}, {"params", {{"freeze_step", 7}}}}}})).optim.spec
            .freeze_step == 7);
  CHECK_THROWS_WITH(parse_json(with(base(), {{"train_batch_size", 0}})),
                    Contains("'train_batch_size' must be a positive integer, got 0"));
  CHECK_THROWS_WITH(parse_json(base(), {"--device", "tpu"}), Contains("--device"));
  CHECK_THROWS_WITH(parse_json(base(), {"--seed", "-1"}), Contains("'training.seed' (--seed) must be a non-negative"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_size", -1}}}})),
                    Contains("stage3_prefetch_bucket_size -1, stage3_max_live_parameters"));
  CHECK_THROWS_WITH(parse_json(base(), {"--lr", "inf"}), Contains("--lr) must be a finite number >= 0, got inf"));
  CHECK_THROWS_WITH(parse_json(base(), {"--train-iters", "-1"}),
                    Contains("training.train_iters (--train-iters) must be >= 0, got -1"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"scheduler", {{"type", "WarmupCosineLR"},
                                                            {"params", {{"total_num_steps", 10}, {"cos_min_ratio", -1}}}}}})),
                    Contains("cos_min_ratio -1 and warmup_min_ratio 0 must be in [0, 1]"));
  // Sizes past any machine are refused before a layout is built (which would take hours).
  CHECK_THROWS_WITH(parse_json(base(), {"--num-layers", "2000000000"}),
                    Contains("model.num_layers (--num-layers) 2000000000 is more than the 65536 layers"));
  CHECK_THROWS_WITH(parse_json(base(), {"--hidden-size", "1000000", "--num-attention-heads", "2", "--num-layers", "2"}),
                    Contains("make at least 2e+13 parameters, more than the 1e+13 dstrain supports"));
  // A section of the file that is not an object is the file's error, even when a flag writes into it.
  CHECK_THROWS_WITH(parse_json(with(base(), {{"model", {1}}}), {"--num-layers", "2"}),
                    Contains("config: 'model' must be a JSON object, got [1] (so --num-layers cannot set it)"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"optimizer", {{"params", {1}}}}}), {"--lr", "0.1"}),
                    Contains("config: 'optimizer.params' must be a JSON object, got [1]"));
  CHECK(parse_json(base(), {"--seed", "5"}).seed == 5u);
}

TEST_CASE("hf2megads_weight_converter.py's flags: dstrain converts instead of training", "[config][flags]") {
  TempDir d;
  const std::string path = d.path + "/c.json";
  std::ofstream(path) << base().dump();
  const TrainConfig to_mds = parse({"--config", path, "--hf-ckpt-num-shards", "2", "--hf-ckpt-dir", "/m/llama-hf",
                                    "--load-mode", "auto", "--save", "/o/mds", "--train-iters", "3500"});
  CHECK(to_mds.ckpt.hf_convert);
  CHECK(to_mds.ckpt.init_from == "/m/llama-hf");
  CHECK(to_mds.ckpt.save_dir == "/o/mds");
  CHECK(to_mds.train_iters == 0);
  const TrainConfig to_hf = parse({"--config", path, "--hf-ckpt-dir", "/m/llama-hf", "--to-hf-ckpt", "--load",
                                   "/o/mds", "--save", "/m/llama-hf-hf-out"});
  CHECK(!to_hf.ckpt.hf_convert);
  CHECK(to_hf.ckpt.export_hf == "/m/llama-hf-hf-out");
  CHECK(to_hf.ckpt.save_dir.empty());
  CHECK(to_hf.ckpt.load_dir == "/o/mds");
  CHECK(to_hf.train_iters == 0);
  CHECK_THROWS_WITH(parse({"--config", path, "--hf-ckpt-dir", "/m"}), Contains("--hf-ckpt-dir converts /m into --save"));
  CHECK_THROWS_WITH(parse({"--config", path, "--hf-ckpt-dir", "/m", "--save", "/o", "--load-mode", "pickle"}),
                    Contains("--load-mode pickle: expected auto, torchbin or safetensor"));
  CHECK_THROWS_WITH(parse({"--config", path, "--to-hf-ckpt"}),
                    Contains("--to-hf-ckpt belongs to the Hugging Face conversion"));
}

TEST_CASE("command line handling", "[config][flags]") {
  TempDir d;
  const std::string path = d.path + "/c.json";
  std::ofstream(path) << base().dump();
  auto c = parse({"--local_rank=3", "--deepspeed", "--deepspeed_config", path, "--use-flash-attn"});
  CHECK(c.config_path == path);
  CHECK(c.train_iters == 100);
  CHECK_THROWS_WITH(parse({"--config", path, "--num-layerz", "2"}), Contains("--num-layerz"));
  CHECK_THROWS_WITH(parse({"--config", path, "--normalization", "BatchNorm"}), Contains("--normalization"));
  // Unknown arguments as written (CLI11 alone lists them reversed).
  CHECK_THROWS_WITH(parse({"--config", path, "--num-shards-x", "2", "--mode-y", "auto"}),
                    Contains("unrecognised arguments: --num-shards-x 2 --mode-y auto (see dstrain --help)"));
  CHECK_THROWS_WITH(parse({"--config", d.path + "/missing.json"}), Contains("missing.json"));
  std::ofstream(d.path + "/bad.json") << "{ \"train_batch_size\": 8, ";
  CHECK_THROWS_WITH(parse({"--config", d.path + "/bad.json"}), Contains("bad.json' is not valid JSON"));
  CHECK_THROWS_WITH(parse({"--config", d.path}), Contains("config file '" + d.path + "' is a directory"));
  auto h = parse({"--help"});
  CHECK_THAT(h.help_text, Contains("--num-layers"));
  CHECK_THAT(h.help_text, Contains("--deepspeed_config"));
}

TEST_CASE("the resolved config parses back to itself", "[config][resolved]") {
  json j = with(base(), {{"model", {{"family", "llama"}, {"num_layers", 4}, {"hidden_size", 256}, {"num_heads", 8},
                                    {"vocab_size", 1000}}},
                         {"scheduler", {{"type", "WarmupCosineLR"},
                                        {"params", {{"warmup_num_steps", 10}, {"cos_min_ratio", 0.1}}}}},
                         {"bf16", {{"enabled", true}}}});
  auto c = parse_json(j, {"--lr", "3e-4", "--log-interval", "7"}, 2);
  auto c2 = train_config_from_json(c.resolved, 2);
  CHECK(c2.resolved == c.resolved);
  CHECK(c.resolved["optimizer"]["params"]["lr"].get<double>() == 0.0003);  // shortest decimal, not 0.00030000001
  CHECK(c.resolved["scheduler"]["params"]["total_num_steps"] == 100);
  CHECK(c.resolved["training"]["log_interval"] == 7);
  CHECK(c.resolved["model"]["padded_vocab_size"].is_null());  // derived values stay out of the input layout
  auto m = parse_json(base(), {"--lr-decay-style", "linear", "--lr-warmup-fraction", "0.1"});
  CHECK(train_config_from_json(m.resolved, 1).resolved == m.resolved);
  CHECK(m.resolved["training"]["lr_warmup_iters"] == 10);
}

TEST_CASE("schedule keys and flags", "[config][lr]") {
  auto c = parse_json(with(base(), {{"training", {{"lr_decay_style", "linear"}, {"lr_warmup_iters", 5},
                                                  {"min_lr", 1e-5}, {"lr_decay_iters", 80}}}}));
  CHECK(c.optim.scheduler == LrScheduler::Megatron);
  CHECK(c.optim.decay == LrDecay::Linear);
  CHECK(c.optim.warmup_iters == 5);
  CHECK(c.optim.decay_iters == 80);
  CHECK(c.optim.min_lr == Approx(1e-5));
  // DeepSpeed scheduler defaults: warmup_type log, WarmupDecayLR peak 0.001.
  auto d = parse_json(with(base(), {{"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 90}}}}}}));
  CHECK(d.optim.scheduler == LrScheduler::WarmupDecayLR);
  CHECK(d.optim.warmup_type == WarmupKind::Log);
  CHECK(d.optim.warmup_iters == 1000);
  CHECK(d.optim.decay_iters == 90);
  CHECK(d.optim.lr == Approx(0.001));
  CHECK(has_warning(d, "total_num_steps 90 is less than warmup_num_steps 1000"));
  // Flags land in the DeepSpeed scheduler when there is one.
  auto e = parse_json(with(base(), {{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", 1e-3}}}}}}),
                      {"--lr", "5e-4", "--lr-warmup-iters", "20"});
  CHECK(e.optim.lr == Approx(5e-4));
  CHECK(e.optim.warmup_iters == 20);
  CHECK(lr_at(e.optim, 1000, e.train_iters) == Approx(5e-4));
  // --lr-decay-style replaces the DeepSpeed scheduler (with a warning).
  auto f = parse_json(with(base(), {{"scheduler", {{"type", "WarmupLR"}}}}), {"--lr-decay-style", "cosine"});
  CHECK(f.optim.scheduler == LrScheduler::Megatron);
  CHECK(has_warning(f, "--lr-decay-style replaces the config's scheduler (WarmupLR)"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"scheduler", {{"type", "WarmupLR"}}}}), {"--min-lr", "1e-5"}),
                    Contains("--min-lr does not apply to the config's scheduler WarmupLR"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"scheduler", {{"type", "OneBitLambSchedule"}}}})),
                    Contains("scheduler.type 'OneBitLambSchedule' is not supported"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "exp"}}}}}})),
                    Contains("warmup_type 'exp' is not supported"));
  CHECK_THROWS_WITH(parse_json(with(base(), {{"scheduler", {{"type", "WarmupLR"}}}, {"training", {{"min_lr", 0.0}}}})),
                    Contains("'training.min_lr' conflicts with the DeepSpeed 'scheduler' section"));
  CHECK_THROWS_WITH(parse_json(base(), {"--lr-warmup-iters", "5", "--lr-warmup-fraction", "0.1"}),
                    Contains("give only one of training.lr_warmup_iters"));
}

TEST_CASE("Megatron-DeepSpeed script flags: mappings, exact no-ops and refusals") {
  // Mappings.
  TrainConfig a = parse_json(base(), {"--checkpoint-activations", "--checkpoint-num-layers", "1",
                                      "--deepspeed-activation-checkpointing", "--use-rotary-position-embeddings",
                                      "--normalization", "rmsnorm", "--exit-duration-in-mins", "30"});
  CHECK(a.parallel.recompute == RecomputeKind::Full);
  CHECK(a.parallel.recompute_num_layers == 0);  // every layer
  CHECK(a.model.position == PositionKind::Rope);
  CHECK(a.model.norm == NormKind::RMSNorm);
  CHECK(a.exit_duration_in_mins == 30);
  TrainConfig u = parse_json(base(), {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                      "--recompute-num-layers", "1"});
  CHECK(u.parallel.recompute_num_layers == 0);
  TrainConfig b = parse_json(with(base(), {{"model", {{"num_layers", 4}}}}),
                             {"--recompute-granularity", "full", "--recompute-method", "block"});
  CHECK(b.parallel.recompute_num_layers == 1);  // Megatron's default N for block
  // Exact no-ops: they parse and change nothing.
  const std::vector<std::string> no_ops = {"--data-impl", "mmap", "--no-async-tensor-model-parallel-allreduce",
                                           "--num-workers", "2",
                                           "--no-query-key-layer-scaling", "--use-flash-attn-v2",
                                           "--optimizer", "adam", "--ds-sequence-parallel-size", "1",
                                           "--rotary-percent", "1.0", "--no-pipeline-parallel",
                                           "--no-masked-softmax-fusion", "--no-bias-dropout-fusion",
                                           "--no-gradient-accumulation-fusion", "--openai-gelu",
                                           "--no-bias-gelu-fusion"};
  CHECK(parse_json(base(), no_ops).resolved == parse_json(base()).resolved);
  // Values that cannot be honoured: one error naming the flag.
  auto err = [&](std::vector<std::string> flags, const std::string& needle) {
    CHECK_THROWS_WITH(parse_json(base(), flags), Contains(needle));
  };
  err({"--data-impl", "lazy"}, "--data-impl lazy");
  // Megatron's unfused GELU is erf: a GELU model refuses, SwiGLU does not care.
  err({"--no-bias-gelu-fusion"}, "--no-bias-gelu-fusion: Megatron then computes the exact erf GELU");
  CHECK(parse_json(base(), {"--swiglu", "--no-bias-gelu-fusion"}).resolved ==
        parse_json(base(), {"--swiglu"}).resolved);
  // --cpu-optimizer is ZeRO-Offload's CPU Adam: without offload it cannot hold.
  err({"--cpu-optimizer"}, "--cpu-optimizer: the optimizer runs on the CPU only with ZeRO-Offload");
  err({"--cpu_torch_adam"}, "--cpu_torch_adam needs --cpu-optimizer");
  const json offload = with(base(), {{"zero_optimization", {{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  CHECK(parse_json(offload, {"--cpu-optimizer", "--cpu_torch_adam"}).resolved == parse_json(offload).resolved);
  err({"--use-checkpoint-opt_param-scheduler", "--override-opt_param-scheduler"}, "give at most one");
  err({"--no-pipeline-parallel", "--pipeline-model-parallel-size", "2"}, "--no-pipeline-parallel");
  err({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"},
      "--recompute-method uniform");
  err({"--checkpoint-num-layers", "2"}, "--checkpoint-num-layers");
  err({"--exit-duration-in-mins", "-1"}, "exit_duration_in_mins");
}

TEST_CASE("Megatron-DeepSpeed script flags: universal checkpoints, logging and memory placement") {
  // --universal-checkpoint is exact: every checkpoint reshapes on load.
  CHECK(parse_json(base(), {"--universal-checkpoint"}).resolved == parse_json(base()).resolved);
  CHECK(parse_json(base(), {"--rotary-position-embeddings-theta", "500000"}).model.rope_theta == Approx(500000));
  // Settings that change only where memory lives or where metrics go: accepted, each with a warning.
  TrainConfig w = parse_json(base(), {"--wandb-project", "p", "--wandb-exp-name", "e", "--checkpoint-in-cpu",
                                      "--ds-sequence-parallel-fpdt", "--ds-sequence-parallel-fpdt-chunk-size",
                                      "65536", "--ds-sequence-parallel-fpdt-offloading"});
  CHECK(has_warning(w, "--wandb-project p: Weights & Biases logging is not implemented"));
  CHECK(has_warning(w, "--wandb-exp-name e"));
  CHECK(has_warning(w, "--checkpoint-in-cpu"));
  CHECK(has_warning(w, "--ds-sequence-parallel-fpdt: accepted as a memory-only setting"));
  CHECK(w.warnings.size() == 4);
  CHECK_THROWS_WITH(parse_json(base(), {"--ds-sequence-parallel-fpdt-offloading"}),
                    Contains("--ds-sequence-parallel-fpdt-offloading needs --ds-sequence-parallel-fpdt"));
  TrainConfig f = parse_json(base(), {"--ds-sequence-parallel-fpdt", "--ds-sequence-parallel-size", "2"}, 2);
  CHECK(f.parallel.sp == 2);
  CHECK(has_warning(f, "--ds-sequence-parallel-fpdt: accepted as a memory-only setting"));
}

TEST_CASE("DeepSpeed-Ulysses: the flag, DeepSpeed's key, and refusals naming the numbers", "[config][ulysses]") {
  TrainConfig a = parse_json(base(), {"--ds-sequence-parallel-size", "4"}, 8);
  CHECK(a.parallel.sp == 4);
  CHECK(a.batch.dp_size == 2);  // world 8 = SP 4 x DP 2: the four Ulysses ranks of a replica read the same samples
  CHECK(a.resolved.at("parallel").at("ds_sequence_parallel_size") == 4);
  TrainConfig k = parse_json(with(base(), {{"sequence_parallel_size", 2}}), {}, 4);
  CHECK(k.parallel.sp == 2);
  CHECK(k.batch.dp_size == 2);
  CHECK(parse_json(with(base(), {{"sequence_parallel_size", 2}}), {"--ds-sequence-parallel-size", "2"}, 2)
            .parallel.sp == 2);
  auto err = [&](const json& j, std::vector<std::string> flags, int world, const std::string& needle) {
    CHECK_THROWS_WITH(parse_json(j, flags, world), Contains(needle));
  };
  err(with(base(), {{"sequence_parallel_size", 2}}), {"--ds-sequence-parallel-size", "4"}, 8,
      "sequence_parallel_size 2 disagrees with parallel.ds_sequence_parallel_size (--ds-sequence-parallel-size) 4");
  err(base(), {"--ds-sequence-parallel-size", "4"}, 6, "world size 6 is not divisible");
  err(base(), {"--ds-sequence-parallel-size", "0"}, 1, "ds_sequence_parallel_size 0 must be positive");
  err(base(), {"--ds-sequence-parallel-size", "8"}, 8, "model.num_heads 12 is not divisible by "
      "tensor_model_parallel_size 1 * ds_sequence_parallel_size 8");
  err(base(), {"--ds-sequence-parallel-size", "4", "--seq-length", "1026", "--max-position-embeddings", "2048"}, 4,
      "model.seq_length 1026 is not divisible by ds_sequence_parallel_size 4");
  err(base(), {"--ds-sequence-parallel-size", "4", "--num-key-value-heads", "6"}, 4,
      "6 key-value heads per tensor-parallel rank");
  err(base(), {"--ds-sequence-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
               "--seq-length", "1026", "--max-position-embeddings", "2048", "--num-attention-heads", "4",
               "--hidden-size", "64"}, 4, "the 513 positions per Ulysses rank");
}

TEST_CASE("grouped-query attention and RoPE flags", "[config][flags]") {
  // Megatron-DeepSpeed's form, Megatron-Core's form, and the JSON key agree.
  CHECK(parse_json(base(), {"--num-key-value-heads", "4"}).model.num_kv_heads == 4);
  CHECK(parse_json(base(), {"--group-query-attention", "--num-query-groups", "4"}).model.num_kv_heads == 4);
  CHECK(parse_json(base(), {"--group-query-attention"}).model.num_kv_heads == 1);  // Megatron-Core's default
  CHECK(parse_json(with(base(), {{"model", {{"num_key_value_heads", 6}}}})).model.num_kv_heads == 6);
  CHECK(parse_json(base(), {"--group-query-attention", "--num-query-groups", "4", "--num-key-value-heads", "4"})
            .model.num_kv_heads == 4);
  const TrainConfig ignored = parse_json(base(), {"--num-query-groups", "4"});
  CHECK(ignored.model.num_kv_heads == 0);
  CHECK(has_warning(ignored, "--num-query-groups without --group-query-attention is ignored"));
  CHECK(parse_json(base()).resolved["model"]["num_key_value_heads"] == 12);
  // RoPE base and partial rotation reach the model.
  const TrainConfig r = parse_json(base(), {"--position-embedding-type", "rope", "--rotary-base", "500000",
                                           "--rotary-percent", "0.25"});
  CHECK(r.model.rope_theta == 500000.f);
  CHECK(r.model.rotary_percent == 0.25f);
  CHECK(r.resolved["model"]["rotary_percent"] == 0.25);
  CHECK(parse_json(base(), {"--rotary-position-embeddings-theta", "1000"}).model.rope_theta == 1000.f);
  // Errors name the flag and the numbers.
  auto err = [&](std::vector<std::string> flags, const std::string& needle, int world = 1) {
    CHECK_THROWS_WITH(parse_json(base(), flags, world), Contains(needle));
  };
  err({"--num-key-value-heads", "5"}, "model.num_key_value_heads 5 (--num-key-value-heads / --num-query-groups)");
  err({"--num-key-value-heads", "-1"}, "model.num_key_value_heads -1");
  err({"--group-query-attention", "--num-query-groups", "4", "--num-key-value-heads", "2"},
      "--num-query-groups 4 disagrees with num_key_value_heads 2");
  err({"--group-query-attention", "--num-query-groups", "0"}, "--num-query-groups 0");
  err({"--num-key-value-heads", "6", "--tensor-model-parallel-size", "4"},
      "num_key_value_heads 6 (--num-key-value-heads / --num-query-groups) must divide or be a multiple of "
      "tensor_model_parallel_size 4", 4);
  err({"--position-embedding-type", "rope", "--rotary-percent", "0.01"}, "rotates 0 dims");
  err({"--position-embedding-type", "rope", "--rotary-percent", "1.5"}, "model.rotary_percent 1.5");
  // NKV that divides TP (replicated kv heads) and that TP divides are both accepted.
  CHECK(parse_json(base(), {"--num-key-value-heads", "2", "--tensor-model-parallel-size", "4"}, 4)
            .model.num_kv_heads == 2);
  CHECK(parse_json(base(), {"--num-key-value-heads", "4", "--tensor-model-parallel-size", "2"}, 2)
            .model.num_kv_heads == 4);
}

TEST_CASE("dropout: Megatron-DeepSpeed's defaults, flags, JSON keys and range checks") {
  const TrainConfig d = parse_json(base());
  CHECK(d.model.hidden_dropout == 0.1f);  // Megatron-DeepSpeed's default when the flags are absent
  CHECK(d.model.attention_dropout == 0.1f);
  CHECK(d.resolved["model"]["hidden_dropout"] == 0.1);
  CHECK(d.resolved["model"]["attention_dropout"] == 0.1);
  const TrainConfig f = parse_json(base(), {"--hidden-dropout", "0", "--attention-dropout", "0.25"});
  CHECK(f.model.hidden_dropout == 0.f);
  CHECK(f.model.attention_dropout == 0.25f);
  const TrainConfig j = parse_json(with(base(), {{"model", {{"hidden_dropout", 0.3}, {"attention_dropout", 0.0}}}}));
  CHECK(j.model.hidden_dropout == 0.3f);
  CHECK(j.model.attention_dropout == 0.f);
  // The flag overrides the file.
  CHECK(parse_json(with(base(), {{"model", {{"hidden_dropout", 0.3}}}}), {"--hidden-dropout", "0.05"})
            .model.hidden_dropout == 0.05f);
  for (const char* v : {"1", "-0.1", "1.5"}) {
    CHECK_THROWS_WITH(parse_json(base(), {"--hidden-dropout", v}),
                      Contains("model.hidden_dropout (--hidden-dropout) must be in [0, 1)"));
    CHECK_THROWS_WITH(parse_json(base(), {"--attention-dropout", v}),
                      Contains("model.attention_dropout (--attention-dropout) must be in [0, 1)"));
  }
}

TEST_CASE("--overlap-param-gather: ZeRO stages 1 and 2 only", "[config][flags]") {
  CHECK_FALSE(parse_json(base()).zero.overlap_param_gather);
  CHECK(parse_json(base(), {"--zero-stage", "1", "--overlap-param-gather"}).zero.overlap_param_gather);
  CHECK(parse_json(with(base(), {{"parallel", {{"overlap_param_gather", true}}}}), {"--zero-stage", "2"})
            .zero.overlap_param_gather);
  for (const char* stage : {"0", "3"})
    CHECK_THROWS_WITH(parse_json(base(), {"--zero-stage", stage, "--overlap-param-gather"}),
                      Contains("parallel.overlap_param_gather (--overlap-param-gather)"));
}

TEST_CASE("DeepSpeed's optimizers: their keys, defaults, Megatron's --optimizer sgd and the refusals") {
  auto opt = [&](json o, std::vector<std::string> flags = {}) {
    return parse_json(with(base(), {{"optimizer", o}}), flags);
  };
  // Adam with adam_w_mode false is L2 Adam; AdamW ignores the key with a warning, as DeepSpeed does.
  TrainConfig c = opt({{"type", "adam"}, {"params", {{"adam_w_mode", false}, {"bias_correction", false}}}});
  CHECK(optimizer_kind(c.optim.spec) == OptimizerKind::AdamL2);
  CHECK_FALSE(c.optim.spec.bias_correction);
  CHECK(c.resolved["optimizer"]["params"]["adam_w_mode"] == false);
  c = opt({{"type", "AdamW"}, {"params", {{"adam_w_mode", false}, {"torch_adam", true}}}});
  CHECK(optimizer_kind(c.optim.spec) == OptimizerKind::AdamW);
  CHECK(c.warnings.size() == 2);
  // SGD, Adagrad, Lion, Lamb with their keys and DeepSpeed's / torch's defaults.
  c = opt({{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}}}});
  CHECK(c.optim.spec.type == "SGD");
  CHECK(c.optim.spec.momentum == Approx(0.9));
  CHECK(c.optim.spec.nesterov);
  c = opt({{"type", "adagrad"}, {"params", {{"lr_decay", 0.01}, {"initial_accumulator_value", 0.1}}}});
  CHECK(c.optim.spec.type == "Adagrad");
  CHECK(c.optim.eps == Approx(1e-10));
  CHECK(c.optim.spec.initial_accumulator_value == Approx(0.1));
  c = opt({{"type", "Lion"}});
  CHECK(c.optim.beta2 == Approx(0.999));
  c = opt({{"type", "LAMB"}, {"params", {{"max_coeff", 5.0}, {"min_coeff", 0.1}, {"eps_inside_sqrt", true}}}});
  CHECK(c.optim.spec.type == "Lamb");
  CHECK(c.optim.spec.max_coeff == Approx(5.0));
  CHECK(c.optim.spec.eps_inside_sqrt);
  // The resolved config reads back to itself.
  for (const char* t : {"SGD", "Adagrad", "Lion", "Lamb", "Adam"}) {
    INFO(t);
    const TrainConfig a = opt({{"type", t}});
    CHECK(parse_json(a.resolved).resolved == a.resolved);
  }
  CHECK(opt({{"type", "Lamb"}}).warnings.empty());
  // Megatron's --optimizer sgd: SGD with --sgd-momentum (default 0.9).
  c = parse_json(base(), {"--optimizer", "sgd"});
  CHECK(c.optim.spec.type == "SGD");
  CHECK(c.optim.spec.momentum == Approx(0.9));
  c = parse_json(base(), {"--optimizer", "sgd", "--sgd-momentum", "0.5"});
  CHECK(c.optim.spec.momentum == Approx(0.5));
  c = opt({{"type", "Lamb"}}, {"--optimizer", "sgd"});  // the DeepSpeed config's optimizer wins, with a warning
  CHECK(c.optim.spec.type == "Lamb");
  CHECK(c.warnings.size() == 1);
  // Refusals, one line naming the key.
  CHECK_THROWS_WITH(opt({{"type", "SGD"}, {"params", {{"nesterov", true}}}}),
                    Contains("'optimizer.params.nesterov' = true needs a momentum > 0"));
  CHECK_THROWS_WITH(opt({{"type", "Lamb"}, {"params", {{"min_coeff", 2.0}, {"max_coeff", 1.0}}}}),
                    Contains("must satisfy 0 < min_coeff <= max_coeff"));
  CHECK_THROWS_WITH(opt({{"type", "Adam"}, {"params", {{"max_grad_norm", 1.0}}}}), Contains("use gradient_clipping"));
  CHECK_THROWS_WITH(opt({{"type", "Adam"}, {"params", {{"amsgrad", true}}}}), Contains("'optimizer.params.amsgrad'"));
  json offload = with(base(), {{"optimizer", {{"type", "Lamb"}}}});
  offload["zero_optimization"] = {{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}}}};
  CHECK_THROWS_WITH(parse_json(offload), Contains("optimizer.type Lamb cannot be combined with "
                                                  "zero_optimization.offload_optimizer"));
}

TEST_CASE("DeepSpeed's OneCycle and LRRangeTest schedulers and Megatron's inverse-square-root decay") {
  auto sched = [&](json s, std::vector<std::string> flags = {}, json optimizer = nullptr) {
    json j = with(base(), {{"scheduler", s}});
    if (!optimizer.is_null()) j["optimizer"] = optimizer;
    return parse_json(j, flags);
  };
  TrainConfig c = sched({{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3},
                                                          {"cycle_first_step_size", 30}, {"decay_step_size", 5},
                                                          {"decay_lr_rate", 0.1}}}});
  CHECK(c.optim.scheduler == LrScheduler::OneCycle);
  CHECK(c.optim.one_cycle.cycle_second_step_size == 30);  // defaults to the first
  CHECK(c.optim.one_cycle.cycle_momentum);
  CHECK(c.optim.one_cycle.cycle_min_mom == Approx(0.8));
  CHECK(parse_json(c.resolved).resolved == c.resolved);
  c = sched({{"type", "LRRangeTest"}, {"params", {{"lr_range_test_min_lr", 1e-5}, {"lr_range_test_staircase", true}}}});
  CHECK(c.optim.range_test.min_lr == Approx(1e-5));
  CHECK(c.optim.range_test.step_size == 2000);
  CHECK(c.optim.range_test.staircase);
  CHECK(parse_json(c.resolved).resolved == c.resolved);
  // SGD has no betas: the momentum cycle is off, with a warning as in DeepSpeed.
  c = sched({{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3}}}}, {},
            {{"type", "SGD"}, {"params", {{"momentum", 0.9}}}});
  CHECK(c.warnings.size() == 1);
  CHECK_THROWS_WITH(sched({{"type", "OneCycle"}, {"params", {{"cycle_max_lr", 1e-3}}}}),
                    Contains("'scheduler.params.cycle_min_lr' is required by scheduler.type OneCycle"));
  CHECK_THROWS_WITH(sched({{"type", "LRRangeTest"}, {"params", {{"lr_range_test_step_size", 0}}}}),
                    Contains("'scheduler.params.lr_range_test_step_size' must be a positive integer"));
  CHECK_THROWS_WITH(sched({{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3}}}},
                          {"--lr-warmup-iters", "5"}),
                    Contains("--lr-warmup-iters does not apply to the config's scheduler OneCycle"));
  c = parse_json(base(), {"--lr-decay-style", "inverse-square-root", "--lr-warmup-iters", "10"});
  CHECK(c.optim.decay == LrDecay::InverseSqrt);
  CHECK(c.resolved["training"]["lr_decay_style"] == "inverse-square-root");
}

TEST_CASE("Megatron-LM's WSD decay: flags, keys, lengths and refusals") {
  TrainConfig c = parse_json(base(), {"--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "10",
                                      "--lr-wsd-decay-style", "minus_sqrt", "--global-batch-size", "4"});
  CHECK(c.optim.decay == LrDecay::WSD);
  CHECK(c.optim.wsd_style == WsdDecay::MinusSqrt);
  CHECK(c.optim.wsd_decay_samples == 40);
  CHECK(parse_json(c.resolved).resolved == c.resolved);
  CHECK_THROWS_WITH(parse_json(base(), {"--lr-decay-style", "WSD"}),
                    Contains("training.lr_decay_style WSD needs a final decay of 1 to 100 iterations"));
  CHECK_THROWS_WITH(parse_json(base(), {"--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "10"}),
                    Contains("training.lr_wsd_decay_samples with iteration-based training"));
}

TEST_CASE("with --deepspeed the optimizer is Megatron's and the precision the config's", "[config][megatron]") {
  // Megatron-DeepSpeed builds its own optimizer and hands it to the engine:
  // the config's optimizer section is not used, Megatron's defaults fill in.
  const json cfg = with(base(), {{"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 1e-3}, {"betas", {0.8, 0.95}},
                                                                             {"weight_decay", 0.2}}}}}});
  TrainConfig c = parse_json(cfg, {"--deepspeed", "--lr", "3e-4"});
  CHECK(c.optim.spec.type == "AdamW");
  CHECK(c.optim.lr == Approx(3e-4f));
  CHECK(c.optim.beta1 == Approx(0.9f));
  CHECK(c.optim.beta2 == Approx(0.999f));
  CHECK(c.optim.weight_decay == Approx(0.01f));
  CHECK(c.optim.eps == Approx(1e-8f));
  CHECK(has_warning(c, "the 'optimizer' section is not used with --deepspeed"));
  c = parse_json(cfg, {"--deepspeed", "--adam-beta2", "0.95", "--weight-decay", "0.1", "--adam-eps", "1e-6"});
  CHECK(c.optim.beta2 == Approx(0.95f));
  CHECK(c.optim.weight_decay == Approx(0.1f));
  CHECK(c.optim.eps == Approx(1e-6f));
  c = parse_json(base(), {"--deepspeed", "--optimizer", "sgd"});
  CHECK(c.optim.spec.type == "SGD");
  CHECK(c.optim.spec.momentum == Approx(0.9f));
  CHECK_FALSE(has_warning(c, "the 'optimizer' section"));  // the file had none
  // Without --deepspeed the config's section builds the optimizer.
  c = parse_json(cfg, {"--lr", "3e-4"});
  CHECK(c.optim.spec.type == "Lamb");
  CHECK(c.optim.beta1 == Approx(0.8f));
  CHECK(c.optim.weight_decay == Approx(0.2f));

  // The engine trains in the precision its config enables.
  c = parse_json(with(base(), {{"bf16", {{"enabled", true}}}}), {"--deepspeed", "--fp16"});
  CHECK(c.precision.precision == Precision::BF16);
  CHECK(has_warning(c, "--fp16 is overruled by the DeepSpeed config, which enables bf16"));
  c = parse_json(with(base(), {{"fp16", {{"enabled", true}}}}), {"--deepspeed", "--bf16"});
  CHECK(c.precision.precision == Precision::FP16);
  c = parse_json(with(base(), {{"bf16", {{"enabled", false}}}}), {"--deepspeed", "--fp16"});
  CHECK(c.precision.precision == Precision::FP16);  // the config enables nothing: the flag decides
  // Without --deepspeed the flag wins, over either spelling of bf16.
  c = parse_json(with(base(), {{"bf16", {{"enabled", true}}}}), {"--fp16"});
  CHECK(c.precision.precision == Precision::FP16);
  c = parse_json(with(base(), {{"bfloat16", {{"enabled", true}}}}), {"--fp16"});
  CHECK(c.precision.precision == Precision::FP16);
}
