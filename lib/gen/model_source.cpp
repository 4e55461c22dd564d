// Loading dsgen's model (model_source.h). A checkpoint's saved config is
// re-read with dstrain's own parser (lib/train), with its parallel layout
// and batch sizes reset to one process, so the model settings mean exactly
// what they meant in training; the weights are read through the reshaping
// loader (lib/ckpt/reshape.h), which assembles any saved TP / PP layout.
#include "lib/gen/model_source.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/ckpt/hf.h"
#include "lib/ckpt/reshape.h"
#include "lib/core/error.h"
#include "lib/train/config.h"

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
  const SavedStep saved = open_saved_step(step, std::move(state), saved_cfg);
  LoadedModel m;
  m.model = saved.model;
  m.model.padded_vocab_size = padded_vocab(m.model.vocab_size, m.model.make_vocab_size_divisible_by, tp);
  m.model.hidden_dropout = m.model.attention_dropout = 0.f;
  m.full = build_layout(m.model);
  m.params = read_full_params(saved, m.full);
  m.where = step;
  const DataConfig& d = tc.data;
  m.has_tokenizer = !d.vocab_file.empty() || !d.tokenizer_model.empty();
  if (m.has_tokenizer) {
    m.tokenizer.kind = d.tokenizer_type.empty() ? data::TokenizerKind::GPT2BPE
                                                : data::parse_tokenizer_kind(d.tokenizer_type, "config tokenizer_type");
    m.tokenizer.vocab_file = d.vocab_file;
    m.tokenizer.merge_file = d.merge_file;
    m.tokenizer.model_path = d.tokenizer_model;
  }
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
  DS_USER_CHECK(fs::is_directory(dir), "--init-from {}: not a directory (expected config.json + model.safetensors)",
                src.init_from);
  DS_USER_CHECK(fs::exists(dir / "model.safetensors"), "--init-from {}: no model.safetensors there (sharded "
                "checkpoints with model.safetensors.index.json are not supported)", src.init_from);
  const fs::path cfg_file = dir / "config.json";
  const nlohmann::json j = read_json_file(cfg_file, "--init-from");
  LoadedModel m;
  m.model = model_config_from_hf(j, cfg_file.string(), tp);
  m.full = build_layout(m.model);
  m.params = Tensor::zeros({m.full.total}, DType::F32);
  import_hf(m.model, m.full, m.params, (dir / "model.safetensors").string());
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

LoadedModel load_model(const ModelSource& src, int tp) {
  DS_USER_CHECK(src.load.empty() != src.init_from.empty(), "give exactly one of --load CKPT_DIR and --init-from HF_DIR");
  return src.load.empty() ? load_hf_model(src, tp) : load_checkpoint_model(src, tp);
}

}  // namespace ds::gen
