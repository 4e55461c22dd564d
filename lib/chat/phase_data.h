// The examples one DeepSpeed-Chat step trains and evaluates on, chosen as
// DeepSpeed-Chat's create_prompt_dataset chooses them: each dataset's train
// and eval examples split by --data_split, the step's part kept; several
// datasets concatenated in --data_path order and shuffled (numpy's legacy
// RandomState(seed) permutation of the total), train and eval each.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/chat/pairs.h"

namespace ds::chat {

struct PhaseExamples {
  std::vector<ChatExample> train, eval;
};

// Where `--data_path local/jsonfile` reads DIR/data/train.json and
// DIR/data/eval.json: DIR the first of `cwd`, its parent and its grandparent
// that holds both (DeepSpeed-Chat reads its application folder's data/, and
// its step scripts run from training/stepN_*/). UserError naming the places
// looked at when none does.
std::string find_local_jsonfile_dir(const std::string& cwd);

// One dataset's examples of step `phase` (1-based, as --data_split's parts).
PhaseExamples phase_examples(const std::vector<ChatExample>& train, const std::vector<ChatExample>& eval,
                             const std::vector<double>& split, int phase, uint32_t seed);

// Several datasets' examples (each already filtered to those the step can
// use): concatenated in order, then permuted by numpy_shuffled_range(seed, n),
// train and eval each. One dataset is returned as it is (DeepSpeed-Chat
// shuffles only a blend).
PhaseExamples blend(const std::vector<PhaseExamples>& parts, uint32_t seed);

// Step 1's --sft_only_data_path: the step's examples with every SFT-only
// dataset's examples (each its "10,0,0" split, usable ones) appended in
// order, then permuted by numpy_shuffled_range(seed, total), train and eval
// each (DeepSpeed-Chat shuffles even when base is one dataset).
PhaseExamples append_sft_only(const PhaseExamples& base, const std::vector<PhaseExamples>& sft_only, uint32_t seed);

}  // namespace ds::chat
