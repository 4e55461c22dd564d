// DeepSpeed-Chat's unsupervised data for step 3 (unsup_data.h).
#include "lib/chat/unsup_data.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_config.h"

namespace ds::chat {
namespace fs = std::filesystem;
namespace {

constexpr size_t kMaxDataFile = size_t(4) << 30;

// datasets' split keywords and the characters that may surround them in a
// file name (NON_WORDS_CHARS).
bool separator(char c) { return c == '-' || c == '.' || c == '_' || c == ' ' || (c >= '0' && c <= '9'); }

// The file name holds `keyword` at its start or after a separator, with a
// separator after it ("{keyword}[sep]*", "*[sep]{keyword}[sep]*").
bool names(const std::string& name, const std::string& keyword) {
  for (size_t at = name.find(keyword); at != std::string::npos; at = name.find(keyword, at + 1)) {
    const size_t end = at + keyword.size();
    if ((at == 0 || separator(name[at - 1])) && end < name.size() && separator(name[end])) return true;
  }
  return false;
}

bool names_any(const std::string& name, std::initializer_list<const char*> keywords) {
  return std::any_of(keywords.begin(), keywords.end(), [&](const char* k) { return names(name, k); });
}

// The text builder: the file in text mode (universal newlines), one example
// per line without its line break, no example after a final line break.
void text_examples(const std::string& text, std::vector<std::string>& out) {
  std::string line;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\r') {
      out.push_back(line);
      line.clear();
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      line += c;
    }
  }
  if (!line.empty()) out.push_back(line);
}

// The json builder: JSON Lines, or one array of objects.
std::vector<nlohmann::json> json_records(const std::string& text, const std::string& path) {
  std::vector<nlohmann::json> out;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json all = parse_json_text(text, "'" + path + "'");
    for (auto& r : all) out.push_back(std::move(r));
  } else {
    size_t at = 0;
    for (int line = 1; at < text.size(); ++line) {
      const size_t end = std::min(text.find('\n', at), text.size());
      const std::string_view l(text.data() + at, end - at);
      at = end + 1;
      if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      out.push_back(parse_json_text(l, "'" + path + "', line " + std::to_string(line)));
    }
  }
  for (size_t i = 0; i < out.size(); ++i)
    DS_USER_CHECK(out[i].is_object(), "'{}': record {} is {}, expected a JSON object", path, i, out[i].type_name());
  return out;
}

}  // namespace

std::vector<std::string> read_unsupervised_texts(const std::string& dir, const std::string& config,
                                                 const std::string& flag) {
  std::error_code ec;
  DS_USER_CHECK(fs::is_directory(dir, ec), "{} '{}' is not a local folder: dschat reads a local dataset folder (.txt, "
                ".json or .jsonl files, as datasets.load_dataset(FOLDER, \"default\") does) and downloads no Hugging "
                "Face Hub dataset", flag, dir);
  DS_USER_CHECK(config == "default", "--unsupervised_dataset_config_name '{}': a local dataset folder has one "
                "configuration, 'default' (datasets: \"BuilderConfig '{}' not found. Available: ['default']\")", config,
                config);
  std::vector<std::string> files;  // names at the folder's top
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") || name.starts_with("__") || name == "README.md") continue;
    DS_USER_CHECK(!e.is_directory(ec), "{} '{}': the subfolder '{}' is not read; put the data files at the top of "
                  "the folder", flag, dir, name);
    files.push_back(name);
  }
  DS_USER_CHECK(!ec, "{} '{}': cannot list the folder: {}", flag, dir, ec.message());
  std::sort(files.begin(), files.end());
  const bool split_named = std::any_of(files.begin(), files.end(), [](const std::string& f) {
    return names_any(f, {"train", "training", "validation", "valid", "dev", "val", "test", "testing", "eval",
                         "evaluation"});
  });
  if (split_named) std::erase_if(files, [](const std::string& f) { return !names_any(f, {"train", "training"}); });
  DS_USER_CHECK(!files.empty(), "{} '{}' holds no {}data file", flag, dir, split_named ? "train split " : "");
  bool text = false, json = false;
  for (const std::string& f : files) {
    const std::string ext = fs::path(f).extension().string();
    text |= ext == ".txt";
    json |= ext == ".json" || ext == ".jsonl";
    DS_USER_CHECK(ext == ".txt" || ext == ".json" || ext == ".jsonl", "{} '{}': '{}' is not a .txt, .json or .jsonl "
                  "file (the formats dschat reads)", flag, dir, f);
  }
  DS_USER_CHECK(!(text && json), "{} '{}' mixes .txt and .json files in its train split; use one format", flag, dir);
  std::vector<std::string> out;
  if (text) {
    for (const std::string& f : files) {
      const std::string path = (fs::path(dir) / f).string();
      text_examples(read_small_file(path, kMaxDataFile, "'" + path + "'"), out);
    }
    return out;
  }
  std::vector<nlohmann::json> records;
  std::vector<std::string> where;
  for (const std::string& f : files) {
    const std::string path = (fs::path(dir) / f).string();
    for (nlohmann::json& r : json_records(read_small_file(path, kMaxDataFile, "'" + path + "'"), path)) {
      records.push_back(std::move(r));
      where.push_back(path);
    }
  }
  DS_USER_CHECK(!records.empty(), "{} '{}': its train split holds no record", flag, dir);
  // datasets takes the "text" column, else the first; dschat reads "text" (a JSON object's key order is not kept).
  const std::string column = "text";
  DS_USER_CHECK(std::any_of(records.begin(), records.end(), [](const nlohmann::json& r) { return r.contains("text"); }),
                "{} '{}': its records have no \"text\" field (DeepSpeed-Chat would take the first column; dschat "
                "reads \"text\": name the field so)", flag, dir);
  for (size_t i = 0; i < records.size(); ++i) {
    const auto it = records[i].find(column);
    DS_USER_CHECK(it != records[i].end() && it->is_string(), "'{}': a record's \"{}\" is {}, expected a string (the "
                  "tokenizer's input)", where[i], column, it == records[i].end() ? "missing" : it->type_name());
    out.push_back(it->get<std::string>());
  }
  return out;
}

std::vector<std::vector<int32_t>> group_texts(const std::vector<std::vector<int32_t>>& ids, int64_t block,
                                              int64_t map_batch) {
  DS_CHECK(block >= 1 && map_batch >= 1, "group_texts: block {} and batch {}", block, map_batch);
  std::vector<std::vector<int32_t>> out;
  for (size_t b0 = 0; b0 < ids.size(); b0 += static_cast<size_t>(map_batch)) {
    std::vector<int32_t> all;
    for (size_t i = b0; i < std::min(ids.size(), b0 + static_cast<size_t>(map_batch)); ++i)
      all.insert(all.end(), ids[i].begin(), ids[i].end());
    int64_t total = static_cast<int64_t>(all.size());
    if (total >= block) total = total / block * block;
    for (int64_t at = 0; at < total; at += block)
      out.emplace_back(all.begin() + at, all.begin() + std::min(total, at + block));
  }
  return out;
}

}  // namespace ds::chat
