// Sequence-length curriculum: DeepSpeed's fixed_linear / fixed_root /
// fixed_discrete schedules, the hold-at-max scheduler, and the start-up checks
// that every length the schedule can produce fits the parallel layout.
#include "lib/config/curriculum.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace ds {

const char* curriculum_schedule_name(CurriculumSchedule s) {
  switch (s) {
    case CurriculumSchedule::FixedLinear: return "fixed_linear";
    case CurriculumSchedule::FixedRoot: return "fixed_root";
    case CurriculumSchedule::FixedDiscrete: return "fixed_discrete";
  }
  return "?";
}

namespace {

// The first multiple of `step` at or above `v` (v, step > 0).
int64_t round_up(int64_t v, int64_t step) { return (v + step - 1) / step * step; }

int64_t root_difficulty(const CurriculumConfig& c, int64_t step, double degree) {
  // Evaluated in double exactly as DeepSpeed's Python floats are.
  const double frac = std::pow(static_cast<double>(step) / static_cast<double>(c.total_curriculum_step), 1.0 / degree);
  int64_t d = static_cast<int64_t>(
      std::floor(frac * static_cast<double>(c.max_difficulty - c.min_difficulty) + static_cast<double>(c.min_difficulty)));
  d -= d % c.difficulty_step;
  // Rounding down may land below the start (min 8, step 16 gives 0): the
  // first multiple of the step at or above min is the floor.
  if (c.floor_at_min) d = std::max(d, round_up(c.min_difficulty, c.difficulty_step));
  return std::min(d, c.max_difficulty);
}

int64_t discrete_difficulty(const CurriculumConfig& c, int64_t step) {
  for (size_t i = 0; i < c.max_step.size(); ++i)
    if (step <= c.max_step[i]) return c.difficulty[i];
  return c.difficulty.back();
}

}  // namespace

int64_t curriculum_difficulty(const CurriculumConfig& c, int64_t step) {
  switch (c.schedule) {
    case CurriculumSchedule::FixedLinear: return root_difficulty(c, step, 1.0);
    case CurriculumSchedule::FixedRoot: return root_difficulty(c, step, c.root_degree);
    case CurriculumSchedule::FixedDiscrete: return discrete_difficulty(c, step);
  }
  return c.max_difficulty;
}

std::vector<int64_t> curriculum_values(const CurriculumConfig& c) {
  std::vector<int64_t> v;
  if (c.schedule == CurriculumSchedule::FixedDiscrete) {
    v = c.difficulty;
  } else {
    const int64_t first = c.floor_at_min ? round_up(c.min_difficulty, c.difficulty_step)
                                         : c.min_difficulty - c.min_difficulty % c.difficulty_step;
    for (int64_t d = first; d < c.max_difficulty; d += c.difficulty_step)
      v.push_back(d);
  }
  v.push_back(c.max_difficulty);  // the cap, and min == max holding from the start
  return v;
}

int64_t CurriculumScheduler::update(int64_t step) {
  if (current_ < c_.max_difficulty) current_ = curriculum_difficulty(c_, step);
  return current_;
}

void CurriculumScheduler::replay(int64_t iterations) {
  current_ = c_.min_difficulty;
  for (int64_t s = 1; s <= iterations && current_ < c_.max_difficulty; ++s) {
    update(s);
    // Past the last boundary a discrete schedule is constant.
    if (c_.schedule == CurriculumSchedule::FixedDiscrete && s > c_.max_step.back()) break;
  }
}

}  // namespace ds
