// Pieces of the config layer shared between config*.cpp (not for other modules).
// Flow: flags -> JSON patch merged over the file -> read_config_json ->
// derive_config (batch triple, sizes, schedule lengths) -> validate_config ->
// config_to_json (the `resolved` document).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/config/config_fields.h"
#include "lib/core/json_config.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ds {

using Warnings = std::vector<std::string>;

// DeepSpeed's batch-size keys (the batch triple).
inline constexpr const char* kTbs = "train_batch_size";
inline constexpr const char* kMbs = "train_micro_batch_size_per_gpu";
inline constexpr const char* kGas = "gradient_accumulation_steps";

// A DeepSpeed-owned JSON object: typed reads like JsonSection, but keys nobody
// read become named warnings (collected in `w`) instead of errors.
class DsSection {
 public:
  DsSection(const nlohmann::json& obj, std::string path, Warnings& w);
  template <class T>
  T get(const std::string& key, const T& fallback) {
    read_.insert(key);
    return s_.get<T>(key, fallback);
  }
  bool has(const std::string& key) const { return s_.has(key); }
  DsSection section(const std::string& key);
  // The key is honoured silently when its value is `ours` (what dstrain always
  // does); any other value is warned about by name.
  void accept_if(const std::string& key, const nlohmann::json& ours);
  void mark(const std::string& key) {
    read_.insert(key);
    s_.mark(key);  // JsonSection's key log (test_config_docs)
  }
  void finish();  // warns about every key not read
  std::string full(const std::string& key) const { return s_.full(key); }
  const nlohmann::json& raw() const { return s_.raw(); }
  Warnings& warnings() { return w_; }

 private:
  JsonSection s_;
  Warnings& w_;
  std::set<std::string> read_;
};

void add_warning(Warnings& w, std::string msg);

// DeepSpeed features dstrain does not implement (config_upstream.cpp):
// refused where they would change what is trained, else accepted with one
// line. The top-level sections; zero_optimization's keys (after its stage is
// read: the deprecated cpu_offload aliases set the offload devices); a
// precision section's 16-bit master weights key.
void read_upstream_sections(DsSection& root);
void read_zero_upstream(DsSection& zero, ZeroConfig& z);
void refuse_16bit_master(DsSection& precision, const std::string& key);

// Writes v at `pointer` in j; UserError naming `flag` if the path is blocked.
void set_at(nlohmann::json& j, const std::string& pointer, const nlohmann::json& v, const std::string& flag);
// Megatron-DeepSpeed compatibility flags (config_compat_flags.cpp): parsed into
// `out` (flag name -> value), then applied over the merged config.
// The flag table (config_flags.cpp): each plain flag and the JSON pointer it
// sets, in table order.
std::vector<std::pair<std::string, std::string>> table_flags();

void add_compat_flags(CLI::App& app, std::map<std::string, nlohmann::json>& out);
void apply_compat_flags(nlohmann::json& j, const std::map<std::string, nlohmann::json>& sp, Warnings& w);
// The model section's plain keys (config_sections.cpp's field table) as
// JSON; model_json adds the keys with logic.
// Mixture of Experts (config_moe.cpp): Megatron-DeepSpeed's MoE flags, the
// "model.moe" section, and the checks of the model and of the layout.
void add_moe_flags(CLI::App& app, std::map<std::string, nlohmann::json>& out);
void apply_moe_flags(nlohmann::json& j, const std::map<std::string, nlohmann::json>& sp, Warnings& w);
void read_moe_section(JsonSection s, MoeConfig& m);
// "num_experts" of `s` into out when present: one integer or a list (empty
// only with allow_empty), each in [1, kMaxExperts]; `flag` names the flag.
void read_expert_counts(JsonSection& s, const char* flag, bool allow_empty, std::vector<int>& out);
nlohmann::json moe_json(const MoeConfig& m);
void validate_moe_model(const ModelConfig& m);
void validate_moe_parallel(const TrainConfig& cfg);
// Knowledge distillation (config_distill.cpp): Megatron-DeepSpeed's --kd/--mos
// flags, the "training.distillation" section and the checks.
void add_distill_flags(CLI::App& app, std::map<std::string, nlohmann::json>& out);
void apply_distill_flags(nlohmann::json& j, const std::map<std::string, nlohmann::json>& sp);
void read_distill_section(JsonSection s, DistillConfig& d);
nlohmann::json distill_json(const DistillConfig& d);
void validate_distill(const TrainConfig& cfg);

// DeepSpeed Data Efficiency's random-LTD (config_data_efficiency.cpp): the
// data_routing section (`routing`), the resolved data_efficiency section, the checks.
void read_random_ltd(DsSection& routing, RandomLtdConfig& r);
// A curriculum schedule's keys (min/max_difficulty, schedule_type, schedule_config).
void read_curriculum_schedule(DsSection& s, CurriculumConfig& c);
nlohmann::json curriculum_schedule_json(const CurriculumConfig& c);  // its schedule_config
// data_efficiency.data_sampling (`d` is the data_efficiency section); its
// curriculum is read in full only with --data-efficiency-curriculum-learning
// (`flag`), as upstream builds the sampler only then.
void read_data_sampling(DsSection& d, DsSection& sampling, DataSamplingConfig& ds, bool flag);
nlohmann::json data_sampling_json(const DataSamplingConfig& ds);
void validate_data_sampling(const TrainConfig& cfg, Warnings& w);
nlohmann::json random_ltd_json(const RandomLtdConfig& r);
void validate_random_ltd(const TrainConfig& cfg, Warnings& w);

// Parses argv; on --help fills help_text. Returns the merged JSON: the config
// file (if any) with every flag applied over it.
nlohmann::json merge_command_line(int argc, char** argv, std::string& config_path,
                                  std::string& help_text, Warnings& w);

// Reads every section of the merged JSON into cfg (no derivation yet).
void read_config_json(const nlohmann::json& j, TrainConfig& cfg, Warnings& w);
// Fills derived values (dp, batch triple, ffn size, padded vocab, decay length).
void derive_config(TrainConfig& cfg, int world_size, Warnings& w);
// Cross-field checks; each failure is one UserError naming fields and values.
void validate_config(const TrainConfig& cfg, int world_size, Warnings& w);

// Case-insensitive lookup of a string value among named choices.
template <class E>
struct Choice {
  const char* name;
  E value;
};
std::string lower(std::string s);

// Reads an enumerated string key (case-insensitive); absent = current.
template <class E, size_t N>
inline E read_choice(JsonSection& s, const std::string& key, const Choice<E> (&choices)[N], E current) {
  if (!s.has(key)) {
    s.mark(key);
    return current;
  }
  const std::string v = lower(s.get<std::string>(key, ""));
  std::string names;
  for (const auto& c : choices) {
    if (v == c.name) return c.value;
    names += (names.empty() ? "" : ", ") + std::string(c.name);
  }
  DS_USER_ERROR("config: '{}' is {}; expected one of: {}", s.full(key), s.raw().at(key).dump(), names);
}

}  // namespace ds
