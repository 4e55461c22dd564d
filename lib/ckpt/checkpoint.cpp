// Checkpoint save/load with an atomic step directory and `latest` pointer.
#include "lib/ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"

namespace fs = std::filesystem;

namespace ds {
namespace {

std::string tmp_dir_name(int64_t iteration) { return ".tmp-" + step_dir_name(iteration); }

std::string shard_name(int rank, int world, int tp = 1, int tp_rank = 0) {
  if (tp > 1) return fmt::format("optim_tp{:02d}_rank{:05d}_of_{:05d}.safetensors", tp_rank, rank, world);
  return fmt::format("optim_rank{:05d}_of_{:05d}.safetensors", rank, world);
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    DS_CHECK(f.good(), "cannot write {}", tmp.string());
    f << text;
    f.flush();
    DS_CHECK(f.good(), "write failed: {}", tmp.string());
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
  fsync_path(path.parent_path());
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  DS_USER_CHECK(f.good(), "checkpoint: cannot read '{}'", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Tensor host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

nlohmann::json layout_json(const ModelLayout& l) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : l.params) j.push_back({p.name, p.shape});
  return j;
}

}  // namespace

std::string step_dir_name(int64_t iteration) { return "global_step" + std::to_string(iteration); }

void write_checkpoint_files(const std::string& dir, const TrainState& st, const CheckpointData& d,
                            const nlohmann::json& config) {
  fs::path tmp = fs::path(dir) / tmp_dir_name(st.iteration);
  fs::create_directories(tmp);
  // Optimizer shard of this rank.
  {
    SafetensorsWriter w;
    w.add("exp_avg", host(d.m));
    w.add("exp_avg_sq", host(d.v));
    w.set_metadata("begin", std::to_string(d.opt_begin));
    w.set_metadata("end", std::to_string(d.opt_end));
    w.set_metadata("step", std::to_string(d.opt_step));
    w.set_metadata("total", std::to_string((d.opt_layout ? d.opt_layout : d.layout)->total));
    w.write((tmp / shard_name(d.rank, d.world, d.tp, d.tp_rank)).string());
  }
  if (d.rank != 0 || d.tp_rank != 0) return;
  {
    Tensor p = host(d.params);
    SafetensorsWriter w;
    for (const ParamSpec& s : d.layout->params) w.add(s.name, p.view(s.offset, s.shape));
    w.set_metadata("format", "dstrain");
    w.write((tmp / "model.safetensors").string());
  }
  nlohmann::json state = {{"iteration", st.iteration},       {"consumed_samples", st.consumed_samples},
                          {"skipped_steps", st.skipped_steps}, {"loss_scale", st.loss_scale},
                          {"good_steps", st.good_steps},       {"hysteresis_left", st.hysteresis_left},
                          {"optimizer_shards", d.world},       {"layout", layout_json(*d.layout)},
                          {"tensor_model_parallel_size", d.tp},
                          {"config", config}};
  write_text_atomic(tmp / "state.json", state.dump(1));
}

void commit_checkpoint(const std::string& dir, int64_t iteration) {
  fs::path tmp = fs::path(dir) / tmp_dir_name(iteration);
  fs::path final_dir = fs::path(dir) / step_dir_name(iteration);
  fsync_path(tmp);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_path(dir);
  write_text_atomic(fs::path(dir) / "latest", step_dir_name(iteration) + "\n");
}

void save_checkpoint(const std::string& dir, const TrainState& st, const CheckpointData& d,
                     const nlohmann::json& config) {
  write_checkpoint_files(dir, st, d, config);
  commit_checkpoint(dir, st.iteration);
}

namespace {

// Reads and checks every file before anything is copied into `d`.
struct LoadedCheckpoint {
  nlohmann::json state;
  Tensor params;  // host, (total)
  Tensor m, v;    // host, covering [d.opt_begin, d.opt_end)
  int64_t opt_step = 0;
};

void check_layout(const nlohmann::json& saved, const ModelLayout& l, const fs::path& where) {
  DS_USER_CHECK(saved.is_array() && saved.size() == l.params.size(),
                "checkpoint '{}': it has {} weights, the configured model has {} (different model config?)",
                where.string(), saved.is_array() ? saved.size() : 0, l.params.size());
  for (size_t i = 0; i < l.params.size(); ++i) {
    std::string name = saved[i][0].get<std::string>();
    Shape shape = saved[i][1].get<Shape>();
    DS_USER_CHECK(name == l.params[i].name && shape == l.params[i].shape,
                  "checkpoint '{}': weight {} is {} {}, the configured model expects {} {}", where.string(), i,
                  name, shape_str(shape), l.params[i].name, shape_str(l.params[i].shape));
  }
}

// Re-partitions the saved optimizer shards into the range [begin, end).
void load_moments(const fs::path& step, int shards, const CheckpointData& d, LoadedCheckpoint& out) {
  int64_t n = d.opt_end - d.opt_begin;
  out.m = Tensor::zeros({n}, DType::F32);
  out.v = Tensor::zeros({n}, DType::F32);
  int64_t covered = 0;
  for (int r = 0; r < shards; ++r) {
    fs::path f = step / shard_name(r, shards, d.tp, d.tp_rank);
    DS_USER_CHECK(fs::exists(f), "checkpoint '{}': optimizer shard '{}' is missing", step.string(), f.filename().string());
    SafetensorsFile sf = SafetensorsFile::open(f.string());
    auto meta = sf.metadata();
    int64_t b = std::stoll(meta.at("begin")), e = std::stoll(meta.at("end"));
    const int64_t total = (d.opt_layout ? d.opt_layout : d.layout)->total;
    DS_USER_CHECK(std::stoll(meta.at("total")) == total,
                  "checkpoint '{}': optimizer shard for {} parameters, model has {}", f.string(), meta.at("total"),
                  total);
    out.opt_step = std::stoll(meta.at("step"));
    int64_t lo = std::max(b, d.opt_begin), hi = std::min(e, d.opt_end);
    if (lo >= hi) continue;
    Tensor m = sf.get("exp_avg"), v = sf.get("exp_avg_sq");
    DS_USER_CHECK(m.numel() == e - b && v.numel() == e - b, "checkpoint '{}': shard size does not match its range",
                  f.string());
    std::copy_n(m.data<float>() + (lo - b), hi - lo, out.m.data<float>() + (lo - d.opt_begin));
    std::copy_n(v.data<float>() + (lo - b), hi - lo, out.v.data<float>() + (lo - d.opt_begin));
    covered += hi - lo;
  }
  DS_USER_CHECK(covered == n, "checkpoint '{}': optimizer shards cover {} of {} elements", step.string(), covered, n);
}

}  // namespace

bool load_checkpoint(const std::string& dir, TrainState& st, CheckpointData& d) {
  fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest)) return false;
  std::string tag = read_text(latest);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
  fs::path step = fs::path(dir) / tag;
  DS_USER_CHECK(fs::is_directory(step), "checkpoint: '{}' names '{}', which does not exist", latest.string(), tag);
  LoadedCheckpoint lc;
  try {
    lc.state = nlohmann::json::parse(read_text(step / "state.json"));
  } catch (const nlohmann::json::exception& e) {
    DS_USER_ERROR("checkpoint '{}': state.json is corrupt: {}", step.string(), e.what());
  }
  const int saved_tp = lc.state.value("tensor_model_parallel_size", 1);
  DS_USER_CHECK(saved_tp == d.tp,
                "checkpoint '{}' was saved with tensor_model_parallel_size {}, this job uses {}: resuming across "
                "tensor-parallel sizes is not supported yet (its model.safetensors is the full model in "
                "single-process layout; start a new run from it with --init-from after an HF export)",
                step.string(), saved_tp, d.tp);
  check_layout(lc.state.at("layout"), *d.layout, step);
  SafetensorsFile model = SafetensorsFile::open((step / "model.safetensors").string());
  lc.params = Tensor::empty({d.layout->total}, DType::F32);
  for (const ParamSpec& s : d.layout->params) {
    DS_USER_CHECK(model.has(s.name) && model.shape(s.name) == s.shape && model.dtype(s.name) == DType::F32,
                  "checkpoint '{}': model.safetensors lacks f32 weight '{}' {}", step.string(), s.name,
                  shape_str(s.shape));
    lc.params.view(s.offset, s.shape).copy_from(model.get(s.name));
  }
  load_moments(step, lc.state.at("optimizer_shards").get<int>(), d, lc);
  // Everything is read and checked: now fill the destination.
  d.params.copy_from(lc.params);
  d.m.copy_from(lc.m);
  d.v.copy_from(lc.v);
  d.opt_step = lc.opt_step;
  const auto& j = lc.state;
  st.iteration = j.at("iteration").get<int64_t>();
  st.consumed_samples = j.at("consumed_samples").get<int64_t>();
  st.skipped_steps = j.at("skipped_steps").get<int64_t>();
  st.loss_scale = j.at("loss_scale").get<double>();
  st.good_steps = j.at("good_steps").get<int64_t>();
  st.hysteresis_left = j.at("hysteresis_left").get<int64_t>();
  return true;
}

}  // namespace ds
