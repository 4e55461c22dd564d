// Offline checkpoint conversion (dsconvert): rewrites a saved step for
// another tensor / pipeline / data-parallel layout and ZeRO stage. It reads
// through reshape.h and writes through checkpoint.h, so the loader never
// depends on it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "lib/ckpt/reshape.h"
#include "lib/model/model_config.h"
#include "lib/parallel/shard_coords.h"

namespace ds {

// Target of an offline conversion.
struct ReshapeTarget {
  ModelConfig model;       // with the target padded vocabulary
  ShardCoords sizes;       // tp, pp, vp (virtual stages per rank); ranks 0
  int dp = 1;
  int zero_stage = 1;      // 0: one optimizer shard per (pp, tp) rank (every dp rank holds all)
  nlohmann::json config;   // the resolved config to store in state.json
};
// Writes the step of `s` as a checkpoint for `t` under out_dir (its own
// temporary step directory renamed into place, then `latest`), carrying the
// tokenizer files the step holds (verified by checksum first).
void write_reshaped(const SavedStep& s, const ReshapeTarget& t, const std::string& out_dir);

}  // namespace ds
