// Shared by the fuzz targets: run a parser on one input and treat ds::UserError
// (the answer to malformed input) as success; any other exception aborts, so
// libFuzzer reports it as a crash. Inputs that must be files are written to a
// per-process scratch directory.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "lib/core/error.h"
#include "lib/core/log.h"

namespace ds::fuzz {

template <class Fn>
int run_one(Fn fn) {
  try {
    fn();
  } catch (const ds::UserError&) {
    // the expected answer to a malformed input
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: uncaught %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
  return 0;
}

// A scratch directory for this process, e.g. /dev/shm/ds_fuzz_1234.
// Never destroyed, so the exit handler that removes it can still read it.
inline const std::string& scratch_dir() {
  static const std::string* dir = [] {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    auto* d = new std::string(std::string(base) + "/ds_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Splits an input at the first occurrence of `sep` (the rest is empty if absent).
inline std::pair<std::string_view, std::string_view> split_input(std::string_view in, std::string_view sep) {
  const size_t at = in.find(sep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + sep.size())};
}

// Quiets what the parsers print for valid input (log lines, and the warnings
// the config layer prints on rank 0 only); crash reports still reach stderr.
inline void quiet() {
  static const bool once = [] {
    ds::log_set_rank(1);
    return std::freopen("/dev/null", "w", stdout) != nullptr;
  }();
  (void)once;
}

}  // namespace ds::fuzz
