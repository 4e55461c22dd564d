// DeepSpeed's `elasticity` config section and its batch rules: from the
// section alone, the one global batch size that the most GPU counts can
// split (micro batch x gradient accumulation x data-parallel size), the list
// of those valid counts, and for one count the micro batch to use. Shared by
// dstrain (which sets its batch triple from it) and dsrun (which starts an
// elastic job only on a valid number of ranks). Pure; see docs/dsrun.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/json_config.h"

namespace ds {

struct ElasticityConfig {
  bool enabled = false;
  int64_t max_train_batch_size = 2000;
  std::vector<int64_t> micro_batch_sizes = {2, 4, 6};
  int64_t min_gpus = 1, max_gpus = 10000;
  double min_time = 0;  // minutes; a scheduler hint, not used by the rules
  double version = 0.1;  // 0.1 or 0.2
  bool prefer_larger_batch = true;
  bool ignore_non_elastic_batch_info = false;
  int64_t model_parallel_size = 1;  // version 0.2 only
  int64_t num_gpus_per_node = 1;    // version 0.2 only
};

// Reads and validates the section (DeepSpeed's keys and defaults). Errors name
// the key and value. Keys it does not know are left unread (the caller's
// finish() reports them).
ElasticityConfig read_elasticity_section(JsonSection& s);

struct ElasticBatch {
  int64_t train_batch_size = 0;
  std::vector<int64_t> valid_sizes;  // data-parallel sizes that can run, ascending
  int64_t micro_batch_size = 0;      // for the given size; 0 when none was given
};

// DeepSpeed's compute_elastic_config. dp_size 0: the batch and the valid
// sizes only (version 0.1; version 0.2 needs the size). dp_size > 0: also the
// micro batch for that size (the largest listed one dividing batch / size);
// a size that is not valid is a UserError naming it and the valid list.
// The size is always the data-parallel size; version 0.2 counts its GPUs as
// dp_size x model_parallel_size (DeepSpeed mixes the two there).
ElasticBatch compute_elastic_config(const ElasticityConfig& c, int64_t dp_size = 0);

// "1, 2, 3, 4, 6" (for messages).
std::string join_sizes(const std::vector<int64_t>& v);

}  // namespace ds
