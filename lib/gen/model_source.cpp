// Loading dsgen's model (model_source.h). A checkpoint's saved config is
// re-read with dstrain's own parser (lib/config), with its parallel layout
// and batch sizes reset to one process, so the model settings mean exactly
// what they meant in training; the weights are read through the reshaping
// loader (lib/ckpt/reshape.h), which assembles any saved TP / PP layout. The
// tokenizer is the copy dstrain saved in the step directory (verified by its
// checksum); a checkpoint without copies falls back to the paths the saved
// config names, used only inside the checkpoint directory (a checkpoint from
// elsewhere must not make dsgen read any file).
#include "lib/gen/model_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/hf.h"
#include "lib/ckpt/reshape.h"
#include "lib/config/config.h"
#include "lib/core/error.h"

namespace fs = std::filesystem;

namespace ds::gen {
namespace {

// The saved resolved config, re-parsed for one process (every parallel size
// 1, whatever layout trained it).
TrainConfig saved_train_config(nlohmann::json c, const std::string& step) {
  DS_USER_CHECK(c.is_object() && c.contains("model") && c["model"].is_object(),
                "checkpoint '{}': state.json has no model config ('config.model'); it was not written by dstrain",
                step);
  return retargeted_train_config(c, ParallelRequest{}, 1, BatchOnRetarget::Drop);
}

// A path from the checkpoint, quoted and cut for an error line.
std::string quoted(const std::string& path) {
  const std::string q = nlohmann::json(path).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return q.size() > 120 ? q.substr(0, 117) + "..." : q;
}

// A tokenizer path stored in a checkpoint's config, used without the user
// naming it only inside the checkpoint directory: a relative path resolves
// against that directory, and the real path (links and ".." resolved) of the
// file -- of a directory's tokenizer.json -- must lie inside it. "" otherwise.
std::string inside_checkpoint(const std::string& stored, const fs::path& load_dir) {
  std::error_code ec;
  const fs::path root = fs::canonical(load_dir, ec);
  if (ec || stored.empty()) return "";
  fs::path p = fs::path(stored).is_relative() ? load_dir / stored : fs::path(stored);
  fs::path real = fs::canonical(p, ec);
  if (!ec && fs::is_directory(real)) real = fs::canonical(real / "tokenizer.json", ec);
  if (ec || !fs::is_regular_file(real)) return "";
  const auto [r, f] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  return r == root.end() && f != real.end() ? real.string() : "";
}

// The run's tokenizer files as the saved config names them, resolved by
// inside_checkpoint; where one is not inside, m.tokenizer_refused says why.
void saved_tokenizer(const DataConfig& d, const fs::path& load_dir, const std::string& step, LoadedModel& m) {
  m.tokenizer.kind = d.tokenizer_kind();
  const std::pair<const char*, const std::string*> files[] = {
      {"vocab_file", &d.vocab_file}, {"merge_file", &d.merge_file}, {"tokenizer_model", &d.tokenizer_model}};
  std::string* out[] = {&m.tokenizer.vocab_file, &m.tokenizer.merge_file, &m.tokenizer.model_path};
  for (int i = 0; i < 3; ++i) {
    const std::string& stored = *files[i].second;
    if (stored.empty()) continue;
    *out[i] = inside_checkpoint(stored, load_dir);
    if (!out[i]->empty()) continue;
    m.tokenizer_refused = fmt::format(
        "checkpoint '{}' names its run's tokenizer (config.data.{} {}), which is not a file inside the checkpoint "
        "directory '{}'; dsgen does not open such paths on its own: pass --vocab-file/--merge-file or "
        "--tokenizer-type/--tokenizer-model (the same files, if you trust this checkpoint)",
        step, files[i].first, quoted(stored), load_dir.string());
    m.has_tokenizer = false;
    return;
  }
  m.has_tokenizer = true;
}

// The tokenizer files dstrain copied into the step directory (state.json
// "tokenizer"), under the same rule: real files inside the step directory.
// Their checksums are checked when they are used (check_model_tokenizer).
void step_tokenizer(const StepState& st, const fs::path& step, LoadedModel& m) {
  m.tokenizer.kind = data::parse_tokenizer_kind(st.tokenizer_type, "checkpoint state.json tokenizer.tokenizer_type");
  for (const auto& [field, name] : st.tokenizer_files) {
    const std::string path = inside_checkpoint(name, step);
    if (path.empty()) {
      m.tokenizer_refused = fmt::format("checkpoint file '{}' (its tokenizer's {}) is missing or not a file inside "
                                        "the checkpoint; pass --vocab-file/--merge-file or "
                                        "--tokenizer-type/--tokenizer-model", (step / name).string(), field);
      return;
    }
    (field == "vocab_file"   ? m.tokenizer.vocab_file
     : field == "merge_file" ? m.tokenizer.merge_file
                             : m.tokenizer.model_path) = path;
    m.tokenizer_checksums.emplace_back(path, st.checksums.at(name));
  }
  m.has_tokenizer = true;
}

LoadedModel load_checkpoint_model(const ModelSource& src, int tp) {
  const std::string step = find_step_dir(src.load, src.tag);
  DS_USER_CHECK(!step.empty(), "--load {}: no checkpoint there ('latest' missing; give --tag global_stepN)", src.load);
  StepState state = read_step_state(step);
  DS_USER_CHECK(state.config.is_object(), "checkpoint file '{}/state.json': field 'config' is missing", step);
  const TrainConfig tc = saved_train_config(state.config, step);
  ModelConfig saved_cfg = tc.model;
  DS_USER_CHECK(saved_cfg.vocab_size > 0, "checkpoint '{}': its config has no vocab_size", step);
  saved_cfg.padded_vocab_size =
      padded_vocab(saved_cfg.vocab_size, saved_cfg.make_vocab_size_divisible_by, 1);  // replaced by the saved one
  LoadedModel m;
  const bool copies = !state.tokenizer_files.empty();
  if (copies) step_tokenizer(state, step, m);
  const SavedStep saved = open_saved_step(step, std::move(state), saved_cfg);
  m.model = saved.model;
  m.model.padded_vocab_size = padded_vocab(m.model.vocab_size, m.model.make_vocab_size_divisible_by, tp);
  m.model.hidden_dropout = m.model.attention_dropout = 0.f;
  m.full = build_layout(m.model);
  m.params = read_full_params(saved, m.full);
  m.where = step;
  const DataConfig& d = tc.data;
  if (!copies && (!d.vocab_file.empty() || !d.tokenizer_model.empty())) saved_tokenizer(d, src.load, step, m);
  m.device = tc.device == DeviceType::CUDA ? "cuda" : "cpu";
  return m;
}

nlohmann::json read_json_file(const fs::path& p, const std::string& flag) {
  std::ifstream f(p);
  DS_USER_CHECK(f.good(), "{} {}: cannot read '{}'", flag, p.parent_path().string(), p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    DS_USER_ERROR("{}: '{}' is not valid JSON ({})", flag, p.string(), e.what());
  }
}

LoadedModel load_hf_model(const ModelSource& src, int tp) {
  const fs::path dir(src.init_from);
  DS_USER_CHECK(fs::is_directory(dir), "--init-from {}: not a directory (expected config.json + model.safetensors "
                "or pytorch_model.bin)", src.init_from);
  DS_USER_CHECK(fs::exists(dir / "model.safetensors") || fs::exists(dir / "pytorch_model.bin"),
                "--init-from {}: no model.safetensors or pytorch_model.bin there (sharded checkpoints with an "
                "index.json are not supported)", src.init_from);
  const fs::path cfg_file = dir / "config.json";
  const nlohmann::json j = read_json_file(cfg_file, "--init-from");
  LoadedModel m;
  m.model = model_config_from_hf(j, cfg_file.string(), tp);
  m.full = build_layout(m.model);
  // config.json against the shapes the safetensors header declares, before the model is allocated.
  check_hf_weights(m.model, m.full, dir.string(), "'" + cfg_file.string() + "'");
  m.params = Tensor::zeros({m.full.total}, DType::F32);
  import_hf(m.model, m.full, m.params, dir.string());
  m.where = src.init_from;
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) m.eos_id = j["eos_token_id"].get<int>();
  // Tokenizer files saved beside the model (transformers' save_pretrained).
  if (fs::exists(dir / "tokenizer.json")) {
    m.tokenizer.kind = data::TokenizerKind::HF;
    m.tokenizer.model_path = dir.string();
    m.has_tokenizer = true;
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    m.tokenizer.kind = data::TokenizerKind::GPT2BPE;
    m.tokenizer.vocab_file = (dir / "vocab.json").string();
    m.tokenizer.merge_file = (dir / "merges.txt").string();
    m.has_tokenizer = true;
  } else if (fs::exists(dir / "tokenizer.model")) {
    m.tokenizer.kind = data::TokenizerKind::Llama2;
    m.tokenizer.model_path = (dir / "tokenizer.model").string();
    m.has_tokenizer = true;
  }
  return m;
}

}  // namespace

void check_model_tokenizer(const LoadedModel& m) {
  DS_USER_CHECK(m.tokenizer_refused.empty(), "{}", m.tokenizer_refused);
  DS_USER_CHECK(m.has_tokenizer, "{} names no tokenizer: give --vocab-file/--merge-file or --tokenizer-type and "
                "--tokenizer-model", m.where);
  for (const auto& [file, want] : m.tokenizer_checksums) {
    const uint32_t got = file_crc32c(file);
    DS_USER_CHECK(got == want, "checkpoint file '{}' is corrupt: its checksum is {}, state.json recorded {}", file,
                  crc32c_text(got), crc32c_text(want));
  }
}

LoadedModel load_model(const ModelSource& src, int tp) {
  DS_USER_CHECK(src.load.empty() != src.init_from.empty(), "give exactly one of --load CKPT_DIR and --init-from HF_DIR");
  return src.load.empty() ? load_hf_model(src, tp) : load_checkpoint_model(src, tp);
}

}  // namespace ds::gen
