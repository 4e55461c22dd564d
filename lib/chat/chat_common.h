// What DeepSpeed-Chat's training steps share (dschat sft, dschat reward):
// the datasets of --data_path, the model directory with its tokenizer and
// the vocabulary the steps resize to, the DeepSpeed config
// get_train_ds_config builds with the client optimizer and transformers'
// schedule, print_rank_0, and the model written into --output_dir.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/chat/chat_args.h"
#include "lib/chat/chat_tokenizer.h"
#include "lib/chat/pairs.h"
#include "lib/comm/communicator.h"
#include "lib/config/config.h"
#include "lib/core/tensor.h"
#include "lib/model/model_config.h"

namespace ds {
class Trainer;
}

namespace ds::chat {

// One dataset of --data_path / --sft_only_data_path: its train and eval examples.
struct RawDataset {
  std::vector<ChatExample> train, eval;
};
// local/jsonfile (DeepSpeed-Chat's test: a substring of the path) or a
// directory holding train.json and eval.json (or .jsonl); `flag` names it.
RawDataset read_dataset(const std::string& path, const std::string& flag);

// The argparse specs the steps' main.py files share, in their order: from
// --per_device_train_batch_size to --zero_stage (learning-rate default
// `lr`), the four LoRA flags, and deepspeed.add_config_arguments'.
std::vector<ArgSpec> training_arg_specs(const char* lr);
std::vector<ArgSpec> lora_arg_specs();
std::vector<ArgSpec> deepspeed_arg_specs();

// --deepspeed_config: refused with DeepSpeed's own reason (deepspeed.initialize
// refuses a second config beside the one the step builds).
void refuse_deepspeed_config(const ParsedArgs& a, const char* prog);

// The flags every step checks the same way.
struct CommonArgs {
  int64_t B = 0, eval_b = 0, T = 0, epochs = 0, ga = 0, warmup = 0, seed = 0, zero_stage = 0;
};
CommonArgs common_args(const ParsedArgs& a, const char* prog);

// --model_name_or_path resolved (a directory or a hub-cache name), its
// tokenizer as load_hf_tokenizer gives it, and the model: dropout as the
// step trains it (--dropout), the vocabulary resized to len(tokenizer)
// rounded up to 8, --max_seq_len positions.
struct ChatModel {
  std::filesystem::path dir;
  ChatTokenizer tok;
  ModelConfig model;
  int64_t file_vocab = 0;  // the file's embedding rows (< model.vocab_size: resized)
  std::string name;        // config.json's _name_or_path, else the flag's value (the tokenizer's LLaMA rule)
};
ChatModel load_chat_model(const ParsedArgs& a, const char* prog, const std::optional<std::string>& eot_token);
// The same for any model flag (step 3's --actor_model_name_or_path and
// --critic_model_name_or_path): `path` given as `flag`, `dropout` replacing
// the config's, `T` positions; with `tokenizer_of` (step 3's critic) the
// tokenizer is that model's (and the vocabulary resized to it), else the
// directory's own.
ChatModel load_model_dir(const std::string& path, const char* flag, const std::optional<double>& dropout, int64_t T,
                         const char* prog, const std::optional<std::string>& eot_token,
                         const ChatModel* tokenizer_of = nullptr);

// --lora_dim, --lora_module_name, --only_optimize_lora, --lora_learning_rate
// as DeepSpeed-Chat applies them (convert_linear_layer_to_lora,
// only_optimize_lora_parameters, get_optimizer_grouped_parameters' LoRA group)
// onto m (after its head is decided: the module names depend on it).
void apply_lora(const ParsedArgs& a, ModelConfig& m, const char* prog);
struct LoraFlags {
  int64_t dim = 0;
  std::string module;
  bool only_lora = false;
  double lr = 0;  // the LoRA tensors' learning rate
  std::string dim_flag = "--lora_dim", module_flag = "--lora_module_name";  // for messages
};
// The same from explicit values; `lr` is the model's base learning rate.
void apply_lora(const LoraFlags& f, double lr, ModelConfig& m, const char* prog);

// The training config: get_train_ds_config's DeepSpeed config (tensorboard
// job `tb_job`), the client optimizer (AdamW, betas 0.9 / 0.95), `steps`
// optimizer steps, and transformers' --lr_scheduler_type over sched_total.
TrainConfig chat_train_config(const ParsedArgs& a, const ChatModel& cm, const CommonArgs& c, int world,
                              int64_t steps, int64_t sched_total, const char* tb_job, const char* prog);
// What get_train_ds_config and the step's optimizer take from the flags, per
// trained model (step 3 trains two, each with its own flags).
struct TrainFlags {
  double lr = 0, weight_decay = 0;
  int64_t zero_stage = 0, B = 1, ga = 1, warmup = 0, seed = 0;
  bool recompute = false, offload = false, tensorboard = false;
  std::string dtype = "fp16", scheduler = "cosine", tensorboard_path;
};
TrainFlags train_flags(const ParsedArgs& a, const CommonArgs& c);  // steps 1 and 2
TrainConfig chat_train_config(const TrainFlags& f, const ChatModel& cm, int world, int64_t steps,
                              int64_t sched_total, const char* tb_job, const char* prog);

void say(const std::string& s);  // DeepSpeed-Chat's print_rank_0: rank 0 prints, flushed

// Elements [offset, offset + n) of a host tensor of f32, bf16 or f16 (a
// model's outputs in its compute dtype) read as f32, or written from f32.
void load_f32(const Tensor& t, int64_t offset, int64_t n, float* out);
void store_f32(const Tensor& t, int64_t offset, int64_t n, const float* in);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Copies the tokenizer files of model directory `from` into `to` (those it
// does not hold yet).
void copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to);

// The model and its tokenizer files into `out`, which may hold other files
// (DeepSpeed-Chat's scripts send their log there): written complete into a
// temporary directory inside it, then each file renamed into place.
// Collective (rank 0 writes).
void export_into(Trainer& trainer, const std::filesystem::path& out, const std::filesystem::path& model_dir,
                 int rank);

// Removes the step directories (global_stepN) of checkpoint directory `dir`
// other than iteration `keep`'s: dschat keeps only the newest checkpoint.
void keep_newest_checkpoint(const std::filesystem::path& dir, int64_t keep);

// dschat's resumable checkpoint for steps 1 and 2 (--checkpoint_dir DIR,
// dschat's addition; docs/dschat.md): after every epoch the trained model's
// training state (dstrain's checkpoint format: weights, optimizer state,
// schedule, counters) goes to DIR/model, only the newest kept, and
// DIR/dschat_state.json records which epoch each saved iteration ended; a run
// with the same flags and DIR continues after the last saved epoch, as the
// uninterrupted run would. With DIR, SIGTERM (a scheduler's preemption
// notice) stops the run at the end of the current epoch, after its save.
class EpochCheckpoint {
 public:
  // `step`: "sft" or "reward" (a DIR of the other step is refused).
  EpochCheckpoint(const std::optional<std::string>& dir, const char* step, const char* prog);
  bool on() const { return !dir_.empty(); }
  bool resuming() const { return resume_; }
  // Points the training config's save (and, when resuming, load) at DIR/model.
  void configure(TrainConfig& cfg) const;
  // The epochs the loaded checkpoint completed (0 when not resuming); call
  // once the trainer is built.
  int64_t resume(const Trainer& t);
  // After epoch `done` (1-based) ended: the checkpoint (collective). Returns
  // true when SIGTERM asked every rank to stop.
  bool end_of_epoch(Trainer& t, int64_t done, Communicator& world);

 private:
  std::string dir_, step_, prog_;
  bool resume_ = false;
  nlohmann::json state_;  // {"step": ..., "epochs": {"<iteration>": epochs done}}
  int64_t saved_iteration_ = -1;
};

}  // namespace ds::chat
