// docs/config.md against the code: the rows of the tables of our own sections
// (model, model.moe, data, training, parallel) name exactly the keys the
// section readers accept (recorded through JsonSection::set_key_log while a
// config is read), and every flag of the flag table that sets one of those
// keys is named in that key's row. The same for DeepSpeed's keys: the tables
// under "DeepSpeed keys honoured" name exactly the keys the DeepSpeed readers
// read (every optimizer, scheduler, precision and curriculum branch taken).
#include <catch2/catch.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/config/config_internal.h"
#include "lib/core/json_config.h"
#include "lib/optim/optimizer_config.h"

using namespace ds;
using nlohmann::json;

namespace {

const std::vector<std::string> kSections = {"model", "model.moe", "data", "training", "parallel"};

std::vector<std::string> split_cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cur;
  bool code = false;
  for (size_t i = 1; i < row.size(); ++i) {  // row starts with '|'
    const char c = row[i];
    if (c == '`') code = !code;
    if (c == '\\' && i + 1 < row.size() && row[i + 1] == '|') {  // an escaped '|' inside a cell
      cur += '|';
      ++i;
      continue;
    }
    if (c == '|' && !code) {
      cells.push_back(cur);
      cur.clear();
      continue;
    }
    cur += c;
  }
  return cells;
}

// The backticked names of a cell, in order.
std::vector<std::string> code_spans(const std::string& cell) {
  std::vector<std::string> out;
  size_t p = 0;
  while ((p = cell.find('`', p)) != std::string::npos) {
    const size_t e = cell.find('`', p + 1);
    if (e == std::string::npos) break;
    out.push_back(cell.substr(p + 1, e - p - 1));
    p = e + 1;
  }
  return out;
}

// "section.key" -> its row's flag column, for the tables under the headings "### `model`",
// "#### `model.moe`", ... A first cell may name several keys
// ("`a`, `b`"); "`distillation.x`, `y`" names distillation.x and distillation.y.
std::map<std::string, std::string> documented_keys(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::map<std::string, std::string> rows;
  std::string line, section;
  bool key_table = false;  // inside a table whose first column is "key"
  while (std::getline(f, line)) {
    if (line.rfind("|", 0) != 0) key_table = false;
    if (line.rfind("| key |", 0) == 0) key_table = true;
    if (line.rfind("#", 0) == 0) {
      section.clear();
      for (const std::string& s : kSections)
        if (line.find("`" + s + "`") != std::string::npos && line.find(' ') == line.find_first_not_of('#'))
          section = s;
      continue;
    }
    if (section.empty() || !key_table || line.rfind("| `", 0) != 0) continue;
    const std::vector<std::string> cells = split_cells(line);
    REQUIRE(cells.size() >= 4);
    std::string prefix;
    for (const std::string& name : code_spans(cells[0])) {
      std::string key = name;
      if (const size_t dot = name.rfind('.'); dot != std::string::npos) prefix = name.substr(0, dot + 1);
      else key = prefix + name;
      rows[section + "." + key] = cells[3];
    }
  }
  return rows;
}

// The config the tests read: every optional subsection of ours present.
json full_config() {
  return {{"train_batch_size", 1},
          {"train_micro_batch_size_per_gpu", 1},
          {"model", {{"moe", json::object()}}},
          {"data", json::object()},
          {"training", {{"train_iters", 1}, {"distillation", {{"enabled", false}}}}},
          {"parallel", json::object()}};
}

// Every key the readers of our sections accept (the optional subsections
// present, so that their keys are read too).
std::set<std::string> accepted_keys() {
  std::set<std::string> log;
  JsonSection::set_key_log(&log);
  const json j = full_config();
  try {
    (void)train_config_from_json(j, 1);
  } catch (...) {
    JsonSection::set_key_log(nullptr);
    throw;
  }
  JsonSection::set_key_log(nullptr);
  std::set<std::string> ours;
  for (const std::string& k : log)
    for (const std::string& s : {"model.", "data.", "training.", "parallel."})
      if (k.rfind(s, 0) == 0) ours.insert(k);
  return ours;
}


bool identifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  return true;
}

// The DeepSpeed keys docs/config.md documents: between "## DeepSpeed keys
// honoured" and the next "## " heading, the first cells of "| key |" tables
// (full dotted paths; "`a.b.x`, `y`" names a.b.x and a.b.y), the first cells
// of the scheduler's "| param |" tables (scheduler.params.<name>) and the
// "own keys" cells of the optimizer's "| type |" table (optimizer.params.<name>).
// Each key maps to its row's text.
std::map<std::string, std::string> documented_ds_keys(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::map<std::string, std::string> keys;
  std::string line;
  bool in_ds = false;
  enum class Table { None, Key, Param, Type } table = Table::None;
  while (std::getline(f, line)) {
    if (line.rfind("## ", 0) == 0) in_ds = line.find("DeepSpeed keys honoured") != std::string::npos;
    if (!in_ds) continue;
    if (line.rfind("|", 0) != 0) table = Table::None;
    if (line.rfind("| key |", 0) == 0) table = Table::Key;
    if (line.rfind("| param |", 0) == 0) table = Table::Param;
    if (line.rfind("| type |", 0) == 0) table = Table::Type;
    if (table == Table::None || line.rfind("| `", 0) != 0) continue;
    const std::vector<std::string> cells = split_cells(line);
    if (table == Table::Type) {
      REQUIRE(cells.size() >= 3);
      for (const std::string& name : code_spans(cells[2]))
        if (identifier(name)) keys["optimizer.params." + name] = line;
      continue;
    }
    std::string prefix = table == Table::Param ? "scheduler.params." : "";
    for (const std::string& name : code_spans(cells[0])) {
      if (table == Table::Param) {
        keys[prefix + name] = line;
        continue;
      }
      std::string key = name;
      if (const size_t dot = name.rfind('.'); dot != std::string::npos) prefix = name.substr(0, dot + 1);
      else key = prefix + name;
      keys[key] = line;
    }
  }
  return keys;
}

// Every key the DeepSpeed readers read: the configs below take each branch
// (every optimizer and scheduler type, fp16 and bf16, CPU and NVMe offload, the three
// curriculum schedules); a reader notes a key when it asks for it, present or not.
std::set<std::string> accepted_ds_keys() {
  std::vector<json> configs;
  auto with = [&](json extra) {
    json j = full_config();
    j.merge_patch(extra);
    configs.push_back(j);
  };
  for (const char* type : {"Adam", "AdamW", "SGD", "Adagrad", "Lion", "Lamb"})
    with({{"optimizer", {{"type", type}, {"params", {{"torch_adam", false}, {"fused", true}}}}}});
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"})
    with({{"optimizer", {{"type", type}}}, {"zero_optimization", {{"stage", 0}}}});
  for (const auto& [kind, name] : kLrSchedulerNames)
    if (kind != LrScheduler::Megatron)
      with({{"scheduler", {{"type", name}, {"params", {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 0.1}}}}}});
  with({{"fp16", {{"enabled", true}}}});
  with({{"bf16", {{"enabled", true}}}});
  with({{"bfloat16", {{"enabled", true}}}});
  with({{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  with({{"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}},
                               {"offload_param", {{"device", "nvme"}, {"nvme_path", "/x"}}}}}});
  with({{"sequence_parallel_size", 1}});
  json curriculum = {{"enabled", true},         {"curriculum_type", "seqlen"}, {"min_difficulty", 8},
                     {"max_difficulty", 64},    {"schedule_type", "fixed_linear"},
                     {"schedule_config", {{"total_curriculum_step", 10}, {"difficulty_step", 8}, {"root_degree", 2}}}};
  with({{"curriculum_learning", curriculum}});
  curriculum["schedule_type"] = "fixed_root";
  with({{"curriculum_learning", curriculum}});
  curriculum["schedule_type"] = "fixed_discrete";
  curriculum["schedule_config"] = {{"difficulty", {8, 64}}, {"max_step", {5}}};
  with({{"curriculum_learning", curriculum}});

  std::set<std::string> log;
  JsonSection::set_key_log(&log);
  for (const json& j : configs) {
    TrainConfig cfg;
    Warnings w;
    try {
      read_config_json(j, cfg, w);
    } catch (...) {
      JsonSection::set_key_log(nullptr);
      throw;
    }
  }
  JsonSection::set_key_log(nullptr);
  std::set<std::string> ds;
  for (const std::string& k : log) {
    bool ours = false;
    for (const std::string& s : {"model", "data", "training", "parallel"})
      ours = ours || k == s || k.rfind(s + ".", 0) == 0;
    if (!ours) ds.insert(k);
  }
  return ds;
}

// `keys` (what the readers read) against `docs` (documented key -> the row
// text its flags must appear in), both ways: a key is documented by its own
// row or by rows of keys under it (a subsection, or a section read whole);
// and every flag of the flag table that sets one of `keys` is named in that
// key's row. Returns how many table flags set one of `keys`.
int check_documented(const std::map<std::string, std::string>& docs, const std::set<std::string>& keys,
                     const std::string& what) {
  auto documented = [&](const std::string& k) {
    if (docs.count(k)) return true;
    const auto it = docs.lower_bound(k + ".");
    return it != docs.end() && it->first.rfind(k + ".", 0) == 0;
  };
  std::string undocumented, unknown, missing;
  for (const std::string& k : keys)
    if (!documented(k)) undocumented += " " + k;
  for (const auto& [k, row] : docs)
    if (!keys.count(k)) unknown += " " + k;
  int flags = 0;
  for (const auto& [flag, pointer] : table_flags()) {
    std::string key = pointer.substr(1);
    for (char& c : key)
      if (c == '/') c = '.';
    if (!keys.count(key)) continue;  // a key of the other test's kind
    ++flags;
    const auto it = docs.find(key);
    if (it == docs.end() || it->second.find(flag) == std::string::npos) missing += " " + flag + " (" + key + ")";
  }
  INFO(what << " keys the readers read without a row in docs/config.md:" << undocumented);
  INFO("rows in docs/config.md for " << what << " keys no reader reads:" << unknown);
  INFO("flags not named in their " << what << " key's row:" << missing);
  CHECK(undocumented.empty());
  CHECK(unknown.empty());
  CHECK(missing.empty());
  return flags;
}

}  // namespace

TEST_CASE("docs/config.md names exactly the keys of our sections, each with its flags") {
  const char* src = std::getenv("DS_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const std::map<std::string, std::string> docs = documented_keys(std::string(src) + "/docs/config.md");
  const std::set<std::string> keys = accepted_keys();
  REQUIRE(docs.size() > 50);
  REQUIRE(keys.size() > 50);

  REQUIRE(check_documented(docs, keys, "our sections'") >= 20);

  // The resolved config (the writer, saved in every checkpoint) writes only
  // keys the readers accept.
  std::string written;
  std::function<void(const json&, const std::string&)> walk = [&](const json& o, const std::string& path) {
    for (auto it = o.begin(); it != o.end(); ++it) {
      const std::string k = path + "." + it.key();
      if (!keys.count(k)) written += " " + k;
      if (it->is_object()) walk(*it, k);
    }
  };
  const json resolved = train_config_from_json(full_config(), 1).resolved;
  for (const std::string s : {"model", "data", "training", "parallel"}) {
    REQUIRE(resolved.contains(s));
    walk(resolved.at(s), s);
  }
  INFO("keys the resolved config writes that no reader accepts:" << written);
  CHECK(written.empty());
}

TEST_CASE("docs/config.md names exactly the DeepSpeed keys the readers read") {
  const char* src = std::getenv("DS_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const std::map<std::string, std::string> docs = documented_ds_keys(std::string(src) + "/docs/config.md");
  const std::set<std::string> keys = accepted_ds_keys();
  REQUIRE(docs.size() > 40);
  REQUIRE(keys.size() > 40);
  REQUIRE(keys.count("optimizer.params.max_coeff"));  // the optimizer branches were taken
  REQUIRE(keys.count("scheduler.params.cycle_momentum"));
  REQUIRE(keys.count("curriculum_learning.schedule_config.max_step"));

  REQUIRE(check_documented(docs, keys, "DeepSpeed") >= 10);
}

