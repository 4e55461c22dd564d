// A step's examples from its datasets (phase_data.h).
#include "lib/chat/phase_data.h"

#include <filesystem>

#include "lib/chat/data_split.h"
#include "lib/core/error.h"

namespace ds::chat {

std::string find_local_jsonfile_dir(const std::string& cwd) {
  namespace fs = std::filesystem;
  std::string looked;
  fs::path dir = fs::absolute(cwd).lexically_normal();
  for (int up = 0; up < 3; ++up) {
    std::error_code ec;
    if (fs::is_regular_file(dir / "data" / "train.json", ec) && fs::is_regular_file(dir / "data" / "eval.json", ec))
      return dir.string();
    looked += (looked.empty() ? "" : ", ") + (dir / "data").string();
    if (!dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  DS_USER_ERROR("--data_path local/jsonfile: no data/train.json and data/eval.json in {} (DeepSpeed-Chat reads them "
                "from its application folder; run from it or a training/stepN_* folder below it)", looked);
}

PhaseExamples phase_examples(const std::vector<ChatExample>& train, const std::vector<ChatExample>& eval,
                             const std::vector<double>& split, int phase, uint32_t seed) {
  PhaseExamples out;
  for (int64_t i : phase_indices(split, phase - 1, seed, static_cast<int64_t>(train.size())))
    out.train.push_back(train[static_cast<size_t>(i)]);
  for (int64_t i : phase_indices(split, phase - 1, seed, static_cast<int64_t>(eval.size())))
    out.eval.push_back(eval[static_cast<size_t>(i)]);
  return out;
}

PhaseExamples blend(const std::vector<PhaseExamples>& parts, uint32_t seed) {
  if (parts.size() == 1) return parts[0];
  PhaseExamples all, out;
  for (const PhaseExamples& p : parts) {
    all.train.insert(all.train.end(), p.train.begin(), p.train.end());
    all.eval.insert(all.eval.end(), p.eval.begin(), p.eval.end());
  }
  for (int64_t i : numpy_shuffled_range(seed, static_cast<int64_t>(all.train.size())))
    out.train.push_back(all.train[static_cast<size_t>(i)]);
  for (int64_t i : numpy_shuffled_range(seed, static_cast<int64_t>(all.eval.size())))
    out.eval.push_back(all.eval[static_cast<size_t>(i)]);
  return out;
}

PhaseExamples append_sft_only(const PhaseExamples& base, const std::vector<PhaseExamples>& sft_only, uint32_t seed) {
  auto shuffled = [seed](std::vector<ChatExample> all, const std::vector<PhaseExamples>& extra, bool train) {
    for (const PhaseExamples& p : extra) {
      const std::vector<ChatExample>& v = train ? p.train : p.eval;
      all.insert(all.end(), v.begin(), v.end());
    }
    std::vector<ChatExample> out;
    out.reserve(all.size());
    for (int64_t i : numpy_shuffled_range(seed, static_cast<int64_t>(all.size())))
      out.push_back(all[static_cast<size_t>(i)]);
    return out;
  };
  return {shuffled(base.train, sft_only, true), shuffled(base.eval, sft_only, false)};
}

}  // namespace ds::chat
