// A temporary directory for the config tests, removed with everything in it.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace ds::test {

struct TempDir {
  std::string path;
  explicit TempDir(const char* prefix = "ds_config_test") {
    std::string t = std::string("/tmp/") + prefix + "_XXXXXX";
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace ds::test
