// Candidate configurations, their experiment files and their cost features.
#include "launcher/autotune/search_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "lib/core/error.h"

namespace ds::launch::autotune {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// `k` values of the sorted list `v`, evenly spread, the smallest and largest included.
std::vector<int> spread(const std::vector<int>& v, int k) {
  if (static_cast<int>(v.size()) <= k) return v;
  std::set<int> pick;
  for (int i = 0; i < k; ++i) pick.insert(v[static_cast<size_t>(std::lround(double(i) * (v.size() - 1) / (k - 1)))]);
  if (k == 1) pick = {v.back()};
  return {pick.begin(), pick.end()};
}

// Micro-batch sizes for a data-parallel size `dp`, with their gas and global batch;
// the sizes left out are counted in `dropped` by reason.
std::vector<Point> batch_choices(const AutotuneConfig& c, const BatchRule& b, int dp, int mbs_upper,
                                 std::map<std::string, int>& dropped) {
  std::vector<int> mbs;
  if (!c.space.micro_batch_size.empty()) {
    mbs = c.space.micro_batch_size;
  } else {
    const int hi = mbs_upper > 0 ? std::min(mbs_upper, c.max_micro_batch) : c.max_micro_batch;
    std::vector<int> all;
    if (b.tbs_fixed) {
      if (b.tbs % dp == 0)
        for (int d : divisors(static_cast<int>(std::min<int64_t>(b.tbs / dp, 1 << 20))))
          if (d >= c.min_micro_batch && d <= hi) all.push_back(d);
    } else {
      for (int m = c.min_micro_batch; m <= hi; m *= 2) all.push_back(m);
    }
    mbs = spread(all, c.num_tuning_micro_batch_sizes);
    if (mbs.empty()) ++dropped["no micro batch size fits min/max_train_micro_batch_size_per_gpu, the memory limit "
                                 "and the global batch"];
  }
  std::vector<Point> out;
  for (int m : mbs) {
    Point p;
    p.mbs = m;
    if (b.tbs_fixed) {
      if (b.tbs % (int64_t{m} * dp) != 0) {  // gas would not be whole
        ++dropped[fmt::format("micro batch x data parallel does not divide train_batch_size {}", b.tbs)];
        continue;
      }
      p.tbs = b.tbs;
      p.gas = static_cast<int>(b.tbs / (int64_t{m} * dp));
    } else {
      p.gas = b.gas;
      p.tbs = int64_t{m} * b.gas * dp;
      if (p.tbs < c.min_train_batch_size || (c.max_train_batch_size && p.tbs > *c.max_train_batch_size)) {
        ++dropped["global batch outside min_train_batch_size / max_train_batch_size"];
        continue;
      }
    }
    out.push_back(p);
  }
  return out;
}

// Removes `flag V`, `flag=V` (or a bare switch) from args.
void strip_flag(std::vector<std::string>& args, const std::string& flag, bool takes_value) {
  for (size_t i = 0; i < args.size();) {
    if (args[i] == flag) {
      args.erase(args.begin() + i, args.begin() + std::min(args.size(), i + (takes_value ? 2 : 1)));
    } else if (takes_value && args[i].rfind(flag + "=", 0) == 0) {
      args.erase(args.begin() + i);
    } else {
      ++i;
    }
  }
}

// The point's value of a ds_config key named in arg_mappings.
std::string mapped_value(const Point& p, const std::string& key) {
  if (key == "train_micro_batch_size_per_gpu") return std::to_string(p.mbs);
  if (key == "gradient_accumulation_steps") return std::to_string(p.gas);
  if (key == "train_batch_size") return std::to_string(p.tbs);
  if (key == "zero_optimization.stage") return std::to_string(p.zero_stage);
  if (key == "parallel.tensor_model_parallel_size") return std::to_string(p.tp);
  if (key == "parallel.pipeline_model_parallel_size") return std::to_string(p.pp);
  DS_USER_ERROR("config: 'autotuning.arg_mappings' names '{}'; mappable keys are train_micro_batch_size_per_gpu, "
                "gradient_accumulation_steps, train_batch_size, zero_optimization.stage, "
                "parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size", key);
}

const std::vector<std::string> kConfigFlags = {"--config", "--deepspeed_config"};

}  // namespace

ModelFacts model_facts_from_json(const nlohmann::json& j) {
  ModelFacts f;
  try {
    f.device = j.at("device").get<std::string>();
    f.world = j.at("world_size").get<int>();
    f.n_params = j.at("n_params").get<int64_t>();
    f.num_layers = j.at("num_layers").get<int>();
    f.hidden = j.at("hidden_size").get<int>();
    f.heads = j.at("num_heads").get<int>();
    f.seq = j.at("seq_length").get<int>();
    f.flops_per_token = j.at("flops_per_token").get<double>();
    f.tp = j.at("tp").get<int>();
    f.pp = j.at("pp").get<int>();
    f.zero_stage = j.at("zero_stage").get<int>();
    f.offload = j.at("offload_optimizer").get<bool>();
    f.mbs = j.at("micro_batch_size").get<int>();
    f.gas = j.at("gradient_accumulation_steps").get<int>();
    f.tbs = j.at("train_batch_size").get<int64_t>();
    f.sp = j.at("sequence_parallel").get<bool>();
    f.recompute = j.at("recompute_granularity").get<std::string>();
    f.vp_layers = j.at("num_layers_per_virtual_pipeline_stage").get<int>();
    f.device_bytes = j.at("device_bytes_per_rank").get<int64_t>();
    f.host_bytes = j.at("host_bytes_per_rank").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    DS_USER_ERROR("the memory estimate of PROGRAM is not what dsrun expects ({}); is PROGRAM dstrain?", e.what());
  }
  return f;
}

std::string Point::name() const {
  return fmt::format("z{}_mbs{}_gas{}_tp{}_pp{}_vp{}_rc{}_sp{}_off{}", zero_stage, mbs, gas, tp, pp, vp,
                     recompute.empty() ? "none" : recompute, sp ? 1 : 0, offload ? 1 : 0);
}

nlohmann::json Point::to_json() const {
  return {{"zero_stage", zero_stage},
          {"offload_optimizer", offload},
          {"train_micro_batch_size_per_gpu", mbs},
          {"gradient_accumulation_steps", gas},
          {"train_batch_size", tbs},
          {"tensor_model_parallel_size", tp},
          {"pipeline_model_parallel_size", pp},
          {"virtual_pipeline_stages", vp},
          {"recompute_granularity", recompute.empty() ? "none" : recompute},
          {"sequence_parallel", sp}};
}

Point default_point(const ModelFacts& f, const BatchRule& b) {
  Point p;
  p.zero_stage = f.zero_stage;
  p.offload = f.offload;
  p.tp = f.tp;
  p.pp = f.pp;
  p.vp = f.vp_layers > 0 && f.pp > 0 ? std::max(1, f.num_layers / f.pp / f.vp_layers) : 1;
  p.recompute = f.recompute;
  p.sp = f.sp && f.tp > 1;
  p.mbs = f.mbs;
  const int dp = p.dp(f.world);
  if (b.tbs_fixed) {
    p.tbs = b.tbs;
    p.gas = static_cast<int>(std::max<int64_t>(1, b.tbs / (int64_t{p.mbs} * dp)));
  } else {
    p.gas = b.gas;
    p.tbs = int64_t{p.mbs} * p.gas * dp;
  }
  return p;
}

std::string SpaceReport::dropped_text() const {
  std::string t;
  for (const auto& [why, n] : dropped) t += fmt::format("{}{}: {}", t.empty() ? "" : "; ", why, n);
  return t.empty() ? "none" : t;
}

std::vector<Point> make_space(const AutotuneConfig& c, const ModelFacts& f, const BatchRule& b, int mbs_upper,
                              SpaceReport* report) {
  SpaceReport local;
  SpaceReport& r = report ? *report : local;
  const TuningSpace& s = c.space;
  const int W = f.world;
  std::vector<int> stages = s.zero_stage.empty() ? std::vector<int>{0, 1, 2, 3} : s.zero_stage;
  std::vector<bool> offloads = !s.offload_optimizer.empty() ? s.offload_optimizer
                               : c.fast                     ? std::vector<bool>{f.offload}
                                                            : std::vector<bool>{false, true};
  std::vector<int> tps = s.tp;
  if (tps.empty() && c.fast) tps = {c.mp_size > 1 ? c.mp_size : f.tp};
  if (tps.empty())
    for (int t : divisors(W))
      if (f.heads % t == 0 && f.hidden % t == 0) tps.push_back(t);
  std::vector<std::string> recomputes = !s.recompute.empty() ? s.recompute
                                        : c.fast             ? std::vector<std::string>{f.recompute}
                                                             : std::vector<std::string>{"", "selective", "full"};
  std::vector<Point> out;
  std::set<std::string> seen;
  auto add = [&](const Point& p) {
    if (seen.insert(p.name()).second) out.push_back(p);
  };
  add(default_point(f, b));
  for (int z : stages)
    for (bool off : offloads) {
      if (off && z == 0) {
        ++r.dropped["optimizer offload needs ZeRO stage >= 1"];
        continue;
      }
      for (int tp : tps) {
        if (W % tp != 0) {
          ++r.dropped[fmt::format("tensor parallel size does not divide the world of {}", W)];
          continue;
        }
        std::vector<int> pps = s.pp;
        if (pps.empty() && c.fast) pps = {f.pp};
        if (pps.empty())
          for (int pp : divisors(W / tp))
            if (f.num_layers % pp == 0) pps.push_back(pp);
        for (int pp : pps) {
          if (W % (tp * pp) != 0) {
            ++r.dropped[fmt::format("tensor x pipeline parallel size does not divide the world of {}", W)];
            continue;
          }
          std::vector<int> vps = s.virtual_stages;
          if (vps.empty()) vps = c.fast || pp == 1 ? std::vector<int>{default_point(f, b).vp} : std::vector<int>{1, 2};
          std::vector<bool> sps = !s.sequence_parallel.empty() ? s.sequence_parallel
                                  : c.fast                     ? std::vector<bool>{f.sp}
                                                               : std::vector<bool>{false, true};
          for (int vp : vps) {
            if (vp > 1 && (pp == 1 || (f.num_layers / pp) % vp != 0)) {
              ++r.dropped["virtual stages need pipeline parallelism and a divisible layer count"];
              continue;
            }
            for (const std::string& rc : recomputes)
              for (bool sp : sps) {
                if (sp && tp == 1) {
                  ++r.dropped["sequence parallelism needs tensor parallel size > 1"];
                  continue;
                }
                for (Point p : batch_choices(c, b, W / (tp * pp), mbs_upper, r.dropped)) {
                  p.zero_stage = z;
                  p.offload = off;
                  p.tp = tp;
                  p.pp = pp;
                  p.vp = vp;
                  p.recompute = rc;
                  p.sp = sp;
                  ++r.candidates;
                  add(p);
                }
              }
          }
        }
      }
    }
  return out;
}

nlohmann::json experiment_config(const nlohmann::json& user, const Point& p, int num_layers) {
  nlohmann::json j = user;
  j.erase("autotuning");
  j["train_batch_size"] = p.tbs;
  j["train_micro_batch_size_per_gpu"] = p.mbs;
  j["gradient_accumulation_steps"] = p.gas;
  if (!j.contains("zero_optimization") || !j["zero_optimization"].is_object()) j["zero_optimization"] = nlohmann::json::object();
  nlohmann::json& z = j["zero_optimization"];
  z["stage"] = p.zero_stage;
  if (p.offload) z["offload_optimizer"] = {{"device", "cpu"}};
  else z.erase("offload_optimizer");
  if (!j.contains("parallel") || !j["parallel"].is_object()) j["parallel"] = nlohmann::json::object();
  nlohmann::json& par = j["parallel"];
  par["tensor_model_parallel_size"] = p.tp;
  par["pipeline_model_parallel_size"] = p.pp;
  par["sequence_parallel"] = p.sp;
  par["num_layers_per_virtual_pipeline_stage"] = p.vp > 1 ? num_layers / p.pp / p.vp : 0;
  par["recompute_granularity"] = p.recompute;
  if (p.recompute == "full") par["recompute_num_layers"] = 0;  // every layer
  return j;
}

std::string config_arg(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i)
    for (const std::string& f : kConfigFlags) {
      if (args[i] == f && i + 1 < args.size()) return args[i + 1];
      if (args[i].rfind(f + "=", 0) == 0) return args[i].substr(f.size() + 1);
    }
  return "";
}

bool args_fix_global_batch(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--global-batch-size" || a.rfind("--global-batch-size=", 0) == 0) return true;
  return false;
}

std::vector<std::string> experiment_args(const std::vector<std::string>& args, const std::string& config_path,
                                         const Point& p, const std::map<std::string, std::string>& arg_mappings) {
  std::vector<std::string> out = args;
  bool replaced = false;
  for (size_t i = 0; i < out.size(); ++i)
    for (const std::string& f : kConfigFlags) {
      if (out[i] == f && i + 1 < out.size()) out[i + 1] = config_path, replaced = true;
      else if (out[i].rfind(f + "=", 0) == 0) out[i] = f + "=" + config_path, replaced = true;
    }
  DS_USER_CHECK(replaced, "dsrun --autotuning: PROGRAM's arguments name no DeepSpeed config (--config FILE or "
                "--deepspeed_config FILE)");
  for (const char* f : {"--micro-batch-size", "--global-batch-size", "--tensor-model-parallel-size",
                        "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                        "--recompute-granularity", "--recompute-num-layers", "--recompute-method", "--zero-stage",
                        "--checkpoint-num-layers"})
    strip_flag(out, f, true);
  for (const char* f : {"--sequence-parallel", "--recompute-activations", "--checkpoint-activations"})
    strip_flag(out, f, false);
  for (const auto& [key, flag] : arg_mappings) {
    const std::string v = mapped_value(p, key);
    strip_flag(out, flag, true);
    out.push_back(flag);
    out.push_back(v);
  }
  return out;
}

std::vector<double> cost_features(const Point& p, const ModelFacts& f) {
  const double W = f.world, dp = p.dp(f.world), mp = double(p.tp) * p.pp;
  const double tokens = double(p.tbs) * f.seq;
  const double recompute = p.recompute == "full" ? 4.0 / 3.0 : p.recompute == "selective" ? 1.05 : 1.0;
  const double bubble = double(p.pp - 1) / (double(p.gas) * p.vp);
  const double compute = tokens * f.flops_per_token * recompute * (1.0 + bubble) / W;  // FLOPs per rank
  const double shard = double(f.n_params) / mp;                                        // parameters per rank
  const double dp_comm = dp > 1 ? shard * 4 * 2 * (dp - 1) / dp * (p.zero_stage == 3 ? 1.5 : 1.0) : 0;
  const double layers = double(f.num_layers) / p.pp;
  const double tp_comm = p.tp > 1 ? double(p.gas) * layers * 4 * p.mbs * f.seq * f.hidden * 4 * (p.tp - 1) / p.tp : 0;
  const double optimizer = shard / (p.zero_stage >= 1 ? dp : 1) * (p.offload ? 4.0 : 1.0);
  const double micro_steps = double(p.gas) * p.pp * p.vp;
  return {compute, dp_comm, tp_comm, optimizer, micro_steps, 1.0};
}

double metric_of_time(Metric m, const Point& p, const ModelFacts& f, double seconds) {
  switch (m) {
    case Metric::Throughput: return double(p.tbs) / seconds;
    case Metric::Latency: return seconds;
    case Metric::Flops: return double(p.tbs) * f.seq * f.flops_per_token / seconds / f.world;
  }
  return 0;
}

bool better(Metric m, double a, double b) { return m == Metric::Latency ? a < b : a > b; }

}  // namespace ds::launch::autotune
