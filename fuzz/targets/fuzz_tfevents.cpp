// Fuzz target: TensorBoard event files as dsplot reads them
// (lib/plot/events.cpp: length-prefixed records with masked CRC32C, Event and
// Summary protobufs): the input read as one events.out.tfevents.* file, and as
// a run.
#include "fuzz/targets/fuzz_common.h"
#include "lib/plot/runs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet();
  const std::string path = ds::fuzz::write_scratch(
      "events.out.tfevents.1.host", std::string_view(reinterpret_cast<const char*>(data), size));
  ds::fuzz::run_one([&] { (void)ds::plot::read_event_file(path); });
  return ds::fuzz::run_one([&] { (void)ds::plot::load_run(path, ds::plot::LoadOptions{}); });
}
