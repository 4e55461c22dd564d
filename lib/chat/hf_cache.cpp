// Hub names through the local Hugging Face cache (hf_cache.h).
#include "lib/chat/hf_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "lib/core/error.h"

namespace fs = std::filesystem;

namespace ds::chat {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

fs::path hub_cache() {
  if (!env("HF_HUB_CACHE").empty()) return env("HF_HUB_CACHE");
  if (!env("HF_HOME").empty()) return fs::path(env("HF_HOME")) / "hub";
  if (!env("XDG_CACHE_HOME").empty()) return fs::path(env("XDG_CACHE_HOME")) / "huggingface" / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

}  // namespace

std::string resolve_model_dir(const std::string& name_or_path, const std::string& flag) {
  std::error_code ec;
  DS_USER_CHECK(!name_or_path.empty(), "{} is empty", flag);
  if (fs::is_directory(name_or_path, ec)) return name_or_path;
  DS_USER_CHECK(!fs::exists(name_or_path, ec), "{} '{}' is a file; give the model's directory", flag, name_or_path);
  std::string repo = "models--";
  for (char c : name_or_path) repo += c == '/' ? std::string("--") : std::string(1, c);
  const fs::path dir = hub_cache() / repo;
  const fs::path snaps = dir / "snapshots";
  auto missing = [&](const std::string& why) {
    return UserError(fmt::format("{} '{}' is not a directory, and the Hugging Face cache has no copy of it ({}: {}); "
                                 "dschat never downloads: fetch it with the Hugging Face tools, or give its directory",
                                 flag, name_or_path, snaps.string(), why));
  };
  if (!fs::is_directory(snaps, ec)) throw missing("not found");
  std::ifstream ref(dir / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev) && !rev.empty() && fs::is_directory(snaps / rev, ec)) return (snaps / rev).string();
  std::string only;
  int n = 0;
  for (const auto& e : fs::directory_iterator(snaps, ec))
    if (e.is_directory()) {
      only = e.path().string();
      ++n;
    }
  if (n == 1) return only;
  throw missing(n == 0 ? "no snapshot" : "several snapshots and no refs/main naming one");
}

}  // namespace ds::chat
