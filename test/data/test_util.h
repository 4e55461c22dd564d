// Helpers shared by tests: scratch directories, file access, error messages,
// a byte-level vocabulary of a chosen size.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "lib/core/error.h"
#include "lib/data/bpe.h"

namespace ds::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ds_data_test_XXXXXX").string();
    path_ = mkdtemp(tmpl.data()) ? tmpl : std::string();
    if (path_.empty()) throw std::runtime_error("mkdtemp failed");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// $DS_SOURCE_DIR/../shared/data, or "" when absent.
inline std::string shared_data_dir() {
  const char* src = std::getenv("DS_SOURCE_DIR");
  std::string dir = std::string(src ? src : ".") + "/../shared/data";
  return std::filesystem::is_directory(dir) ? dir : std::string();
}

// The message of the UserError fn() throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// GPT-2 style vocab.json / merges.txt of vocab_size tokens (>= 257): the 256
// byte tokens in GPT-2's order, "tok0", "tok1", ... and <|endoftext|> last; no merges.
inline void write_byte_vocab(const std::string& vocab_json, const std::string& merges_txt, int vocab_size) {
  nlohmann::json v = nlohmann::json::object();
  for (int i = 0; i < 256; ++i)
    v[data::bytes_to_token_name(std::string(1, static_cast<char>(data::gpt2_byte_order()[i])))] = i;
  for (int i = 256; i + 1 < vocab_size; ++i) v["tok" + std::to_string(i - 256)] = i;
  v["<|endoftext|>"] = vocab_size - 1;
  spit(vocab_json, v.dump());
  spit(merges_txt, "#version: 0.2\n");
}

}  // namespace ds::test
