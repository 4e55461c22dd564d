// Knowledge distillation's teacher (Megatron-DeepSpeed's --kd / --mos with
// --load-teacher; docs/distillation.md): a whole GPT on every rank, loaded
// from a dstrain checkpoint of any layout, forward-only.
#pragma once
#include <memory>

#include "lib/config/config.h"
#include "lib/model/gpt.h"

namespace ds {

// Loads the teacher of cfg.distill for a student of cfg.model on `dev`,
// running in the student's compute dtype with the student's dropout (as
// upstream, whose teacher is built from the student's arguments). One
// UserError naming the flag and the values when the checkpoint disagrees with
// --num-layers-teacher, --hidden-size-teacher, --num-attention-heads-teacher
// or --num-experts-teacher, or when its vocabulary or positions do not fit
// the student's.
std::unique_ptr<GptModel> load_teacher(const TrainConfig& cfg, Device dev, DType compute);

// The distillation settings of a student with that teacher.
GptModel::Distill distill_settings(const TrainConfig& cfg, GptModel& teacher);

}  // namespace ds
