// Random-LTD, DeepSpeed Data Efficiency's random layerwise token dropping
// (docs/data_efficiency.md): in training, each of the chosen layers runs on
// `reserved` positions of every sample, drawn uniformly without replacement
// and kept in sequence order; the other positions pass that layer unchanged.
// The causal mask applies among the kept positions (upstream slices the
// first reserved x reserved block of the mask). The reserved length grows
// with the steps by DeepSpeed's fixed_linear schedule.
#pragma once
#include <cstdint>

namespace ds {

// DeepSpeed's random_ltd_schedule (data_routing/scheduler.py) with
// schedule_type fixed_linear: the reserved length at optimizer step `step`
// (0-based, the steps completed before the forward, skipped ones included).
//   v = floor(step / require_steps * (max - min) + min), rounded down to a
//   multiple of seq_per_step, at most max;
// while min >= max the length stays min (the scheduler never updates it).
struct RandomLtdSchedule {
  int64_t min_value = 0, max_value = 0, require_steps = 1, seq_per_step = 1;
};
int64_t random_ltd_reserved(const RandomLtdSchedule& s, int64_t step);

// The kept positions of one sample in one layer: R ascending positions of
// [0, T), every R-subset equally likely, a function of (seed, iteration,
// global sample index, layer) only, so that every layout (data, tensor
// parallel, micro-batch split) draws the same ones for the same sample.
// Upstream draws with torch.multinomial from the device generator (the
// same draws on every data-parallel rank); the distribution is the same.
void random_ltd_positions(uint64_t seed, int64_t iteration, int64_t sample, int layer, int64_t T, int64_t R,
                          int32_t* out);

}  // namespace ds
