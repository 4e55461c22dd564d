// What dstrain reports to dsrun's autotuner (launcher/autotune/): the metrics
// of a short experiment, timed between two profile steps, with its peak
// memory; and the memory estimate of a configuration as JSON. Both are asked
// for through environment variables that the autotuner sets (the names start
// with DS_ so remote transports forward them), and do nothing otherwise.
// docs/autotuning.md describes the files.
#pragma once
#include <cstdint>
#include <string>

#include "lib/comm/communicator.h"
#include "lib/config/config.h"

namespace ds {

// What the metrics need beyond the step times.
struct ProfileFacts {
  int64_t global_batch = 0;  // samples per optimizer step
  int64_t seq_length = 0;
  double flops_per_token = 0;  // training FLOPs per token (metrics.h)
};

// DS_AUTOTUNING_METRIC_PATH=FILE, DS_AUTOTUNING_START_PROFILE_STEP=S,
// DS_AUTOTUNING_END_PROFILE_STEP=E: steps S+1..E of this run are timed (the
// first S are warm-up) and the run stops after step E.
class ProfileWindow {
 public:
  // Reads the variables; a malformed one is a UserError naming it.
  static ProfileWindow from_env();
  bool enabled() const { return !path_.empty(); }
  // Called after every training step with its wall time; true once step E ran.
  bool record(double ms);
  // Collective over `world`: the peak memory is the maximum over ranks; rank 0
  // writes FILE (latency in s, throughput in samples/s, FLOPS per rank, memory).
  void write(Communicator& world, Device dev, const ProfileFacts& f) const;

 private:
  std::string path_;
  int64_t start_ = 3, end_ = 5, steps_ = 0;
  double timed_ms_ = 0;
};

// --estimate-memory with DS_AUTOTUNING_ESTIMATE_PATH=FILE set: writes the
// configured (stage, offload) row of the estimate and the model's size as JSON.
void write_estimate_json_if_asked(const TrainConfig& cfg, int world_size);

}  // namespace ds
