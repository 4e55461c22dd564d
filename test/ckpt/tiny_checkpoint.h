// A checkpoint of the tiny test model (zero weights and Adam state, one
// process) for tests that exercise the save path itself.
#pragma once
#include "lib/ckpt/checkpoint.h"
#include "lib/model/layout.h"
#include "test/model/tiny_model.h"

namespace ds::test {

struct TinyCheckpoint {
  ModelLayout layout = build_layout(tiny_model(false));
  Tensor p = Tensor::zeros({layout.total}, DType::F32), m = p.clone(), v = p.clone();
  // The data to save (views of the tensors above; valid while this lives).
  CheckpointData data(int64_t opt_step) const {
    CheckpointData d;
    d.layout = &layout;
    d.params = p;
    d.opt_state = adam_states(m, v);
    d.opt_end = layout.total;
    d.opt_step = opt_step;
    return d;
  }
};

}  // namespace ds::test
