// Hugging Face interop: export a model as model.safetensors + config.json in
// transformers' naming and layout (GPT2LMHeadModel, LlamaForCausalLM,
// GPTNeoXForCausalLM, MixtralForCausalLM, OPTForCausalLM), and import such a
// file as initial weights. Export
// writes the real vocabulary rows only; import zero-fills the padded rows.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/ckpt/safetensors.h"
#include "lib/ckpt/step_tokenizer.h"
#include "lib/ckpt/torch_file.h"
#include "lib/core/tensor.h"
#include "lib/model/layout.h"
#include "lib/model/model_config.h"

namespace ds {

// Token ids config.json carries. -1: the last real vocabulary id, which is
// "<|endoftext|>" in the GPT-2 BPE vocabularies dstrain reads (bos = eos).
struct HfTokenIds {
  int bos = -1, eos = -1;
};

// params: (layout.total) f32 on any device. Writes OUTDIR/model.safetensors
// (a value-head model: OUTDIR/pytorch_model.bin in DeepSpeed-Chat's
// RewardModel names, as its steps save one),
// OUTDIR/config.json and the tokenizer's files when given (vocab.json +
// merges.txt, tokenizer.model or tokenizer.json), into a temp dir renamed
// into place. The architecture
// follows the model's blocks (learned positions: GPT2LMHeadModel; RoPE with
// RMSNorm, SwiGLU, no biases, whole-head rotation, any NKV: LlamaForCausalLM;
// RoPE, any rotary_percent, with LayerNorm, GELU, biases: GPTNeoXForCausalLM);
// another combination is a UserError naming the block that does not map.
void export_hf(const ModelConfig& cfg, const ModelLayout& layout, const Tensor& params, const std::string& outdir,
               const HfTokenIds& tokens = {}, const StepTokenizer* tokenizer = nullptr);
// The same export with the weights asked for one at a time: weight(name)
// returns our full f32 host weight `name` of `layout` (its shape), so that
// the exporter holds one of our weights and one HF tensor at a time
// (dsconvert reads each from the checkpoint).
using HfWeightSource = std::function<Tensor(const std::string& name)>;
void export_hf_streamed(const ModelConfig& cfg, const ModelLayout& layout, const HfWeightSource& weight,
                        const std::string& outdir, const HfTokenIds& tokens = {},
                        const StepTokenizer* tokenizer = nullptr);
// The names export_hf_streamed asks its weight source for, in order (a
// collective source, such as a gather to the writing rank, runs the same
// sequence on the ranks that do not write).
std::vector<std::string> hf_export_requests(const ModelConfig& cfg, const ModelLayout& layout);

// LoRA targets as DeepSpeed-Chat's convert_linear_layer_to_lora picks them:
// every Hugging Face nn.Linear of the transformer blocks (attention and MLP
// projections) whose module name (transformers' naming of cfg's export:
// "model.decoder.layers.0.self_attn.q_proj", a value-head model's
// "rwtransformer.decoder...") contains `module_substring`. GPT-2's Conv1D
// layers are not nn.Linear, so they are never adapted, as there. A matching
// linear dschat does not adapt (lm_head, v_head, the experts) is a UserError.
// The export fuses each target's delta into its weight (no LoRA tensors in
// the file); an import reads MODULE.lora_left_weight / lora_right_weight
// where the file holds them (unfused LoRA weights), else initialises them.
std::vector<LoraTarget> lora_targets_for(const ModelConfig& cfg, const std::string& module_substring,
                                         const std::string& flag = "--lora_module_name");
// The LoRA targets (index in cfg.lora.targets, target) that adapt our weight
// `name`, and the names of a target's tensors (part "left" / "right"). A
// collective export source is asked for each adapted weight's left and right
// tensors right after it (hf_export_requests), so that the writer's source
// can fuse them into the weight (Trainer::export_hf).
std::vector<std::pair<size_t, const LoraTarget*>> lora_targets_of(const ModelConfig& cfg, const std::string& name);
std::string lora_name(const LoraTarget& t, size_t k, const char* part);
// The same check export_hf makes first, for a trainer to refuse at start-up
// (`what` names the input in the error) rather than after training.
void check_hf_exportable(const ModelConfig& cfg, const char* what);

// Checks an export directory before any work: it may not exist yet, be an
// empty directory or a previous export (config.json, model.safetensors or pytorch_model.bin and
// tokenizer files only), which export_hf replaces; anything else (a file, a directory with
// other files) is a UserError naming `what` ("--export-hf"), never removed.
void check_export_dir(const std::string& outdir, const char* what);

// One HF tensor = rows [row0, row0 + rows) of our weight, optionally
// transposed; or, with head_interleave = HS, our whole [q | k | v] weight with
// its rows regrouped per head as [q_h | k_h | v_h] (GPT-NeoX's fused qkv).
struct HfPiece {
  std::string hf_name, our_name;
  int64_t row0 = 0, rows = -1;  // rows of our weight (-1 = all; vocab rows for embeddings)
  bool transpose = false;
  int64_t head_interleave = 0;
  // Leading rows of the HF tensor with no counterpart here (OPT's learned
  // positions start at row 2): skipped on import, written as zeros on export.
  int64_t hf_pad_rows = 0;
};

// Hugging Face weights read a rank's shard at a time (--init-from): the
// file (or directory's model.safetensors) is opened and every tensor checked
// against the model once; read() fills any range [begin, end) of a shard
// layout `local` of that model (its tp rank, stage, expert-parallel rank),
// reading only the HF tensors that hold some of its elements, one at a time
// (converted to f32), so that a rank never holds the whole model.
// Hugging Face weights in either format transformers saves: model.safetensors,
// or pytorch_model.bin (PyTorch's zip format, read without executing
// anything: torch_file.h). open() takes a file (told apart by its first
// bytes) or a directory holding one of the two (model.safetensors first).
class HfWeightsFile {
 public:
  static HfWeightsFile open(const std::string& path);
  bool has(const std::string& name) const;
  Shape shape(const std::string& name) const;
  std::string dtype_string(const std::string& name) const;  // safetensors' spelling: "F32", "BF16", "F16", ...
  Tensor get(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  std::shared_ptr<SafetensorsFile> st_;
  std::shared_ptr<TorchFile> pt_;
  std::string path_;
};

//
// file_vocab > 0: the file's embedding (and untied output layer) has that
// many rows, fewer than the model's vocabulary (DeepSpeed-Chat resizes the
// embedding to len(tokenizer) rounded up to 8): rows [file_vocab, V) start as
// the mean of the file's rows, as transformers' resize_token_embeddings
// (mean_resizing, without its 1e-9-scaled noise).
//
// A value-head model (ModelConfig::value_head) reads DeepSpeed-Chat's
// reward / critic files ("rwtransformer." + the base model's names,
// "v_head.weight"), a causal LM's or a base model's file; a file without
// v_head.weight leaves the head to `init` (fresh_head()), as it does LoRA
// tensors the file does not hold.
class HfShardReader {
 public:
  // Fills [begin, end) of layout `local` (out) for a tensor the file does not hold.
  using ParamInit = std::function<void(const ModelLayout& local, int64_t begin, int64_t end, float* out)>;
  HfShardReader(const ModelConfig& cfg, const ModelLayout& full, const std::string& path, int64_t file_vocab = 0,
                ParamInit init = {});
  void read(const ModelLayout& local, int64_t begin, int64_t end, float* out) const;
  bool fresh_head() const { return fresh_head_; }

 private:
  HfWeightsFile sf_;
  bool fresh_head_ = false;
  std::vector<HfPiece> pieces_;
  ParamInit init_;
  int64_t file_vocab_ = 0, vocab_ = 0;  // rows [file_vocab_, vocab_) of the vocabulary pieces: the mean
};

// Fills params (layout.total, any device) from an HF safetensors file or a
// directory holding model.safetensors. Mismatched names/shapes -> UserError,
// from check_hf_weights before anything is allocated.
void import_hf(const ModelConfig& cfg, const ModelLayout& layout, Tensor& params, const std::string& path);

// Checks, from the safetensors header alone (nothing is read or allocated
// for the tensors), that the HF weights at `path` (a file, or a directory
// holding model.safetensors) declare every tensor of the model cfg / layout
// (tp 1) describes, with the shape it gives and a dtype import_hf reads. One
// UserError names the first missing or mismatching tensor, the file and
// `config_from` (what gave the model's shape: "'DIR/config.json'").
void check_hf_weights(const ModelConfig& cfg, const ModelLayout& layout, const std::string& path,
                      const std::string& config_from, int64_t file_vocab = 0);

// ModelConfig of a Hugging Face config.json (model_type gpt2, llama,
// mixtral, gpt_neox, opt): the inverse of the config.json export_hf writes. `file` and
// `what` (the option that named it) appear in errors; a field missing or of
// the wrong type, or a feature not implemented here, is a UserError. Dropout
// is off and the vocabulary is padded to a multiple of tp only.
// The model limits (check_model_limits) are applied here, naming the file.
ModelConfig model_config_from_hf(const nlohmann::json& j, const std::string& file, int tp,
                                 const char* what = "--init-from");

}  // namespace ds
