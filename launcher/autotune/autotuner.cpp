// The autotuning session: base estimate, search space, tuner loop with memory
// pruning and early stopping, results files, and the final launch for `run`.
#include "launcher/autotune/autotuner.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "launcher/autotune/autotune_config.h"
#include "launcher/autotune/experiment.h"
#include "launcher/autotune/search_space.h"
#include "launcher/autotune/tuner.h"
#include "launcher/head.h"
#include "launcher/process.h"
#include "launcher/shell.h"
#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds::launch::autotune {
namespace fs = std::filesystem;
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
// Per-process memory that the estimate does not model (docs/autotuning.md
// says how these were measured): on the CPU backend the program, OpenBLAS,
// OpenMP and Gloo buffers and the data loader; on CUDA the context, cuBLAS
// workspaces and allocator slack.
constexpr double kCpuOverheadGiB = 0.17;
constexpr double kCudaOverheadGiB = 1.0;
// CPU backend, ZeRO stage 0-3: bytes per parameter of the rank that ZeRO's
// full-size gradient and communication buffers add beyond the estimate
// (measured at 3.3M and 19.2M parameters, docs/autotuning.md).
constexpr double kCpuZeroBytesPerParam[4] = {0, 6, 9, 6};

struct Record {
  int index = 0;
  Point point;
  std::string status;  // ok | failed | oom | timeout | no_metrics | pruned | invalid
  std::string reason;
  double metric = 0, seconds = 0, wall_s = 0;
  int64_t est_bytes = -1, peak_bytes = -1;
};

struct Session {
  AutotuneConfig cfg;
  nlohmann::json user_config;
  std::string program;
  std::vector<std::string> launcher_flags, args;  // dsrun flags without --autotuning; PROGRAM's
  int world = 1, local_size = 1;
  ModelFacts facts;
  double limit_bytes = 0;
  double overhead_bytes = 0;    // the constant part (memory_overhead_gb)
  bool zero_term = false;       // add kCpuZeroBytesPerParam (CPU, default overhead)
  std::vector<Record> records;
  std::set<std::string> fresh;  // experiment directories emptied by this session (overwrite)
  int experiments = 0;
  double t0 = 0;
};

// What experiments and `run` execute: this very binary, even if a rebuild
// replaced (unlinked) its file meanwhile.
constexpr const char* kSelfExe = "/proc/self/exe";

// This binary's path, for the command lines that are shown and saved.
std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "dsrun" : p.string();
}

std::string gib(int64_t b) { return b < 0 ? "-" : fmt::format("{:.3f}", double(b) / kGiB); }

// dsrun's flags before PROGRAM, without --autotuning and its value.
std::vector<std::string> launcher_flags(const Options& o, int argc, char** argv) {
  const int prog = argc - 1 - static_cast<int>(o.args.size());
  DS_CHECK(prog >= 1 && argv[prog] == o.program, "cannot find PROGRAM in dsrun's command line");
  std::vector<std::string> out;
  for (int i = 1; i < prog; ++i) {
    std::string a = argv[i];
    if (a == "--autotuning") {
      ++i;
      continue;
    }
    if (a.rfind("--autotuning=", 0) == 0) continue;
    out.push_back(a);
  }
  return out;
}

// The usable memory of one process: the config's, else the host's available
// memory shared by the node's ranks (CPU) or the GPU's (nvidia-smi), else 0.
double memory_limit(const AutotuneConfig& c, const ModelFacts& f, int local_size, std::string* how) {
  if (c.memory_per_process_gb > 0) {
    *how = "autotuning.memory_per_process_gb";
    return c.memory_per_process_gb * kGiB;
  }
  if (f.device == "cpu") {
    std::ifstream in("/proc/meminfo");
    std::string key;
    long long kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
      if (key == "MemAvailable:") {
        *how = fmt::format("MemAvailable / {} ranks per node", local_size);
        return double(kb) * 1024 / local_size;
      }
  }
  *how = "unknown (set autotuning.memory_per_process_gb): nothing is pruned";
  return 0;
}

std::string exp_dir(const Session& s, const Point& p) { return (fs::path(s.cfg.exps_dir) / p.name()).string(); }

// The memory estimate of point p; fills rec (est_bytes, or status invalid/pruned). True when it may run.
bool estimate_point(Session& s, const Point& p, Record& rec) {
  const std::string dir = exp_dir(s, p);
  if (s.cfg.overwrite && s.fresh.insert(dir).second) fs::remove_all(dir);  // no earlier session's files
  fs::create_directories(dir);
  const std::string cfg_path = dir + "/ds_config.json";
  write_text(cfg_path, experiment_config(s.user_config, p, s.facts.num_layers).dump(2) + "\n");
  std::string err;
  auto est = run_estimate(s.program, experiment_args(s.args, cfg_path, p, s.cfg.arg_mappings), s.world, s.local_size,
                          dir + "/estimate.json", &err);
  if (!est) {
    rec.status = "invalid";
    rec.reason = err;
    return false;
  }
  const ModelFacts f = model_facts_from_json(*est);
  rec.est_bytes = f.device == "cpu" ? f.host_bytes : f.device_bytes;
  const double overhead =
      s.overhead_bytes + (s.zero_term ? kCpuZeroBytesPerParam[p.zero_stage] * double(f.n_params) / (f.tp * f.pp) : 0);
  if (s.limit_bytes > 0 && double(rec.est_bytes) + overhead > s.limit_bytes) {
    rec.status = "pruned";
    rec.reason = fmt::format("estimate {} GiB + overhead {:.3f} GiB > limit {:.3f} GiB", gib(rec.est_bytes),
                             overhead / kGiB, s.limit_bytes / kGiB);
    return false;
  }
  return true;
}

// An experiment's metrics file into rec (status ok).
void read_metrics(const Session& s, const std::string& path, Record& rec) {
  const nlohmann::json m = load_json_file(path);
  try {
    rec.seconds = m.at("latency").get<double>();
    rec.peak_bytes = m.at("peak_memory_bytes").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    DS_USER_ERROR("'{}' is not an experiment's metrics file: {}", path, e.what());
  }
  rec.status = "ok";
  rec.metric = metric_of_time(s.cfg.metric, rec.point, s.facts, rec.seconds);
}

// Runs point p through dsrun and fills rec from its metrics file and exit code.
void run_point(Session& s, const Point& p, Record& rec) {
  const std::string dir = exp_dir(s, p);
  const std::string metrics = dir + "/metrics.json";
  std::remove(metrics.c_str());
  std::vector<std::string> argv = {self_exe()};
  argv.insert(argv.end(), s.launcher_flags.begin(), s.launcher_flags.end());
  argv.push_back(s.program);
  for (auto& a : experiment_args(s.args, dir + "/ds_config.json", p, s.cfg.arg_mappings)) argv.push_back(a);
  write_text(dir + "/cmd.txt", shell_join(argv) + "\n");
  argv[0] = kSelfExe;
  write_text(dir + "/exp.json", nlohmann::json{{"name", p.name()}, {"point", p.to_json()}}.dump(2) + "\n");
  const EnvPairs env = {{"DS_AUTOTUNING_METRIC_PATH", fs::absolute(metrics).string()},
                        {"DS_AUTOTUNING_START_PROFILE_STEP", std::to_string(s.cfg.start_profile_step)},
                        {"DS_AUTOTUNING_END_PROFILE_STEP", std::to_string(s.cfg.end_profile_step)}};
  ProcessResult r = run_logged(argv, env, dir + "/stdout.log", dir + "/stderr.log", s.cfg.experiment_timeout_s, 5);
  if (r.interrupted) throw Interrupted{r.interrupted};
  rec.wall_s = r.seconds;
  const std::string err_text = slurp(dir + "/stderr.log") + slurp(dir + "/stdout.log");
  if (r.timed_out) {
    rec.status = "timeout";
    rec.reason = fmt::format("stopped after {} s (autotuning.experiment_timeout_s)", s.cfg.experiment_timeout_s);
  } else if (r.code != 0) {
    const bool oom = r.code == 137 || err_text.find("out of memory") != std::string::npos ||
                     err_text.find("bad_alloc") != std::string::npos ||
                     err_text.find("Cannot allocate memory") != std::string::npos;
    rec.status = oom ? "oom" : "failed";
    rec.reason = fmt::format("exit code {}: {}", r.code, last_error_line(dir + "/stderr.log"));
  } else if (access(metrics.c_str(), R_OK) != 0) {
    rec.status = "no_metrics";
    rec.reason = fmt::format("PROGRAM ended before step {} (end_profile_step): give it enough iterations",
                             s.cfg.end_profile_step);
  } else {
    read_metrics(s, metrics, rec);
  }
}

const Record* best_record(const Session& s) {
  const Record* best = nullptr;
  for (const Record& r : s.records)
    if (r.status == "ok" && (!best || better(s.cfg.metric, r.metric, best->metric))) best = &r;
  return best;
}

std::string metric_unit(Metric m) {
  return m == Metric::Throughput ? "samples/s" : m == Metric::Latency ? "s/step" : "FLOPS/rank";
}

// results_dir/summary.txt (a table) and summary.json (the same, and the session's facts).
void write_summary(const Session& s) {
  const Record* best = best_record(s);
  std::string t = fmt::format("dsrun autotuning: {} tuner, metric {} ({}), world {}, memory limit {} GiB per process "
                              "(overhead {:.2f} GiB{}), {} experiments run in {:.1f} s\n\n",
                              tuner_name(s.cfg.tuner), metric_name(s.cfg.metric), metric_unit(s.cfg.metric), s.world,
                              s.limit_bytes > 0 ? fmt::format("{:.2f}", s.limit_bytes / kGiB) : "unknown",
                              s.overhead_bytes / kGiB, s.zero_term ? " + 0/6/9/6 bytes per parameter for ZeRO 0/1/2/3" : "",
                              s.experiments, now_seconds() - s.t0);
  t += fmt::format("{:<4} {:<48} {:<10} {:>14} {:>10} {:>10} {:>8}  {}\n", "#", "experiment", "status",
                   metric_name(s.cfg.metric), "est GiB", "peak GiB", "wall s", "note");
  nlohmann::json rows = nlohmann::json::array();
  for (const Record& r : s.records) {
    const bool is_best = best && &r == best;
    t += fmt::format("{:<4} {:<48} {:<10} {:>14} {:>10} {:>10} {:>8}  {}{}\n", r.index, r.point.name(), r.status,
                     r.status == "ok" ? fmt::format("{:.6g}", r.metric) : "-", gib(r.est_bytes), gib(r.peak_bytes),
                     r.wall_s > 0 ? fmt::format("{:.1f}", r.wall_s) : "-", is_best ? "BEST " : "",
                     r.index == 0 ? "(default config) " + r.reason : r.reason);
    rows.push_back({{"index", r.index}, {"name", r.point.name()}, {"config", r.point.to_json()}, {"status", r.status},
                    {"reason", r.reason}, {"metric", r.status == "ok" ? nlohmann::json(r.metric) : nlohmann::json()},
                    {"latency_s", r.status == "ok" ? nlohmann::json(r.seconds) : nlohmann::json()},
                    {"estimated_bytes", r.est_bytes}, {"peak_bytes", r.peak_bytes}, {"wall_s", r.wall_s},
                    {"best", is_best}, {"default", r.index == 0}});
  }
  write_text(fs::path(s.cfg.results_dir) / "summary.txt", t);
  nlohmann::json j = {{"metric", metric_name(s.cfg.metric)},
                      {"tuner", tuner_name(s.cfg.tuner)},
                      {"world_size", s.world},
                      {"memory_limit_bytes", s.limit_bytes},
                      {"memory_overhead_bytes", s.overhead_bytes},
                      {"experiments_run", s.experiments},
                      {"seconds", now_seconds() - s.t0},
                      {"experiments", rows}};
  write_text(fs::path(s.cfg.results_dir) / "summary.json", j.dump(2) + "\n");
}

// Largest micro batch (doubling from the minimum) whose estimate fits, at the
// default layout with the least memory the space allows (DeepSpeed looks for it
// with its minimal-memory config). 0 when nothing bounds it.
int micro_batch_upper(Session& s, const BatchRule& b) {
  if (s.limit_bytes <= 0 || b.tbs_fixed || !s.cfg.space.micro_batch_size.empty()) return 0;
  Point p = default_point(s.facts, b);
  const auto& st = s.cfg.space.zero_stage;
  p.zero_stage = st.empty() ? 3 : *std::max_element(st.begin(), st.end());
  if (!s.cfg.fast || std::find(s.cfg.space.recompute.begin(), s.cfg.space.recompute.end(), "full") !=
                         s.cfg.space.recompute.end())
    p.recompute = "full";
  int fits = 0;
  for (int m = s.cfg.min_micro_batch; m <= s.cfg.max_micro_batch; m *= 2) {
    p.mbs = m;
    p.tbs = int64_t{m} * p.gas * p.dp(s.world);
    Record rec;
    if (!estimate_point(s, p, rec)) break;
    fits = m;
  }
  return fits;
}

// Reads the base estimate (the user's own configuration) and the batch rule.
BatchRule base_configuration(Session& s) {
  nlohmann::json base = s.user_config;
  base.erase("autotuning");
  BatchRule b;
  auto is_num = [&](const char* k) { return s.user_config.contains(k) && s.user_config[k].is_number(); };
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    if (base.contains(k) && base[k].is_string()) {
      DS_USER_CHECK(base[k] == "auto", "config: '{}' must be a positive integer or \"auto\", got {}", k,
                    base[k].dump());
      base.erase(k);
    }
  }
  if (!base.contains("train_micro_batch_size_per_gpu")) base["train_micro_batch_size_per_gpu"] = s.cfg.min_micro_batch;
  b.tbs_fixed = is_num("train_batch_size") || args_fix_global_batch(s.args);
  b.gas = is_num("gradient_accumulation_steps") ? s.user_config["gradient_accumulation_steps"].get<int>() : 1;
  if (!b.tbs_fixed) base.erase("train_batch_size");
  const fs::path dir = fs::path(s.cfg.exps_dir) / "base";
  fs::create_directories(dir);
  write_text((dir / "ds_config.json").string(), base.dump(2) + "\n");
  std::vector<std::string> args = s.args;
  for (size_t i = 0; i < args.size(); ++i)  // only the config path changes
    if ((args[i] == "--config" || args[i] == "--deepspeed_config") && i + 1 < args.size())
      args[i + 1] = (dir / "ds_config.json").string();
    else if (args[i].rfind("--config=", 0) == 0 || args[i].rfind("--deepspeed_config=", 0) == 0)
      args[i] = args[i].substr(0, args[i].find('=') + 1) + (dir / "ds_config.json").string();
  std::string err;
  auto est = run_estimate(s.program, args, s.world, s.local_size, (dir / "estimate.json").string(), &err);
  DS_USER_CHECK(est.has_value(), "dsrun --autotuning: PROGRAM rejects the base configuration: {}", err);
  s.facts = model_facts_from_json(*est);
  b.tbs = s.facts.tbs;
  return b;
}

void write_optimal(const Session& s, const Record& best, std::vector<std::string>* cmd) {
  const fs::path res = s.cfg.results_dir;
  const std::string cfg_path = (res / "ds_config_optimal.json").string();
  write_text(cfg_path, experiment_config(s.user_config, best.point, s.facts.num_layers).dump(2) + "\n");
  cmd->assign({self_exe()});
  cmd->insert(cmd->end(), s.launcher_flags.begin(), s.launcher_flags.end());
  cmd->push_back(s.program);
  for (auto& a : experiment_args(s.args, cfg_path, best.point, s.cfg.arg_mappings)) cmd->push_back(a);
  write_text((res / "cmd_optimal.txt").string(), shell_join(*cmd) + "\n");
}

// The tuner loop: prune or run each proposed candidate until the space, the
// trial budget or the patience (early stopping) runs out.
void tune(Session& s, Tuner& tuner) {
  int best_iter = -1;
  double best_metric = 0;
  while (s.experiments < s.cfg.tuner_num_trials) {
    const int i = tuner.next();
    if (i < 0) break;
    Record rec;
    rec.index = i;
    rec.point = tuner.space()[i];
    const std::string metrics = exp_dir(s, rec.point) + "/metrics.json";
    if (!estimate_point(s, rec.point, rec)) {
      tuner.exclude(i);
    } else {
      if (!s.cfg.overwrite && access(metrics.c_str(), R_OK) == 0) {
        read_metrics(s, metrics, rec);  // a previous session's measurement
        rec.reason = "measured by an earlier session (overwrite false)";
      } else {
        run_point(s, rec.point, rec);
      }
      tuner.report(i, rec.status == "ok" ? std::optional<double>(rec.seconds) : std::nullopt);
      if (rec.status == "ok" && (best_iter < 0 || better(s.cfg.metric, rec.metric, best_metric))) {
        best_iter = s.experiments;
        best_metric = rec.metric;
      }
      ++s.experiments;
    }
    fmt::print(stderr, "dsrun: autotuning: [{}] {}: {}{}\n", s.experiments, rec.point.name(), rec.status,
               rec.status == "ok" ? fmt::format(" {} {:.6g} {}", metric_name(s.cfg.metric), rec.metric,
                                                metric_unit(s.cfg.metric))
                                  : " (" + rec.reason + ")");
    s.records.push_back(rec);
    write_summary(s);
    if (s.cfg.tuner_early_stopping > 0 && best_iter >= 0 &&
        s.experiments >= best_iter + s.cfg.tuner_early_stopping) {
      fmt::print(stderr, "dsrun: autotuning: early stop after {} experiments (best was experiment {}, threshold {})\n",
                 s.experiments, best_iter + 1, s.cfg.tuner_early_stopping);
      break;
    }
  }
}

int session(const Options& o, int argc, char** argv) {
  DS_USER_CHECK(o.autotuning == "tune" || o.autotuning == "run", "--autotuning '{}': use tune or run", o.autotuning);
  DS_USER_CHECK(!o.dry_run, "--autotuning cannot be combined with --dry_run");
  Session s;
  s.t0 = now_seconds();
  s.program = o.program;
  s.args = o.args;
  s.launcher_flags = launcher_flags(o, argc, argv);
  const std::string cfg_file = config_arg(o.args);
  DS_USER_CHECK(!cfg_file.empty(), "dsrun --autotuning: PROGRAM's arguments name no DeepSpeed config (--config FILE "
                "or --deepspeed_config FILE)");
  s.user_config = load_json_file(cfg_file);
  s.cfg = parse_autotune_config(s.user_config);
  DS_USER_CHECK(s.cfg.results_dir != s.cfg.exps_dir, "config: 'autotuning.results_dir' and 'autotuning.exps_dir' "
                "must differ");
  const LaunchPlan plan = make_plan(gather_inputs(o));
  s.world = static_cast<int>(plan.ranks.size());
  for (const RankPlan& r : plan.ranks) s.local_size = std::max(s.local_size, r.info.local_size);
  if (s.cfg.overwrite) {
    std::error_code ec;
    for (const char* f : {"summary.txt", "summary.json", "ds_config_optimal.json", "cmd_optimal.txt"})
      fs::remove(fs::path(s.cfg.results_dir) / f, ec);
  }
  fs::create_directories(s.cfg.results_dir);
  fs::create_directories(s.cfg.exps_dir);
  const BatchRule batch = base_configuration(s);
  std::string how;
  s.limit_bytes = memory_limit(s.cfg, s.facts, s.local_size, &how);
  s.zero_term = s.cfg.memory_overhead_gb < 0 && s.facts.device == "cpu";
  s.overhead_bytes = (s.cfg.memory_overhead_gb >= 0 ? s.cfg.memory_overhead_gb
                      : s.facts.device == "cpu"     ? kCpuOverheadGiB
                                                    : kCudaOverheadGiB) * kGiB;
  fmt::print(stderr, "dsrun: autotuning: world {}, {} parameters, memory limit {} per process ({})\n", s.world,
             s.facts.n_params, s.limit_bytes > 0 ? gib(int64_t(s.limit_bytes)) + " GiB" : "none", how);
  const int mbs_upper = micro_batch_upper(s, batch);
  SpaceReport report;
  std::vector<Point> space = make_space(s.cfg, s.facts, batch, mbs_upper, &report);
  // Only the default would run: "BEST" would name it without anything to compare.
  DS_USER_CHECK(report.candidates > 0, "dsrun --autotuning: every candidate of autotuning.tuning_space was dropped "
                "({}); only the default configuration is left, so there is nothing to tune: widen the space",
                report.dropped_text());
  Tuner tuner(s.cfg.tuner, std::move(space), s.facts, s.cfg.metric, s.cfg.seed);
  fmt::print(stderr, "dsrun: autotuning: {} candidate configurations, {} tuner, metric {}\n", tuner.space().size(),
             tuner_name(s.cfg.tuner), metric_name(s.cfg.metric));
  tune(s, tuner);
  write_summary(s);
  const Record* best = best_record(s);
  DS_USER_CHECK(best != nullptr, "dsrun --autotuning: no experiment succeeded; see {}/summary.txt and the logs under {}",
                s.cfg.results_dir, s.cfg.exps_dir);
  std::vector<std::string> cmd;
  write_optimal(s, *best, &cmd);
  fmt::print("{}", slurp((fs::path(s.cfg.results_dir) / "summary.txt").string()));
  fmt::print("best: {} ({} {:.6g} {}); config {}/ds_config_optimal.json\nrun it with: {}\n", best->point.name(),
             metric_name(s.cfg.metric), best->metric, metric_unit(s.cfg.metric), s.cfg.results_dir, shell_join(cmd));
  std::fflush(stdout);
  if (o.autotuning == "tune") return 0;
  fmt::print(stderr, "dsrun: autotuning: launching the best configuration\n");
  std::vector<char*> cargv;
  for (auto& a : cmd) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  execv(kSelfExe, cargv.data());
  DS_USER_ERROR("cannot run '{}': {}", cargv[0], std::strerror(errno));
}

}  // namespace

int autotune_main(const Options& o, int argc, char** argv) {
  try {
    return session(o, argc, argv);
  } catch (const Interrupted& i) {
    fmt::print(stderr, "dsrun: autotuning interrupted by {}\n", signal_name(i.sig));
    return 128 + i.sig;
  }
}

}  // namespace ds::launch::autotune
