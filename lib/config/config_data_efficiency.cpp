// DeepSpeed Data Efficiency's random-LTD in the config (docs/data_efficiency.md):
// the data_efficiency.data_routing.random_ltd section with DeepSpeed's keys
// (runtime/data_pipeline/config.py, constants.py), Megatron-DeepSpeed's
// --random-ltd (training.random_ltd), the resolved form and the checks.
// Upstream: the engine builds the scheduler when random_ltd.enabled is true
// (whatever data_routing.enabled says); Megatron-DeepSpeed wraps its layers
// only with --random-ltd, and then asserts that the section is enabled.
#include <algorithm>

#include "lib/config/config_internal.h"
#include "lib/data/blended_dataset.h"

namespace ds {

using nlohmann::json;

namespace {

// A required key of an enabled random_ltd section (upstream: a KeyError).
const json& required(DsSection& s, const std::string& key) {
  s.mark(key);
  DS_USER_CHECK(s.has(key), "config: '{}' is required when random-LTD is enabled", s.full(key));
  return s.raw().at(key);
}

int64_t positive(DsSection& s, const std::string& key) {
  const json& v = required(s, key);
  DS_USER_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, "config: '{}' must be a positive integer, got {}",
                s.full(key), v.dump());
  return v.get<int64_t>();
}

// A string key whose only meaningful value for Megatron's GPT layer is `ours`.
void fixed(DsSection& s, const std::string& key, const char* ours, const char* why) {
  const json& v = required(s, key);
  DS_USER_CHECK(v == ours, "config: '{}' is {}: Megatron-DeepSpeed's GPT layers need \"{}\" ({})", s.full(key),
                v.dump(), ours, why);
}

}  // namespace

void read_random_ltd(DsSection& routing, RandomLtdConfig& r) {
  if (!routing.raw().is_object()) return;
  routing.mark("enabled");  // data_routing.enabled: upstream reads it and acts on random_ltd.enabled alone
  DsSection s = routing.section("random_ltd");
  r.enabled = s.raw().is_object() && s.get<bool>("enabled", false);
  if (!r.enabled) return;
  const json& ids = required(s, "random_ltd_layer_id");
  DS_USER_CHECK(ids.is_array() && !ids.empty(), "config: '{}' must be a non-empty list of layer indices, got {}",
                s.full("random_ltd_layer_id"), ids.dump());
  for (const json& v : ids) {
    DS_USER_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 20),
                  "config: '{}' must hold 0-based layer indices, got {}", s.full("random_ltd_layer_id"), v.dump());
    r.layer_ids.push_back(v.get<int>());
  }
  std::sort(r.layer_ids.begin(), r.layer_ids.end());  // upstream walks them sorted
  DS_USER_CHECK(std::adjacent_find(r.layer_ids.begin(), r.layer_ids.end()) == r.layer_ids.end(),
                "config: '{}' lists a layer twice: {}", s.full("random_ltd_layer_id"), ids.dump());
  const int64_t n = positive(s, "random_ltd_layer_num");
  DS_USER_CHECK(n == static_cast<int64_t>(r.layer_ids.size()),
                "config: '{}' is {} but random_ltd_layer_id lists {} layers (DeepSpeed requires them equal)",
                s.full("random_ltd_layer_num"), n, r.layer_ids.size());
  positive(s, "total_layer_num");  // upstream counts layer tokens with it (logging only)
  fixed(s, "model_mask_name", "attention_mask", "the keyword its layers take the mask by");
  fixed(s, "model_type", "decoder", "causal GPT layers; \"encoder\" is BERT's");
  fixed(s, "hidden_state_order", "seq_batch_dim", "its layers take (sequence, batch, hidden)");
  s.mark("micro_batch_size");  // set by the engine
  s.mark("global_batch_size");
  DsSection sched = s.section("random_ltd_schedule");
  DS_USER_CHECK(sched.raw().is_object(), "config: '{}' is required when random-LTD is enabled",
                s.full("random_ltd_schedule"));
  const json& type = required(sched, "schedule_type");
  DS_USER_CHECK(type == "fixed_linear", "config: '{}' is {}; DeepSpeed's random-LTD supports only \"fixed_linear\"",
                sched.full("schedule_type"), type.dump());
  r.schedule.min_value = positive(sched, "min_value");
  r.schedule.max_value = positive(sched, "max_value");
  DsSection sc = sched.section("schedule_config");
  DS_USER_CHECK(sc.raw().is_object(), "config: '{}' is required when random-LTD is enabled",
                sched.full("schedule_config"));
  r.schedule.require_steps = positive(sc, "require_steps");
  r.schedule.seq_per_step = positive(sc, "seq_per_step");
  DsSection lr = s.section("layer_token_lr_schedule");
  DS_USER_CHECK(!(lr.raw().is_object() && lr.get<bool>("enabled", false)),
                "config: '{}' is true: DeepSpeed's layer-token learning-rate schedule for random-LTD is not "
                "implemented upstream either (NotImplementedError)", lr.full("enabled"));
  if (lr.raw().is_object())
    for (const char* k : {"total_layer_tokens", "warmup_type", "warmup_layer_tokens"}) lr.mark(k);
}

json random_ltd_json(const RandomLtdConfig& r) {
  const RandomLtdSchedule& s = r.schedule;
  return {{"enabled", true},
          {"data_routing",
           {{"enabled", true},
            {"random_ltd",
             {{"enabled", true},
              {"total_layer_num", r.layer_ids.back() + 1},
              {"random_ltd_layer_num", r.layer_ids.size()},
              {"random_ltd_layer_id", r.layer_ids},
              {"model_mask_name", "attention_mask"},
              {"model_type", "decoder"},
              {"hidden_state_order", "seq_batch_dim"},
              {"random_ltd_schedule",
               {{"min_value", s.min_value},
                {"max_value", s.max_value},
                {"schedule_type", "fixed_linear"},
                {"schedule_config", {{"require_steps", s.require_steps}, {"seq_per_step", s.seq_per_step}}}}}}}}}};
}

void validate_random_ltd(const TrainConfig& cfg, Warnings& w) {
  const RandomLtdConfig& r = cfg.random_ltd;
  DS_USER_CHECK(!r.layers_converted || r.enabled,
                "--random-ltd needs data_efficiency.data_routing.random_ltd.enabled true in the DeepSpeed config "
                "(Megatron-DeepSpeed asserts that the engine has random-LTD enabled)");
  if (!r.enabled) return;
  if (!r.layers_converted) {
    add_warning(w, "config: 'data_efficiency.data_routing.random_ltd' is enabled without --random-ltd: no layer "
                   "drops tokens (as upstream, where only --random-ltd converts the layers)");
    return;
  }
  const int L = cfg.model.num_layers;
  DS_USER_CHECK(r.layer_ids.back() < L, "config: data_efficiency.data_routing.random_ltd.random_ltd_layer_id names "
                "layer {}, but the model has {} layers (0-based indices)", r.layer_ids.back(), L);
  const ParallelConfig& p = cfg.parallel;
  DS_USER_CHECK(p.pp == 1, "--random-ltd with --pipeline-model-parallel-size {}: random-LTD is not compatible with "
                "pipeline parallelism (as in Megatron-DeepSpeed's data efficiency scripts); use "
                "--no-pipeline-parallel", p.pp);
  DS_USER_CHECK(!p.sequence_parallel, "--random-ltd with --sequence-parallel: each rank holds a part of the "
                "sequence, from which the kept positions cannot be gathered; drop one of them");
  DS_USER_CHECK(p.sp == 1, "--random-ltd with DeepSpeed-Ulysses (ds_sequence_parallel_size {}) is not implemented",
                p.sp);
  DS_USER_CHECK(cfg.model.position == PositionKind::Learned,
                "--random-ltd with rotary position embeddings: upstream rotates the kept positions by their "
                "rank among the kept ones, not by their place in the sequence; use learned absolute positions");
  DS_USER_CHECK(!cfg.cuda_graph, "--random-ltd with --cuda-graph: the kept positions and their number change every "
                "step");
}

// ---- Curriculum learning by data sampling -------------------------------
// DeepSpeed reads data_sampling.{enabled, num_epochs, num_workers} and
// curriculum_learning.{enabled, data_cluster_path, curriculum_metrics}; each
// metric's difficulty_type and clustering_type always, index_to_sample_path
// when it is schedule_based and index_to_metric_path when it is also
// value-based (a missing key is a KeyError upstream: an error here). The
// sampler acts when curriculum_learning.enabled is true (data_sampling.enabled
// and data_efficiency.enabled are not consulted by the engine's data loader)
// and Megatron hands the engine its dataset (--data-efficiency-curriculum-learning).

namespace {

int64_t whole(DsSection& s, const std::string& key, int64_t fallback) {
  s.mark(key);
  if (!s.has(key)) return fallback;
  const json& v = s.raw().at(key);
  DS_USER_CHECK(v.is_number_integer(), "config: '{}' must be an integer, got {}", s.full(key), v.dump());
  return v.get<int64_t>();
}

const std::string& metric_path(DsSection& m, const std::string& key, const char* why) {
  m.mark(key);
  DS_USER_CHECK(m.has(key) && m.raw().at(key).is_string() && !m.raw().at(key).get_ref<const std::string&>().empty(),
                "config: '{}' is required ({})", m.full(key), why);
  return m.raw().at(key).get_ref<const std::string&>();
}

}  // namespace

void read_data_sampling(DsSection& d, DsSection& sampling, DataSamplingConfig& ds, bool flag) {
  if (d.has("seed")) {
    const int64_t seed = whole(d, "seed", 1234);
    DS_USER_CHECK(seed >= 0, "config: '{}' must be a non-negative integer (numpy's default_rng seed), got {}",
                  d.full("seed"), seed);
    ds.seed = static_cast<uint64_t>(seed);
  }
  if (!sampling.raw().is_object()) return;
  sampling.mark("enabled");  // upstream's data loader does not consult it
  ds.num_epochs = whole(sampling, "num_epochs", ds.num_epochs);
  ds.num_workers = whole(sampling, "num_workers", ds.num_workers);
  DsSection cl = sampling.section("curriculum_learning");
  if (!cl.raw().is_object()) return;
  ds.enabled = cl.get<bool>("enabled", false);
  if (ds.enabled)  // DeepSpeed's config parser asserts this much of an enabled section
    DS_USER_CHECK(cl.has("curriculum_metrics"), "config: '{}' must be given when curriculum learning is enabled",
                  cl.full("curriculum_metrics"));
  if (!ds.enabled || !flag) {  // inert: only Megatron's flag hands the engine the data (validate_data_sampling)
    for (const char* k : {"data_cluster_path", "curriculum_metrics"}) cl.mark(k);
    return;
  }
  ds.data_cluster_path = metric_path(cl, "data_cluster_path", "the curriculum's data clusters live there");
  cl.mark("curriculum_metrics");
  DS_USER_CHECK(cl.has("curriculum_metrics") && cl.raw().at("curriculum_metrics").is_object() &&
                    !cl.raw().at("curriculum_metrics").empty(),
                "config: '{}' must be a non-empty object of metrics when curriculum learning is enabled",
                cl.full("curriculum_metrics"));
  DsSection metrics = cl.section("curriculum_metrics");
  for (const auto& [name, body] : cl.raw().at("curriculum_metrics").items()) {
    DS_USER_CHECK(body.is_object(), "config: '{}' must be an object", metrics.full(name));
    DsSection m = metrics.section(name);
    CurriculumMetricConfig c;
    c.name = name;
    const std::string dt = metric_path(m, "difficulty_type", "value or percentile");
    DS_USER_CHECK(dt == "value" || dt == "percentile", "config: '{}' is \"{}\"; expected value or percentile",
                  m.full("difficulty_type"), dt);
    c.difficulty = dt == "value" ? CurriculumDifficulty::Value : CurriculumDifficulty::Percentile;
    const std::string ct = metric_path(m, "clustering_type", "single_cluster or schedule_based");
    DS_USER_CHECK(ct == "single_cluster" || ct == "schedule_based",
                  "config: '{}' is \"{}\"; expected single_cluster or schedule_based", m.full("clustering_type"), ct);
    c.single_cluster = ct == "single_cluster";
    if (!c.single_cluster) {
      c.index_to_sample_path = metric_path(m, "index_to_sample_path", "a schedule_based metric's data analysis");
      if (c.difficulty == CurriculumDifficulty::Value)
        c.index_to_metric_path = metric_path(m, "index_to_metric_path", "a value-based metric's data analysis");
      else
        m.mark("index_to_metric_path");  // read upstream only for value-based difficulty
    } else {
      m.mark("index_to_sample_path");  // "dummy" in the scripts: not read for a single cluster
      m.mark("index_to_metric_path");
    }
    c.schedule.enabled = true;
    c.schedule.floor_at_min = false;  // DeepSpeed's scheduler as it is
    read_curriculum_schedule(m, c.schedule);
    m.finish();
    ds.metrics.push_back(std::move(c));
  }
  cl.finish();
}

json data_sampling_json(const DataSamplingConfig& ds) {
  json metrics = json::object();
  for (const CurriculumMetricConfig& m : ds.metrics) {
    const CurriculumConfig& c = m.schedule;
    json j = {{"difficulty_type", m.difficulty == CurriculumDifficulty::Value ? "value" : "percentile"},
              {"clustering_type", m.single_cluster ? "single_cluster" : "schedule_based"},
              {"min_difficulty", c.min_difficulty},
              {"max_difficulty", c.max_difficulty},
              {"schedule_type", curriculum_schedule_name(c.schedule)},
              {"schedule_config", curriculum_schedule_json(c)}};
    if (!m.index_to_sample_path.empty()) j["index_to_sample_path"] = m.index_to_sample_path;
    if (!m.index_to_metric_path.empty()) j["index_to_metric_path"] = m.index_to_metric_path;
    metrics[m.name] = j;
  }
  return {{"enabled", true},
          {"num_epochs", ds.num_epochs},
          {"num_workers", ds.num_workers},
          {"curriculum_learning",
           {{"enabled", true}, {"data_cluster_path", ds.data_cluster_path}, {"curriculum_metrics", metrics}}}};
}

namespace {

// The number of datasets the training data blends (--data-path or --train-data-path).
size_t train_datasets(const DataConfig& d) {
  if (!d.data_path.empty()) return data::parse_blend(d.data_path, "--data-path").prefixes.size();
  if (!d.train_data_path.empty()) return data::parse_blend(d.train_data_path, "--train-data-path").prefixes.size();
  return 0;
}

}  // namespace

void validate_data_sampling(const TrainConfig& cfg, Warnings& w) {
  const DataConfig& d = cfg.data;
  const int maps = !d.train_doc_idx_path.empty() + !d.train_sample_idx_path.empty() + !d.train_shuffle_idx_path.empty();
  DS_USER_CHECK(maps == 0 || maps == 3, "--train-doc-idx-path, --train-sample-idx-path and --train-shuffle-idx-path "
                "go together (Megatron's three index maps of the train dataset): give all three or none");
  if (maps == 3)
    DS_USER_CHECK(!d.data_path.empty() && train_datasets(d) == 1, "--train-doc-idx-path and its companions describe "
                  "the train split of one dataset, but the training data {}; give one --data-path prefix",
                  d.data_path.empty() ? std::string("comes from --train-data-path")
                                      : fmt::format("blends {} datasets", train_datasets(d)));
  const DataSamplingConfig& ds = cfg.data_sampling;
  DS_USER_CHECK(!ds.flag || ds.enabled,
                "--data-efficiency-curriculum-learning needs data_efficiency.data_sampling.curriculum_learning."
                "enabled true in the DeepSpeed config (without it Megatron-DeepSpeed trains from the engine's "
                "plain DistributedSampler order, which dstrain does not reproduce)");
  if (!ds.enabled) return;
  if (!ds.flag) {
    add_warning(w, "config: 'data_efficiency.data_sampling.curriculum_learning' is enabled without "
                   "--data-efficiency-curriculum-learning: the usual sample order is kept (as upstream, where only "
                   "that flag hands the engine the dataset)");
    return;
  }
  for (const CurriculumMetricConfig& m : ds.metrics) {
    const CurriculumConfig& c = m.schedule;
    const std::string where = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics." + m.name;
    DS_USER_CHECK(c.min_difficulty <= c.max_difficulty, "config: {}: min_difficulty {} exceeds max_difficulty {}",
                  where, c.min_difficulty, c.max_difficulty);
    if (c.schedule == CurriculumSchedule::FixedDiscrete)
      DS_USER_CHECK(c.difficulty.size() == c.max_step.size() + 1,
                    "config: {}.schedule_config: fixed_discrete needs one more difficulty than max_step entries "
                    "(got {} and {})", where, c.difficulty.size(), c.max_step.size());
    else
      DS_USER_CHECK(c.total_curriculum_step >= 1 && c.difficulty_step >= 1 && c.root_degree > 0,
                    "config: {}.schedule_config: total_curriculum_step {} and difficulty_step {} must be positive "
                    "integers and root_degree {} positive", where, c.total_curriculum_step, c.difficulty_step,
                    c.root_degree);
    if (m.difficulty == CurriculumDifficulty::Percentile && !m.single_cluster)
      DS_USER_CHECK(c.min_difficulty >= 0 && c.max_difficulty >= 1,
                    "config: {}: percentile difficulties run from 0 to max_difficulty (the number of percentile "
                    "steps, at least 1), got {}..{}", where, c.min_difficulty, c.max_difficulty);
    if (&m != ds.seqlen_metric()) continue;
    const int64_t T = cfg.model.seq_length;
    for (int64_t L : curriculum_values(c)) {
      DS_USER_CHECK(L >= 1, "config: {}: the schedule reaches sequence length {}; every length must be >= 1 "
                    "(raise min_difficulty to a multiple of difficulty_step)", where, L);
      const int64_t kept = std::min(L, T);
      const int64_t div = cfg.parallel.sequence_parallel ? cfg.parallel.tp : 1;
      DS_USER_CHECK(kept % (div * cfg.parallel.sp) == 0,
                    "config: {}: the schedule reaches sequence length {}, which is not divisible by {} (the "
                    "sequence is split over the tensor-/sequence-parallel ranks)", where, kept, div * cfg.parallel.sp);
    }
  }
  const ParallelConfig& p = cfg.parallel;
  DS_USER_CHECK(p.pp == 1, "--data-efficiency-curriculum-learning with --pipeline-model-parallel-size {}: the "
                "data-sampling curriculum is not implemented with pipeline parallelism (the data-efficiency scripts "
                "use --no-pipeline-parallel)", p.pp);
  DS_USER_CHECK(!cfg.curriculum.enabled, "--data-efficiency-curriculum-learning with the legacy curriculum_learning "
                "section: give one sequence-length curriculum (Megatron-DeepSpeed would apply both)");
  DS_USER_CHECK(!cfg.lengths.rampup.enabled(), "--data-efficiency-curriculum-learning with --rampup-batch-size: "
                "DeepSpeed's data sampler draws fixed-size global batches");
  DS_USER_CHECK(train_datasets(d) == 1, "--data-efficiency-curriculum-learning with {} blended train datasets: the "
                "data analysis indexes the samples of one dataset; give one --data-path prefix", train_datasets(d));
}

}  // namespace ds
