// docs/config.md against the code: the rows of the tables of our own sections
// (model, model.moe, data, training, parallel) name exactly the keys the
// section readers accept (recorded through JsonSection::set_key_log while a
// config is read), and every flag of the flag table that sets one of those
// keys is named in that key's row.
#include <catch2/catch.hpp>
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

struct DocRow {
  std::string flags;  // the flag column's text
};

// "section.key" -> its row, for the tables under the headings "### `model`",
// "#### `model.moe`", ... A first cell may name several keys
// ("`a`, `b`"); "`distillation.x`, `y`" names distillation.x and distillation.y.
std::map<std::string, DocRow> documented_keys(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::map<std::string, DocRow> rows;
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
      rows[section + "." + key] = DocRow{cells[3]};
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

}  // namespace

TEST_CASE("docs/config.md names exactly the keys of our sections, each with its flags") {
  const char* src = std::getenv("DS_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const std::map<std::string, DocRow> docs = documented_keys(std::string(src) + "/docs/config.md");
  const std::set<std::string> keys = accepted_keys();
  REQUIRE(docs.size() > 50);
  REQUIRE(keys.size() > 50);

  // A subsection (model.moe, training.distillation) is documented by its own rows.
  auto documented = [&](const std::string& k) {
    if (docs.count(k)) return true;
    for (const auto& [d, row] : docs)
      if (d.rfind(k + ".", 0) == 0) return true;
    return false;
  };
  std::string undocumented, unknown;
  for (const std::string& k : keys)
    if (!documented(k)) undocumented += " " + k;
  for (const auto& [k, row] : docs)
    if (!keys.count(k)) unknown += " " + k;
  INFO("keys the readers accept without a row in docs/config.md:" << undocumented);
  INFO("rows in docs/config.md for keys no reader accepts:" << unknown);
  CHECK(undocumented.empty());
  CHECK(unknown.empty());

  // Each flag of the table that sets a key of ours appears in that key's row.
  std::string missing;
  for (const auto& [flag, pointer] : table_flags()) {
    std::string key = pointer.substr(1);
    for (char& c : key)
      if (c == '/') c = '.';
    bool ours = false;  // else a DeepSpeed key, documented in its own tables
    for (const std::string& s : {"model.", "data.", "training.", "parallel."}) ours = ours || key.rfind(s, 0) == 0;
    if (!ours) continue;
    const auto it = docs.find(key);
    if (it == docs.end() || it->second.flags.find(flag) == std::string::npos)
      missing += " " + flag + " (" + key + ")";
  }
  INFO("flags not named in their key's row:" << missing);
  CHECK(missing.empty());

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
