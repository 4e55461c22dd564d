// Fuzz target: --include / --exclude parsing and filtering (launcher/resources.cpp).
// Input: "HOSTFILE\n---\nSPEC"; the spec is tried as --include and as
// --exclude against the hostfile's pool (or a fixed pool when it is invalid).
#include "fuzz/targets/fuzz_common.h"
#include "launcher/resources.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto parts = ds::fuzz::split_input(in, "\n---\n");
  const std::string_view hosts = parts.first, spec_view = parts.second;
  const std::string spec(spec_view);
  ds::launch::ResourcePool pool = {{"localhost", 4}, {"worker-1", 8}, {"w2", 1}};
  ds::fuzz::run_one([&] { pool = ds::launch::parse_hostfile(std::string(hosts), "fuzz-hostfile"); });
  ds::fuzz::run_one([&] { ds::launch::filter_resources(pool, spec, ""); });
  ds::fuzz::run_one([&] { ds::launch::filter_resources(pool, "", spec); });
  ds::fuzz::run_one([&] { ds::launch::max_slot_named(spec, "localhost"); });
  ds::fuzz::run_one([&] { ds::launch::local_pool(4, -1, spec); });
  return 0;
}
