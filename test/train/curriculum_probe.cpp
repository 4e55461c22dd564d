// Prints the data-sampling curriculum's chunks for a spec file (driven by
// curriculum_sampler_ref.py, which checks them against its own transcription
// of DeepSpeed's sampler):
//   curriculum_probe SPEC.json
// SPEC: {"data_efficiency": {...DeepSpeed's section...}, "one_epoch": N,
//        "global_batch": G, "chunk": C, "drop_last": bool, "chunks": K,
//        "start": S (first chunk asked; a replay when > 0),
//        "index": {"metric": {"rows": [[ids...]...], "metric": [v...]}}}
// Output: one line per chunk: "chunk step d1 d2 ... | s1 s2 ...", or the error line
// and exit 1.
#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "lib/config/config_internal.h"
#include "lib/core/error.h"
#include "lib/train/curriculum_sampler.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: curriculum_probe SPEC.json\n";
    return 2;
  }
  try {
    std::ifstream f(argv[1]);
    const nlohmann::json spec = nlohmann::json::parse(f);
    ds::Warnings w;
    ds::DataSamplingConfig cfg;
    ds::DsSection d(spec.at("data_efficiency"), "data_efficiency", w);
    ds::DsSection sampling = d.section("data_sampling");
    ds::read_data_sampling(d, sampling, cfg, true);
    cfg.flag = true;
    std::vector<std::unique_ptr<ds::MetricIndex>> index;
    for (const ds::CurriculumMetricConfig& m : cfg.metrics) {
      if (m.single_cluster) {
        index.push_back(nullptr);
        continue;
      }
      const nlohmann::json& ix = spec.at("index").at(m.name);
      index.push_back(std::make_unique<ds::MemoryMetricIndex>(
          ix.at("rows").get<std::vector<std::vector<int64_t>>>(),
          ix.value("metric", std::vector<int64_t>{})));
    }
    ds::CurriculumSampler s(cfg,
                            {.one_epoch_samples = spec.at("one_epoch").get<int64_t>(),
                             .global_batch = spec.at("global_batch").get<int64_t>(),
                             .chunk = spec.at("chunk").get<int64_t>(),
                             .drop_last = spec.value("drop_last", true)},
                            std::move(index));
    const int64_t start = spec.value("start", int64_t{0}), n = spec.at("chunks").get<int64_t>();
    for (int64_t c = start; c < n; ++c) {
      const ds::CurriculumSampler::Chunk k = s.chunk(c);
      fmt::print("chunk {} {} | {}\n", k.curriculum_step, fmt::join(k.difficulties, " "), fmt::join(k.samples, " "));
    }
    return 0;
  } catch (const ds::UserError& e) {
    fmt::print("error: {}\n", e.what());
    return 1;
  }
}
