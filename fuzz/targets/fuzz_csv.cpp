// Fuzz target: the CSV monitor files as dsplot reads them (lib/plot/runs.cpp):
// the input split into train.csv and valid.csv at "\n@@VALID@@\n", read as a
// run directory against iterations, samples and tokens.
#include "fuzz/targets/fuzz_common.h"
#include "lib/plot/runs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet();
  const auto parts = ds::fuzz::split_input(std::string_view(reinterpret_cast<const char*>(data), size),
                                           "\n@@VALID@@\n");
  const std::string dir = ds::fuzz::scratch_dir() + "/run";
  std::filesystem::create_directories(dir);
  const std::string train = ds::fuzz::write_scratch("run/train.csv", parts.first);
  ds::fuzz::write_scratch("run/valid.csv", parts.second);
  ds::fuzz::run_one([&] { (void)ds::plot::read_csv(train); });
  for (auto x : {ds::plot::XAxis::Iteration, ds::plot::XAxis::Samples, ds::plot::XAxis::Tokens})
    ds::fuzz::run_one([&] {
      ds::plot::LoadOptions o;
      o.x = x;
      o.seq_length = 64;
      (void)ds::plot::load_run(dir, o);
    });
  return 0;
}
