#include "lib/model/param_group.h"

#include <algorithm>

namespace ds {

const char* parallel_axis_name(ParallelAxis a) {
  switch (a) {
    case ParallelAxis::Tensor: return "tensor";
    case ParallelAxis::Pipeline: return "pipeline";
    case ParallelAxis::Data: return "data";
    case ParallelAxis::Ulysses: return "ulysses";
    case ParallelAxis::Expert: return "expert";
    case ParallelAxis::ExpertData: return "expert-data";
  }
  return "?";
}

bool ParamGroupSpec::decays(const std::string& name, const Shape& shape) const {
  switch (decay) {
    case DecayRule::All: return true;
    case DecayRule::None: return false;
    case DecayRule::Megatron: break;
    case DecayRule::MegatronBlockNorms:
      if (name.rfind("layers.", 0) == 0 && (name.ends_with(".norm1.weight") || name.ends_with(".norm2.weight")))
        return true;
      break;
  }
  const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  return !bias && shape.size() > 1;
}

bool ParamGroupSpec::reduces_over(ParallelAxis a) const {
  return std::find(reduce.begin(), reduce.end(), a) != reduce.end();
}

bool ParamGroupSpec::splits_over(ParallelAxis a) const {
  return std::find(split.begin(), split.end(), a) != split.end();
}

ParamGroupSpec dense_param_group() {
  return {.name = "dense",
          .split = {ParallelAxis::Tensor, ParallelAxis::Pipeline},
          .reduce = {ParallelAxis::Data, ParallelAxis::Ulysses},
          .decay = DecayRule::Megatron};
}

ParamGroupSpec expert_param_group(bool tensor_split) {
  std::vector<ParallelAxis> split{ParallelAxis::Pipeline, ParallelAxis::Expert};
  if (tensor_split) split.insert(split.begin(), ParallelAxis::Tensor);
  return {.name = "experts",
          .split = std::move(split),
          .reduce = {ParallelAxis::ExpertData, ParallelAxis::Ulysses},
          .decay = DecayRule::Megatron};
}

}  // namespace ds
