// Offline conversion: every target (stage, tp rank, ZeRO shard) written from
// the saved full model and, range by range, the saved moments that range
// needs (read_reshaped_state: never the whole model's optimizer state), with
// the saved tokenizer copies, then committed like a training save.
#include "lib/ckpt/convert.h"

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/file_io.h"
#include "lib/core/error.h"
#include "lib/model/tp_shard.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

namespace {

// Writes the optimizer shards of target (stage pr, tp rank tr): every ZeRO
// range of its local layout, each read from the saved shards on its own.
void write_target_rank(const std::string& out_dir, const TrainState& st, const ReshapeTarget& t,
                       const ModelLayout& full, const Tensor& params, const SavedStep& s,
                       const OptimizerStates& names, const std::string& opt_type, int world, int pr, int tr,
                       const StepTokenizer& tok) {
  const ModelLayout local = build_layout(t.model, t.sizes.at(tr, pr));
  const ZeroPartition part = make_zero_partition(local.total, world);
  for (int r = 0; r < world; ++r) {
    const Range rg = world == 1 ? Range{0, local.total} : part.owned_real(r);
    OptimizerStates range_state = names;
    const int64_t opt_step = read_reshaped_state(s, full, local, rg.begin, rg.end, range_state);
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
  const OptimizerStates names = saved_state_names(s);
  const std::string opt_type = saved_optimizer_type(s);
  if (s.progress) s.progress->finish();  // the weights are read; the saves print their own progress
  SavedStep src = s;
  src.progress = nullptr;
  const TrainState st = s.state.train;
  const int world = t.zero_stage >= 1 ? t.dp : 1;  // stage 0: one shard holds the whole (pp, tp) rank
  for (int pr = 0; pr < t.sizes.pp; ++pr)
    for (int tr = 0; tr < t.sizes.tp; ++tr)
      write_target_rank(out_dir, st, t, full, params, src, names, opt_type, world, pr, tr, tok);
  commit_checkpoint(out_dir, st.iteration);
}

}  // namespace ds
