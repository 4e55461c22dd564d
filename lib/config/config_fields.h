// Config field tables: each config struct's plain keys (a number, a flag or a
// string stored as it is read) declared once, as a key and the member it
// fills. The JSON reader (read_fields) and the writer of the resolved config
// (write_fields) both walk the table, so a key cannot be read under one name
// and saved under another, or read and never saved. Keys with logic (enums,
// lists, defaults that depend on other keys, aliases, checks across keys)
// are written out beside the table in both places; test_config_docs checks
// every key read against docs/config.md, and test_config_fields that every
// table entry survives a write and a read.
//
// Adding a plain key: one line in its section's table (lib/config), a row
// in docs/config.md, and a flag in the flag table if it has one.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace ds {

// A float as the shortest decimal that reads back to the same float ("0.0006",
// not "0.0006000000284984708"), so a saved config stays readable.
inline double shortest_decimal(float f) { return std::stod(fmt::format("{}", f)); }

template <class Root>
struct ConfigField {
  const char* key;
  // The member, reached through a captureless accessor (members of nested
  // structs included): DS_CONFIG_FIELD below makes one.
  std::variant<int& (*)(Root&), int64_t& (*)(Root&), float& (*)(Root&), double& (*)(Root&), bool& (*)(Root&),
               std::string& (*)(Root&)>
      at;
};

// A table entry: DS_CONFIG_FIELD(Root, "key", member.path).
#define DS_CONFIG_FIELD(Root, key, path) \
  ::ds::ConfigField<Root> { key, +[](Root& r) -> decltype(auto) { return (r.path); } }

// Reads every field present in section s (a JsonSection or DsSection: both
// log the keys they read); absent keys keep the member's value.
template <class Section, class Root>
void read_fields(Section& s, Root& r, std::span<const ConfigField<Root>> table) {
  for (const ConfigField<Root>& f : table)
    std::visit(
        [&](auto at) {
          auto& m = at(r);
          m = s.template get<std::decay_t<decltype(m)>>(f.key, m);
        },
        f.at);
}

// Writes every field into j (floats as their shortest decimal).
template <class Root>
void write_fields(nlohmann::json& j, const Root& r, std::span<const ConfigField<Root>> table) {
  Root& m = const_cast<Root&>(r);  // the accessors take a mutable root; nothing is written
  for (const ConfigField<Root>& f : table)
    std::visit(
        [&](auto at) {
          const auto& v = at(m);
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, float>)
            j[f.key] = shortest_decimal(v);
          else
            j[f.key] = v;
        },
        f.at);
}

struct ModelConfig;
struct DataConfig;
struct TrainConfig;
struct ParallelConfig;
struct PrecisionConfig;
struct ZeroConfig;
struct NvmeOffloadConfig;
struct AioConfig;
struct LoggingConfig;

// The tables (config_tables.cpp), one per section: model, data, training,
// parallel (ours); fp16, zero_optimization, its offload_optimizer with
// device nvme, aio, csv_monitor, tensorboard (DeepSpeed's).
std::span<const ConfigField<ModelConfig>> model_fields();
std::span<const ConfigField<DataConfig>> data_fields();
std::span<const ConfigField<TrainConfig>> training_fields();
std::span<const ConfigField<ParallelConfig>> parallel_fields();
std::span<const ConfigField<PrecisionConfig>> fp16_fields();
std::span<const ConfigField<ZeroConfig>> zero_fields();
std::span<const ConfigField<NvmeOffloadConfig>> nvme_fields();
std::span<const ConfigField<AioConfig>> aio_fields();
std::span<const ConfigField<LoggingConfig>> csv_monitor_fields();
std::span<const ConfigField<LoggingConfig>> tensorboard_fields();

}  // namespace ds
