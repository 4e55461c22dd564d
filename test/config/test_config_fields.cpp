// The config field tables (lib/config/config_fields.h): every plain key of a
// section is declared once and both read and written from that line. Here:
// each table's keys appear in the resolved config at their section, and a
// struct whose every table member is changed survives a write and a read
// (floats as their shortest decimal).
#include <catch2/catch.hpp>

#include "lib/config/config.h"
#include "lib/config/config_fields.h"
#include "lib/core/json_config.h"

using namespace ds;
using nlohmann::json;

namespace {

// Every member of the table moved off its value (numbers up, flags flipped, strings extended).
template <class Root>
void change_all(Root& r, std::span<const ConfigField<Root>> table) {
  for (const ConfigField<Root>& f : table)
    std::visit(
        [&](auto at) {
          auto& m = at(r);
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, bool>)
            m = !m;
          else if constexpr (std::is_same_v<T, std::string>)
            m += "_x";
          else if constexpr (std::is_floating_point_v<T>)
            m = m * 3 + static_cast<T>(0.1);
          else
            m = m * 2 + 3;
        },
        f.at);
}

template <class Root>
void round_trip(std::span<const ConfigField<Root>> table) {
  Root changed;
  change_all(changed, table);
  json written = json::object();
  write_fields(written, changed, table);
  CHECK(written.size() == table.size());  // one key per field, no key twice
  Root back;
  JsonSection s(written, "t");
  read_fields(s, back, table);
  json again = json::object();
  write_fields(again, back, table);
  CHECK(again == written);
  json defaults = json::object();
  write_fields(defaults, Root{}, table);
  for (const ConfigField<Root>& f : table) {
    INFO(f.key);
    CHECK(written.at(f.key) != defaults.at(f.key));  // each field reaches its own member
  }
}

// The keys of `table` are all in section `at` of the resolved config.
template <class Root>
void in_resolved(const json& resolved, const std::string& at, std::span<const ConfigField<Root>> table) {
  const json& sec = resolved.at(json::json_pointer(at));
  for (const ConfigField<Root>& f : table) {
    INFO(at << " " << f.key);
    CHECK(sec.contains(f.key));
  }
}

}  // namespace

TEST_CASE("config field tables: each field reaches its member and survives a write and a read") {
  round_trip(model_fields());
  round_trip(data_fields());
  round_trip(training_fields());
  round_trip(parallel_fields());
  round_trip(fp16_fields());
  round_trip(zero_fields());
  round_trip(nvme_fields());
  round_trip(aio_fields());
  round_trip(csv_monitor_fields());
  round_trip(tensorboard_fields());
}

TEST_CASE("config field tables: every table key is written into the resolved config") {
  const json j = {{"train_batch_size", 8},
                  {"train_micro_batch_size_per_gpu", 8},
                  {"zero_optimization",
                   {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/tmp"}}}}},
                  {"model", {{"num_layers", 2}, {"hidden_size", 64}, {"num_heads", 4}, {"seq_length", 64},
                             {"vocab_size", 100}}},
                  {"training", {{"train_iters", 10}}}};
  const TrainConfig c = train_config_from_json(j, 1);
  in_resolved(c.resolved, "/model", model_fields());
  in_resolved(c.resolved, "/data", data_fields());
  in_resolved(c.resolved, "/training", training_fields());
  in_resolved(c.resolved, "/parallel", parallel_fields());
  in_resolved(c.resolved, "/fp16", fp16_fields());
  in_resolved(c.resolved, "/zero_optimization", zero_fields());
  in_resolved(c.resolved, "/zero_optimization/offload_optimizer", nvme_fields());
  in_resolved(c.resolved, "/aio", aio_fields());
  in_resolved(c.resolved, "/csv_monitor", csv_monitor_fields());
  in_resolved(c.resolved, "/tensorboard", tensorboard_fields());
  // The resolved config reads back to itself.
  CHECK(train_config_from_json(c.resolved, 1).resolved == c.resolved);
}
