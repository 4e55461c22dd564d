// Offline conversion: every target (stage, tp rank, ZeRO shard) written from
// the saved model, one weight at a time, and range by range from the saved
// moments that range needs (read_reshaped_state), so that neither the whole
// model nor its optimizer state is ever in memory; with the saved tokenizer
// copies, then committed like a training save. A failure midway leaves only
// the temporary step directory, which dsconvert removes.
#include "lib/ckpt/convert.h"

#include <functional>

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
                       const ModelLayout& full, const std::function<Tensor(const std::string&)>& weights,
                       const SavedStep& s,
                       const OptimizerStates& names, const std::string& opt_type, int world, int pr, int tr,
                       const StepTokenizer& tok) {
  const ModelLayout local = build_layout(t.model, t.sizes.at(tr, pr));
  const ZeroPartition part = make_zero_partition(local.total, world);
  for (int r = 0; r < world; ++r) {
    const Range rg = world == 1 ? Range{0, local.total} : part.owned_real(r);
    OptimizerStates range_state = names;
    const int64_t opt_step = read_reshaped_state(s, full, local, rg.begin, rg.end, range_state);
    CheckpointData d;
    d.layout = &full;
    d.opt_state = range_state;
    d.opt_begin = rg.begin;
    d.opt_end = rg.end;
    d.opt_step = opt_step;
    d.rank = r;
    d.world = world;
    d.opt_layout = &local;
    d.shard = t.sizes.at(tr, pr);
    d.tokenizer = &tok;
    d.opt_type = opt_type;
    d.stream_params = weights;  // asked for by the writer of model.safetensors only
    write_checkpoint_files(out_dir, st, d, t.config);
  }
}

}  // namespace

void write_reshaped(const SavedStep& s, const ReshapeTarget& t, const std::string& out_dir) {
  const StepTokenizer tok = read_step_tokenizer(s.dir, s.state);  // the saved copies, verified
  remove_stale_temporaries(out_dir);  // a killed conversion's partial files never reach this step
  const ModelLayout full = build_layout(t.model);
  const SafetensorsFile model = open_saved_model(s);  // checksum, and every weight present as F32
  const OptimizerStates names = saved_state_names(s);
  const std::string opt_type = saved_optimizer_type(s);
  DS_USER_CHECK(saved_optimizer_scalars(s, s.sizes.at(0, 0)).empty(),
                "checkpoint '{}' holds {}'s per-tensor values of its compression stage, which dsconvert cannot carry "
                "into another layout; convert a checkpoint saved before its freeze_step", s.dir.string(), opt_type);
  if (s.progress) s.progress->finish();  // the saves print their own progress
  SavedStep src = s;
  src.progress = nullptr;
  const auto weights = [&](const std::string& name) {
    Tensor w = Tensor::empty(full.find(name).shape, DType::F32);
    read_full_weight(src, model, full, name, w.data<float>());
    return w;
  };
  const TrainState st = s.state.train;
  const int world = t.zero_stage >= 1 ? t.dp : 1;  // stage 0: one shard holds the whole (pp, tp) rank
  for (int pr = 0; pr < t.sizes.pp; ++pr)
    for (int tr = 0; tr < t.sizes.tp; ++tr)
      write_target_rank(out_dir, st, t, full, weights, src, names, opt_type, world, pr, tr, tok);
  commit_checkpoint(out_dir, st.iteration);
}

}  // namespace ds
