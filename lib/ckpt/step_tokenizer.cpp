// Tokenizer copies in a checkpoint: read from the run's files when saving,
// written into the step directory, read back and verified by checksum.
#include "lib/ckpt/step_tokenizer.h"

#include <fstream>
#include <iterator>
#include <system_error>

#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/core/error.h"
#include "lib/core/log.h"

namespace fs = std::filesystem;

namespace ds {
namespace {

constexpr const char* kNames[] = {"vocab.json", "merges.txt", "tokenizer.model", "tokenizer.json"};

// A run's tokenizer file, or an error saying why it cannot be copied.
bool read_bounded(const std::string& path, std::string& out, std::string& why) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::is_regular_file(status)) {
    why = ec ? ec.message() : "not a regular file";
    return false;
  }
  const auto size = fs::file_size(path, ec);
  if (ec || size > kMaxTokenizerFileBytes) {
    why = ec ? ec.message() : fmt::format("{} bytes, more than the {} MiB copied", size, kMaxTokenizerFileBytes >> 20);
    return false;
  }
  std::ifstream f(path, std::ios::binary);
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) {
    why = "cannot be read";
    return false;
  }
  if (out.size() > kMaxTokenizerFileBytes) {
    why = "grew while being read";
    return false;
  }
  return true;
}

}  // namespace

bool is_step_tokenizer_name(const std::string& name) {
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

StepTokenizer read_run_tokenizer(const std::string& type, const std::string& vocab_file,
                                 const std::string& merge_file, const std::string& tokenizer_model) {
  StepTokenizer t;
  t.type = type.empty() ? "GPT2BPETokenizer" : type;
  std::vector<std::pair<StepTokenizer::File, std::string>> want;  // (file, source path)
  if (t.type == "GPT2BPETokenizer") {
    if (vocab_file.empty() || merge_file.empty()) return {};
    want.push_back({{"vocab_file", "vocab.json", ""}, vocab_file});
    want.push_back({{"merge_file", "merges.txt", ""}, merge_file});
  } else {
    if (tokenizer_model.empty()) return {};
    const bool hf = t.type == "HFTokenizer";
    std::error_code ec;
    const std::string path = hf && fs::is_directory(tokenizer_model, ec)
                                 ? (fs::path(tokenizer_model) / "tokenizer.json").string()
                                 : tokenizer_model;
    want.push_back({{"tokenizer_model", hf ? "tokenizer.json" : "tokenizer.model", ""}, path});
  }
  for (auto& [file, source] : want) {
    std::string why;
    if (!read_bounded(source, file.bytes, why)) {
      DS_WARN("the tokenizer file '{}' ({}) is not copied into the checkpoints: {}; dsgen will need the "
              "tokenizer flags for them", source, file.field, why);
      return {};
    }
    t.files.push_back(std::move(file));
  }
  return t;
}

nlohmann::json write_step_tokenizer(const StepTokenizer& t, const fs::path& dir) {
  if (t.files.empty()) return nullptr;
  nlohmann::json j = {{"tokenizer_type", t.type}};
  for (const StepTokenizer::File& f : t.files) {
    DS_CHECK(is_step_tokenizer_name(f.name), "write_step_tokenizer: bad name '{}'", f.name);
    write_file_atomic((dir / f.name).string(), f.bytes);
    j[f.field] = f.name;
  }
  return j;
}

StepTokenizer read_step_tokenizer(const fs::path& step, const StepState& st) {
  StepTokenizer t;
  if (st.tokenizer_files.empty()) return t;
  t.type = st.tokenizer_type;
  for (const auto& [field, name] : st.tokenizer_files) {
    const std::string file = (step / name).string();
    std::string bytes = read_small_file(file, kMaxTokenizerFileBytes, "checkpoint file '" + file + "'");
    const uint32_t want = st.checksums.at(name);  // parse_step_state: every copy has a checksum
    const uint32_t got = crc32c(bytes.data(), bytes.size());
    DS_USER_CHECK(got == want, "checkpoint file '{}' is corrupt: its checksum is {}, state.json recorded {}", file,
                  crc32c_text(got), crc32c_text(want));
    t.files.push_back({field, name, std::move(bytes)});
  }
  return t;
}

}  // namespace ds
