// Offline conversion: every target (stage, tp rank, ZeRO shard) written from
// the saved full model and moments, with the saved tokenizer copies, then
// committed like a training save.
#include "lib/ckpt/convert.h"

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/file_io.h"
#include "lib/core/error.h"
#include "lib/model/tp_shard.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

namespace {

// Writes the optimizer shards of target (stage pr, tp rank tr): every ZeRO
// range of its local layout, cut from the full moments.
void write_target_rank(const std::string& out_dir, const TrainState& st, const ReshapeTarget& t,
                       const ModelLayout& full, const Tensor& params, const OptimizerStates& full_state,
                       int64_t opt_step, const std::string& opt_type, int world, int pr, int tr,
                       const StepTokenizer& tok) {
  const ModelLayout local = build_layout(t.model, t.sizes.at(tr, pr));
  OptimizerStates local_state = full_state;
  for (OptimizerStateTensor& s : local_state) {
    s.t = Tensor::empty({local.total}, DType::F32);
    slice_tp_params(local, full, full_state[&s - local_state.data()].t, s.t);
  }
  const ZeroPartition part = make_zero_partition(local.total, world);
  for (int r = 0; r < world; ++r) {
    const Range rg = world == 1 ? Range{0, local.total} : part.owned_real(r);
    OptimizerStates range_state = local_state;
    for (OptimizerStateTensor& s : range_state) s.t = s.t.view(rg.begin, {rg.size()});
    const CheckpointData d{.layout = &full,
                           .params = params,
                           .opt_state = range_state,
                           .opt_begin = rg.begin,
                           .opt_end = rg.end,
                           .opt_step = opt_step,
                           .rank = r,
                           .world = world,
                           .opt_layout = &local,
                           .shard = t.sizes.at(tr, pr),
                           .model = nullptr,
                           .tokenizer = &tok,
                           .opt_type = opt_type};
    write_checkpoint_files(out_dir, st, d, t.config);
  }
}

}  // namespace

void write_reshaped(const SavedStep& s, const ReshapeTarget& t, const std::string& out_dir) {
  const StepTokenizer tok = read_step_tokenizer(s.dir, s.state);  // the saved copies, verified
  remove_stale_temporaries(out_dir);  // a killed conversion's partial files never reach this step
  const ModelLayout full = build_layout(t.model);
  Tensor params = read_full_params(s, full);
  FullOptimizerState fs = assemble_full_state(s);
  OptimizerStates full_state = fs.states;
  for (OptimizerStateTensor& st : full_state) st.t = adapt_full(s.full, full, st.t);
  const int64_t opt_step = fs.step;
  const std::string opt_type = saved_optimizer_type(s);
  fs = FullOptimizerState{};  // release the saved-layout copies
  if (s.progress) s.progress->finish();  // everything is read; the saves print their own progress
  const TrainState st = s.state.train;
  const int world = t.zero_stage >= 1 ? t.dp : 1;  // stage 0: one shard holds the whole (pp, tp) rank
  for (int pr = 0; pr < t.sizes.pp; ++pr)
    for (int tr = 0; tr < t.sizes.tp; ++tr)
      write_target_rank(out_dir, st, t, full, params, full_state, opt_step, opt_type, world, pr, tr, tok);
  commit_checkpoint(out_dir, st.iteration);
}

}  // namespace ds
