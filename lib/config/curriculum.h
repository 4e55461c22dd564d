// DeepSpeed's legacy curriculum learning for the sequence length (the
// `curriculum_learning` section, "sequence-length warmup"): the schedule's
// settings and the scheduler that maps a global step to the number of leading
// tokens of every training sample that the step trains on. The semantics are
// DeepSpeed's CurriculumScheduler as Megatron-DeepSpeed drives it (evaluated
// with step = iteration + 1 before each optimizer step); docs/config.md
// describes the key and the rules.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds {

enum class CurriculumSchedule { FixedLinear, FixedRoot, FixedDiscrete };

struct CurriculumConfig {
  bool enabled = false;
  int64_t min_difficulty = 0, max_difficulty = 0;
  CurriculumSchedule schedule = CurriculumSchedule::FixedLinear;
  // fixed_linear / fixed_root
  int64_t total_curriculum_step = 0, difficulty_step = 1;
  double root_degree = 1;  // fixed_root only (fixed_linear is degree 1)
  // fixed_discrete: difficulty[i] while step <= max_step[i]; the last one after.
  std::vector<int64_t> difficulty, max_step;
  // fixed_linear / fixed_root: raise a value rounded below min_difficulty to
  // the first multiple of difficulty_step at or above it. The sequence-length
  // curriculum does (a length of 0 cannot train); the data-sampling metrics
  // do not, as DeepSpeed's scheduler does not.
  bool floor_at_min = true;
};

const char* curriculum_schedule_name(CurriculumSchedule s);  // "fixed_linear" | ...

// The schedule's value at global step `step` (>= 1), before the hold rule:
// fixed_root: floor((step/total)^(1/degree) * (max-min) + min), rounded down
// to a multiple of difficulty_step, raised to the first multiple of
// difficulty_step at or above min (floor_at_min), capped at max;
// fixed_discrete: the list.
int64_t curriculum_difficulty(const CurriculumConfig& c, int64_t step);

// Every value curriculum_difficulty can return (for start-up checks of the
// layouts that need a divisible sequence length): the multiples of
// difficulty_step in [first, max) plus max, or the discrete list.
std::vector<int64_t> curriculum_values(const CurriculumConfig& c);

// The stateful scheduler: starts at min_difficulty and, while the current
// difficulty is below max_difficulty, moves to the schedule's value at each
// update; once it reaches max it stays there.
class CurriculumScheduler {
 public:
  explicit CurriculumScheduler(const CurriculumConfig& c) : c_(c), current_(c.min_difficulty) {}
  // The difficulty for global step `step` (Megatron-DeepSpeed passes iteration + 1).
  int64_t update(int64_t step);
  int64_t current() const { return current_; }
  // The state after updates for steps 1..iterations (a resumed run continues
  // exactly where the uninterrupted one was).
  void replay(int64_t iterations);

 private:
  CurriculumConfig c_;
  int64_t current_;
};

}  // namespace ds
