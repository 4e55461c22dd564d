// Checkpoint save/load with an atomic step directory and `latest` pointer.
#include "lib/ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/reshape.h"
#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/progress.h"

namespace fs = std::filesystem;

namespace ds {
OptimizerStates adam_states(const Tensor& m, const Tensor& v) {
  return {{"exp_avg", m, false}, {"exp_avg_sq", v, true}};
}

std::vector<std::string> model_file_order(const ModelLayout& full) {
  SafetensorsWriter w;
  for (const ParamSpec& s : full.params) w.declare_f32(s.name, s.shape);
  return w.streamed_order();
}

std::string state_names(const OptimizerStates& s) {
  std::string out;
  for (const OptimizerStateTensor& t : s) out += (out.empty() ? "" : ", ") + t.name;
  return out;
}

namespace {

std::string tmp_dir_name(int64_t iteration) { return ".tmp-" + step_dir_name(iteration); }

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void make_dirs(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) throw_write_error(p.string(), ec.value());
}

// Runs fn; on any error removes the temporary step directory and rethrows,
// so a failed save (a full disk) leaves nothing half-written behind.
template <class Fn>
void or_remove(const fs::path& tmp, Fn fn) {
  try {
    fn();
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

// A progress line for a long checkpoint save or load (quick ones stay silent),
// printed by the process that logs (rank 0).
ProgressOptions checkpoint_progress(const std::string& label, int64_t total_bytes) {
  return ProgressOptions{.label = label,
                         .unit = ProgressUnit::Bytes,
                         .total = total_bytes,
                         .style = log_rank() == 0 ? ProgressStyle::Auto : ProgressStyle::Off,
                         .quiet_s = 2};
}

// Records the CRC-32C of every file of the step directory in its state.json,
// and of each 16 MiB chunk of the larger ones (a rank verifies what it reads).
void record_checksums(const fs::path& tmp) {
  const fs::path state_file = tmp / "state.json";
  nlohmann::json state = nlohmann::json::parse(read_small_file(state_file.string(), kMaxStateJsonBytes,
                                                               "checkpoint file '" + state_file.string() + "'"));
  nlohmann::json sums = nlohmann::json::object();
  std::vector<fs::path> files;
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(tmp)) {
    if (e.path().filename() == "state.json" || !e.is_regular_file()) continue;
    files.push_back(e.path());
    total += static_cast<int64_t>(e.file_size());
  }
  Progress progress(checkpoint_progress("checksumming checkpoint " + tmp.string(), total));
  nlohmann::json chunk_sums = nlohmann::json::object();
  for (const fs::path& f : files) {
    std::vector<uint32_t> chunks;
    const std::string name = f.filename().string();
    sums[name] = crc32c_text(file_crc32c(f.string(), kChecksumChunk, chunks, &progress));
    if (chunks.size() < 2) continue;  // one chunk: the file's checksum says it all
    nlohmann::json list = nlohmann::json::array();
    for (uint32_t c : chunks) list.push_back(crc32c_text(c));
    chunk_sums[name] = {{"chunk_bytes", kChecksumChunk}, {"crc32c", std::move(list)}};
  }
  progress.finish();
  state.erase("state_checksum");
  state["checksums"] = sums;
  if (!chunk_sums.empty()) state["chunk_checksums"] = std::move(chunk_sums);
  write_file_atomic(state_file.string(), step_state_text(state));
}

// Elements per piece moved between a storage tier and a checkpoint file (16 MiB).
constexpr int64_t kTierPiece = 4 << 20;

Tensor host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

// Elements of a sharding group's state: its pieces laid one after the other.
int64_t part_size(const CheckpointData::StatePart& part) {
  int64_t n = 0;
  for (const Range& r : part.pieces) n += r.size();
  return n;
}


nlohmann::json layout_json(const ModelLayout& l) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : l.params) j.push_back({p.name, p.shape});
  return j;
}

void write_step_files(const fs::path& tmp, const TrainState& st, const CheckpointData& d,
                      const nlohmann::json& config, Progress& progress) {
  // Optimizer shard of this rank.
  {
    SafetensorsWriter w;
    struct TierState {
      const CheckpointData::TierRead* read;
      size_t i;
      int64_t n;
    };
    std::map<std::string, TierState> tiered;  // the declared (streamed) tensors
    std::string names, non_negative;
    const OptimizerStates& specs = d.opt_parts.empty() ? d.opt_state : d.opt_parts[0].states;
    for (const OptimizerStateTensor& s : specs) {
      names += (names.empty() ? "" : ",") + s.name;
      if (s.non_negative) non_negative += (non_negative.empty() ? "" : ",") + s.name;
    }
    w.set_metadata("states", names);
    w.set_metadata("non_negative", non_negative);
    if (!d.opt_type.empty()) w.set_metadata("optimizer", d.opt_type);
    if (!d.opt_scalars.empty()) w.set_metadata("optimizer_scalars", d.opt_scalars);
    if (d.opt_parts.empty()) {
      for (size_t i = 0; i < d.opt_state.size(); ++i) {
        const OptimizerStateTensor& s = d.opt_state[i];
        if (d.tier_read) {
          w.declare_f32(s.name, {d.opt_end - d.opt_begin});
          tiered[s.name] = {&d.tier_read, i, d.opt_end - d.opt_begin};
        } else {
          w.add(s.name, host(s.t));
        }
      }
      w.set_metadata("begin", std::to_string(d.opt_begin));
      w.set_metadata("end", std::to_string(d.opt_end));
    } else {
      std::string groups, shared;
      for (const CheckpointData::StatePart& part : d.opt_parts) {
        for (size_t i = 0; i < part.states.size(); ++i) {
          const std::string name = part.group + "/" + part.states[i].name;
          if (part.tier_read) {
            w.declare_f32(name, {part_size(part)});
            tiered[name] = {&part.tier_read, i, part_size(part)};
          } else {
            w.add(name, host(part.states[i].t));
          }
        }
        std::string pieces;
        for (const Range& r : part.pieces)
          if (r.size() > 0) pieces += fmt::format("{}{}:{}", pieces.empty() ? "" : ",", r.begin, r.end);
        w.set_metadata("pieces." + part.group, pieces);
        groups += (groups.empty() ? "" : ",") + part.group;
        if (part.ep_shared) shared += (shared.empty() ? "" : ",") + part.group;
      }
      w.set_metadata("groups", groups);
      w.set_metadata("shared_groups", shared);
    }
    w.set_metadata("step", std::to_string(d.opt_step));
    w.set_metadata("total", std::to_string((d.opt_layout ? d.opt_layout : d.layout)->total));
    w.set_metadata("rank", std::to_string(d.rank));
    w.set_metadata("world", std::to_string(d.world));
    w.set_metadata("tp_rank", std::to_string(d.shard.tp_rank));
    w.set_metadata("pp_rank", std::to_string(d.shard.pp_rank));
    if (d.shard.ep > 1) w.set_metadata("ep_rank", std::to_string(d.shard.ep_rank));
    const std::string path = (tmp / optimizer_shard_name(d.rank, d.world, d.shard)).string();
    if (!tiered.empty())  // the tiers' state streamed a bounded piece at a time
      w.write_streamed_bytes(path, [&](const std::string& name, const std::function<void(std::string_view)>& sink) {
        const TierState& t = tiered.at(name);
        std::vector<float> buf;
        for (int64_t lo = 0; lo < t.n; lo += kTierPiece) {
          const int64_t hi = std::min(t.n, lo + kTierPiece);
          buf.resize(static_cast<size_t>(hi - lo));
          (*t.read)(t.i, lo, hi, buf.data());
          sink({reinterpret_cast<const char*>(buf.data()), buf.size() * sizeof(float)});
        }
      }, &progress);
    else
      w.write(path, &progress);
  }
  if (d.rank != 0 || d.shard.tp_rank != 0 || d.shard.pp_rank != 0 || d.shard.ep_rank != 0) return;
  {
    // One weight at a time, from the stream or from the full params.
    const Tensor p = d.stream_params ? Tensor() : host(d.params);
    auto from_params = [&](const std::string& name) {
      const ParamSpec& s = d.layout->find(name);
      return p.view(s.offset, s.shape);
    };
    SafetensorsWriter w;
    for (const ParamSpec& s : d.layout->params) w.declare_f32(s.name, s.shape);
    w.set_metadata("format", "dstrain");
    w.write_streamed((tmp / "model.safetensors").string(),
                     d.stream_params ? d.stream_params : std::function<Tensor(const std::string&)>(from_params),
                     &progress);
  }
  nlohmann::json state = {{"iteration", st.iteration},       {"consumed_samples", st.consumed_samples},
                          {"skipped_steps", st.skipped_steps}, {"loss_scale", st.loss_scale},
                          {"good_steps", st.good_steps},       {"hysteresis_left", st.hysteresis_left},
                          {"lr_scheduler", lr_scheduler_json(st)},
                          {"optimizer_shards", d.world},       {"layout", layout_json(*d.layout)},
                          {"tensor_model_parallel_size", d.shard.tp},
                          {"pipeline_model_parallel_size", d.shard.pp},
                          {"virtual_pipeline_stages", d.shard.vp},
                          {"config", config}};
  if (d.shard.ep > 1) state["expert_parallel_size"] = d.shard.ep;
  // -1: converted from a checkpoint that predates the counter (the loader derives it).
  if (st.consumed_tokens >= 0) state["consumed_tokens"] = st.consumed_tokens;
  if (d.tokenizer) {
    nlohmann::json tok = write_step_tokenizer(*d.tokenizer, tmp);
    if (!tok.is_null()) state["tokenizer"] = std::move(tok);
  }
  write_file_atomic((tmp / "state.json").string(), step_state_text(state));
}

}  // namespace

void write_checkpoint_files(const std::string& dir, const TrainState& st, const CheckpointData& d,
                            const nlohmann::json& config) {
  fs::path tmp = fs::path(dir) / tmp_dir_name(st.iteration);
  make_dirs(tmp);
  const bool model = d.rank == 0 && d.shard.tp_rank == 0 && d.shard.pp_rank == 0 && d.shard.ep_rank == 0;
  int64_t bytes = 4 * (model ? d.layout->total : 0);
  for (const OptimizerStateTensor& s : d.opt_state) bytes += 4 * (d.tier_read ? d.opt_end - d.opt_begin : s.t.numel());
  for (const CheckpointData::StatePart& part : d.opt_parts)
    for (const OptimizerStateTensor& s : part.states) bytes += 4 * (part.tier_read ? part_size(part) : s.t.numel());
  Progress progress(checkpoint_progress(fmt::format("saving checkpoint {}/{}", dir, step_dir_name(st.iteration)),
                                        bytes));
  or_remove(tmp, [&] { write_step_files(tmp, st, d, config, progress); });
  progress.finish();
}

void commit_checkpoint(const std::string& dir, int64_t iteration) {
  fs::path tmp = fs::path(dir) / tmp_dir_name(iteration);
  fs::path final_dir = fs::path(dir) / step_dir_name(iteration);
  or_remove(tmp, [&] {
    record_checksums(tmp);
    fsync_path(tmp);
    std::error_code ec;
    if (fs::exists(final_dir)) fs::remove_all(final_dir, ec);
    if (ec) throw_write_error(final_dir.string(), ec.value());
    fs::rename(tmp, final_dir, ec);
    if (ec) throw_write_error(final_dir.string(), ec.value());
  });
  fsync_path(dir);
  write_file_atomic((fs::path(dir) / "latest").string(), step_dir_name(iteration) + "\n");
}

void save_checkpoint(const std::string& dir, const TrainState& st, const CheckpointData& d,
                     const nlohmann::json& config) {
  remove_stale_temporaries(dir);  // a killed save's partial files never reach this step
  write_checkpoint_files(dir, st, d, config);
  commit_checkpoint(dir, st.iteration);
}

namespace {

using SavedLayout = std::vector<std::pair<std::string, Shape>>;

void check_layout(const SavedLayout& saved, const ModelLayout& l, const std::string& where) {
  DS_USER_CHECK(saved.size() == l.params.size(),
                "checkpoint '{}': it has {} weights, the configured model has {} (different model config?)", where,
                saved.size(), l.params.size());
  for (size_t i = 0; i < l.params.size(); ++i) {
    const auto& [name, shape] = saved[i];
    DS_USER_CHECK(name == l.params[i].name && shape == l.params[i].shape,
                  "checkpoint '{}': weight {} is {} {}, the configured model expects {} {}", where, i, name,
                  shape_str(shape), l.params[i].name, shape_str(l.params[i].shape));
  }
}

// Whether a saved full layout (state.json "layout") equals `l` exactly.
bool same_layout(const SavedLayout& saved, const ModelLayout& l) {
  if (saved.size() != l.params.size()) return false;
  for (size_t i = 0; i < l.params.size(); ++i)
    if (saved[i].first != l.params[i].name || saved[i].second != l.params[i].shape) return false;
  return true;
}

// Elements `r` of saved state i into a storage tier at position `pos` on,
// a bounded piece at a time.
void files_into_tier(SavedStateFiles& files, size_t i, Range r, const CheckpointData::TierWrite& write, int64_t pos) {
  std::vector<float> buf;
  for (int64_t lo = 0; lo < r.size(); lo += kTierPiece) {
    const int64_t hi = std::min(r.size(), lo + kTierPiece);
    buf.resize(static_cast<size_t>(hi - lo));
    files.read(i, r.begin + lo, r.begin + hi, buf.data());
    write(i, pos + lo, pos + hi, buf.data());
  }
}

// The optimizer state of d's range (or of each of d.opt_parts' pieces) into
// host tensors: from the shards of the same layout, or reshaped from another.
// Returns the optimizer step count.
int64_t read_opt_state(const SavedStep& s, const CheckpointData& d, bool same, OptimizerStates& state,
                       std::vector<OptimizerStates>& parts) {
  const ModelLayout& local = d.opt_layout ? *d.opt_layout : *d.layout;
  const ShardCoords at = s.sizes.at(d.shard.tp_rank, d.shard.pp_rank).at_ep(d.shard.ep_rank);
  if (d.opt_parts.empty() && d.tier_write) {  // into the tier a piece at a time (reshaped: assembled first)
    const int64_t n = d.opt_end - d.opt_begin;
    if (!same) {
      const int64_t step = read_reshaped_state(s, *d.layout, local, d.opt_begin, d.opt_end, state);
      for (size_t i = 0; i < state.size(); ++i) d.tier_write(i, 0, n, state[i].t.data<float>());
      state = state_names_only(state);
      return step;
    }
    SavedStateFiles files(s, at, local.total, state);
    for (size_t i = 0; i < state.size(); ++i) files_into_tier(files, i, {d.opt_begin, d.opt_end}, d.tier_write, 0);
    files.verify();
    return files.step();
  }
  if (d.opt_parts.empty())
    return same ? read_state_range(s, at, local.total, d.opt_begin, d.opt_end, state)
                : read_reshaped_state(s, *d.layout, local, d.opt_begin, d.opt_end, state);
  // The same layout: the shard's files are opened once and each piece read
  // straight into place; another layout: each piece reshaped.
  std::optional<SavedStateFiles> files;
  if (same) files.emplace(s, at, local.total, state);
  int64_t step = same ? files->step() : -1;
  for (const CheckpointData::StatePart& part : d.opt_parts) {
    const int64_t n = part_size(part);
    const bool tier = static_cast<bool>(part.tier_write);  // written into the tier as it is read
    OptimizerStates out = part.states;  // the optimizer's own buffers where they are host f32
    if (!tier) prepare_host_states(out, n, false);  // the pieces cover every element
    int64_t pos = 0;
    for (const Range& r : part.pieces) {
      if (r.size() == 0) continue;
      if (same && tier) {
        for (size_t i = 0; i < part.states.size(); ++i) files_into_tier(*files, i, r, part.tier_write, pos);
      } else if (same) {
        for (size_t i = 0; i < out.size(); ++i) files->read(i, r.begin, r.end, out[i].t.data<float>() + pos);
      } else {
        OptimizerStates piece = state_names_only(state);
        step = read_reshaped_state(s, *d.layout, local, r.begin, r.end, piece);
        for (size_t i = 0; i < part.states.size(); ++i) {
          if (tier)
            part.tier_write(i, pos, pos + r.size(), piece[i].t.data<float>());
          else
            out[i].t.view(pos, {r.size()}).copy_from(piece[i].t);
        }
      }
      pos += r.size();
    }
    parts.push_back(tier ? OptimizerStates{} : std::move(out));  // (a tier holds its state already)
  }
  if (files) files->verify();
  if (step < 0) {  // another layout and this rank owns no piece: the step count from an empty read
    OptimizerStates none = state_names_only(state);
    step = read_reshaped_state(s, *d.layout, local, 0, 0, none);
  }
  return step;
}

}  // namespace

bool load_checkpoint(const std::string& dir, TrainState& st, CheckpointData& d) {
  if (!fs::exists(fs::path(dir) / "latest")) return false;
  const std::string step = find_step_dir(dir);
  StepState state = read_step_state(step);
  if (d.model) check_saved_vocab(state, *d.model, step);
  const ShardCoords saved = state.sizes;
  const int saved_tp = saved.tp, saved_pp = saved.pp, saved_vp = saved.vp;
  const ShardCoords& dst = d.shard;
  // (experts split over tp or not: another shard layout at the same sizes)
  const bool saved_etp = saved_tp > 1 && saved_expert_tp(state);
  const bool dst_etp = dst.tp > 1 && (d.model ? d.model->moe.expert_tensor_parallelism : saved_etp);
  const bool same_split = saved_tp == dst.tp && saved_pp == dst.pp && saved_vp == dst.vp && saved.ep == dst.ep &&
                          saved_etp == dst_etp;
  const bool same = same_split && same_layout(state.layout, *d.layout);
  if (!same && d.model == nullptr) {  // no model config: no reshaping
    DS_USER_CHECK(saved_tp == dst.tp,
                  "checkpoint '{}' was saved with tensor_model_parallel_size {}, this job uses {}, and this loader "
                  "cannot reshape it (use dsconvert --target-tp {})",
                  step, saved_tp, dst.tp, dst.tp);
    DS_USER_CHECK(same_split,
                  "checkpoint '{}' was saved with pipeline_model_parallel_size {} (tensor {}, {} virtual stages), this "
                  "job uses {} (tensor {}, {} virtual stages), and this loader cannot reshape it (use dsconvert "
                  "--target-pp {})",
                  step, saved_pp, saved_tp, saved_vp, dst.pp, dst.tp, dst.vp, dst.pp);
    DS_USER_CHECK(saved.ep == dst.ep,
                  "checkpoint '{}' was saved with --moe-expert-parallel-size {}, this job uses {}, and this loader "
                  "cannot reshape it", step, saved.ep, dst.ep);
    check_layout(state.layout, *d.layout, step);
  }
  // Everything is read and checked before the weights are touched (host f32
  // optimizer state is read into in place: prepare_host_states).
  std::error_code ec;
  const auto model_bytes = fs::file_size(fs::path(step) / "model.safetensors", ec);
  Progress progress(checkpoint_progress("loading checkpoint " + step, ec ? 0 : static_cast<int64_t>(model_bytes)));
  Tensor params;
  // The names to read (each sharding group's, with d.opt_parts); their tensors are replaced by host copies.
  OptimizerStates opt_state = d.opt_parts.empty() ? d.opt_state : d.opt_parts[0].states;
  std::vector<OptimizerStates> part_state;
  int64_t opt_step = 0;
  const TrainState train = state.train;
  SavedStep s;
  if (same) {
    s.dir = step;
    s.sizes = saved;
    s.shards = state.shards;
    s.state = std::move(state);
    s.full = *d.layout;
  } else {
    s = open_saved_step(step, std::move(state), *d.model);
  }
  s.progress = &progress;
  if (!d.weights_only) check_saved_states(s, opt_state, d.opt_type);
  // A receiving rank reads its shard of the weights last, checksummed as it
  // is read (what it skips is read for the checksum after); the others the
  // full model now, the same way.
  std::optional<SafetensorsFile> model;
  if (d.receive_params) model = open_saved_model_tracked(s);
  if (!d.receive_params) params = read_full_params(s, *d.layout);
  std::string opt_scalars;
  if (!d.weights_only) {
    opt_step = read_opt_state(s, d, same, opt_state, part_state);
    // (another layout: the saved shards' coordinates are not this rank's; the first one tells)
    opt_scalars = same ? saved_optimizer_scalars(s, s.sizes.at(d.shard.tp_rank, d.shard.pp_rank).at_ep(d.shard.ep_rank))
                       : saved_optimizer_scalars(s, s.sizes.at(0, 0));
    DS_USER_CHECK(same || opt_scalars.empty(),
                  "checkpoint '{}' holds {}'s per-tensor values of its compression stage, which load into the layout "
                  "it was saved with only (tensor {}, pipeline {}; this job: tensor {}, pipeline {}); load it with "
                  "that layout, or load the weights alone (--finetune)",
                  step, d.opt_type, saved_tp, saved_pp, dst.tp, dst.pp);
  }
  progress.finish();
  if (d.receive_params) {
    const ModelLayout& local = d.opt_layout ? *d.opt_layout : *d.layout;
    try {
      d.receive_params(
          [&](int64_t begin, int64_t end, float* out) { read_local_params(s, *model, local, begin, end, out); });
    } catch (const UserError&) {
      verify_saved_model(s, *model);  // a corrupt file is named as such, not by the value it turned into
      throw;
    }
    verify_saved_model(s, *model);
  } else {
    d.params.copy_from(params);
  }
  if (!d.weights_only) {
    // Read in place where the optimizer's state is host f32 (prepare_host_states).
    auto place = [](Tensor& dst, const Tensor& src) {
      if (dst.raw() != src.raw()) dst.copy_from(src);
    };
    if (d.opt_parts.empty() && !d.tier_write)  // (a tier was written as it was read)
      for (size_t i = 0; i < opt_state.size(); ++i) place(d.opt_state[i].t, opt_state[i].t);
    for (size_t p = 0; p < part_state.size(); ++p)
      for (size_t i = 0; i < part_state[p].size(); ++i) place(d.opt_parts[p].states[i].t, part_state[p][i].t);
    d.opt_step = opt_step;
    d.opt_scalars = opt_scalars;
  }
  st = train;
  return true;
}

}  // namespace ds
