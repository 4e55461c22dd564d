// --cuda-graph: the training step from its start to just before its one host
// read (zeroing the gradients and the step statistics, every micro-batch's
// token copy, forward and backward, the gradient norm) captured once in a CUDA
// graph and replayed every step (docs/cuda.md, "CUDA graphs"). The read, the
// host decisions (fp16 is refused; the NaN rule, the clip coefficient) and the
// AdamW update stay outside, eager.
//
// What a replay repeats must not change between steps, so:
// - Scalars captured as kernel arguments: the loss weight (static batch and
//   sequence length, no loss scale: fp16 is refused) and the dropout key (its
//   iteration changes, but dropout is refused, so no kernel reads it). The
//   schedule's learning rate and weight decay, Adam's step count and the clip
//   coefficient are used only by the update, which is not captured.
// - Tokens: fixed device buffers per micro-batch, filled inside the graph by a
//   copy from fixed pinned buffers that the host refills before each replay.
//   The previous step's read waited for the device, so no copy from them is in
//   flight when they are rewritten.
// - Memory: allocations during the capture come from a pool owned by the graph
//   (cuda/core/allocator.cpp); nothing else gets those blocks while the graph
//   lives. Blocks allocated before the capture and used by the graph are the
//   persistent ones (parameters, gradients, the model's activation buffers,
//   step_stats_); the only code that could free one (an evaluation or a
//   checkpoint, which may reshape the model's buffers) first drops the graph
//   (invalidate_graph), and the next step captures again.
// - Host synchronisations: none inside the region. The CUDA code refuses them
//   while capturing (require_not_capturing), and the host synchronisation
//   counter must not move across the capture.
#include "lib/train/trainer.h"

#include <cstring>

#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/sync_counter.h"
#ifdef DS_WITH_CUDA
#include "cuda/cuda_api.h"
#endif

namespace ds {

struct Trainer::GraphState {
#ifdef DS_WITH_CUDA
  std::unique_ptr<cuda::StepGraph> graph = std::make_unique<cuda::StepGraph>();
#endif
  std::vector<void*> pinned_tok, pinned_tgt;  // per micro-batch: (B, T) i32, page-locked host memory
  std::vector<Tensor> tok, tgt;               // per micro-batch: (B, T) i32 on the device, fixed addresses
  std::vector<Tensor> tgt_host;               // the step's host targets (the model's checks while capturing)
  std::vector<int64_t> first_sample;          // per micro-batch (dropout keys; dropout is off)
  int64_t eager_steps = 0;  // graph-mode steps run eagerly so far (the warm-up)
  int failures = 0;         // captures in a row that failed
  ~GraphState() {
#ifdef DS_WITH_CUDA
    graph.reset();  // before the buffers it addresses
    for (void* p : pinned_tok) cuda::free_pinned(p);
    for (void* p : pinned_tgt) cuda::free_pinned(p);
#endif
  }
};

void Trainer::GraphStateDelete::operator()(GraphState* g) const { delete g; }

Trainer::~Trainer() = default;

void Trainer::setup_cuda_graph() {
  if (!cfg_.cuda_graph) return;
  // validate_cuda_graph refused every other layout and device already; these
  // hold by construction.
  DS_CHECK(dev_.is_cuda() && !pipe_ && comms_.world->size() == 1 && !scaler_ && !curriculum_,
           "--cuda-graph: unsupported configuration reached the trainer");
#ifdef DS_WITH_CUDA
  std::unique_ptr<GraphState, GraphStateDelete> g(new GraphState);
  const int64_t ga = cfg_.batch.grad_accum_steps, B = cfg_.batch.micro_batch_size, T = cfg_.model.seq_length;
  const size_t bytes = static_cast<size_t>(B * T) * sizeof(int32_t);
  for (int64_t m = 0; m < ga; ++m) {
    g->pinned_tok.push_back(cuda::alloc_pinned(bytes));
    g->pinned_tgt.push_back(cuda::alloc_pinned(bytes));
    g->tok.push_back(Tensor::empty({B, T}, DType::I32, dev_));
    g->tgt.push_back(Tensor::empty({B, T}, DType::I32, dev_));
  }
  g->tgt_host.resize(ga);
  g->first_sample.resize(ga);
  graph_ = std::move(g);
  DS_LOG("cuda graph: {} eager warm-up steps, then the step up to its host read is captured and replayed "
         "({} micro-batches of {} x {} tokens from fixed pinned buffers)",
         cfg_.cuda_graph_warmup, ga, B, T);
#else
  DS_USER_CHECK(false, "training.cuda_graph (--cuda-graph) needs a build with CUDA");
#endif
}

void Trainer::invalidate_graph(const char* why) {
#ifdef DS_WITH_CUDA
  if (!graph_ || !graph_->graph->ready()) return;
  graph_->graph = std::make_unique<cuda::StepGraph>();  // the old one returns its pool to the cache
  DS_LOG("cuda graph: released for the {} at iteration {}; the next step captures again", why, state_.iteration);
#else
  (void)why;
#endif
}

// Zeroing, the micro-batches and end_step_stats, as train_step runs them
// eagerly, but the tokens come from the fixed buffers (the same work in the
// warm-up and in the capture, so the capture finds the warm-up's blocks cached).
void Trainer::graph_region_eager(float loss_weight, DropoutKey key) {
#ifdef DS_WITH_CUDA
  GraphState& g = *graph_;
  const int64_t ga = cfg_.batch.grad_accum_steps;
  opt_->zero_grads();
  begin_step_stats();
  for (int64_t m = 0; m < ga; ++m) {
    cuda::copy_pinned_async(g.tok[m].raw(), g.pinned_tok[m], g.tok[m].nbytes());
    cuda::copy_pinned_async(g.tgt[m].raw(), g.pinned_tgt[m], g.tgt[m].nbytes());
    key.first_sample = g.first_sample[m];
    if (m + 1 == ga) opt_->begin_last_micro_batch();
    model_->forward_backward(g.tok[m], g.tgt[m], loss_weight, key, g.tgt_host[m]);
  }
  end_step_stats();
#else
  (void)loss_weight;
  (void)key;
#endif
}

void Trainer::graph_region(float loss_weight, DropoutKey key) {
#ifdef DS_WITH_CUDA
  GraphState& g = *graph_;
  const int64_t ga = cfg_.batch.grad_accum_steps;
  for (int64_t m = 0; m < ga; ++m) {
    MicroBatch mb = data_->train_batch_host(state_.consumed_samples, static_cast<int>(m), 0, 1);
    DS_CHECK(mb.tokens.nbytes() == g.tok[m].nbytes(), "--cuda-graph: micro-batch shape changed");
    std::memcpy(g.pinned_tok[m], mb.tokens.raw(), mb.tokens.nbytes());
    std::memcpy(g.pinned_tgt[m], mb.targets.raw(), mb.targets.nbytes());
    g.tgt_host[m] = mb.targets_host;
    g.first_sample[m] = mb.first_sample;
  }
  if (g.graph->stale()) invalidate_graph("reallocated stream workspace");
  if (g.graph->ready()) {
    g.graph->replay();
    ++graph_replays_;
    return;
  }
  if (g.eager_steps < cfg_.cuda_graph_warmup) {
    graph_region_eager(loss_weight, key);
    ++g.eager_steps;
    return;
  }
  const int64_t syncs = host_sync_count();
  size_t nodes = 0;
  try {
    g.graph->begin_capture();
    graph_region_eager(loss_weight, key);
    nodes = g.graph->end_capture();
  } catch (const std::exception& e) {
    // Nothing captured has run: the step runs eagerly and the next one tries
    // again (a block the warm-up never allocated is cached by then).
    g.graph->abort_capture();
    g.graph = std::make_unique<cuda::StepGraph>();
    DS_USER_CHECK(++g.failures < 3, "--cuda-graph: capturing the step failed 3 times in a row (iteration {}): {}",
                  state_.iteration + 1, e.what());
    DS_LOG("warning: --cuda-graph: capturing the step at iteration {} failed, it runs eagerly and the next step "
           "captures again: {}", state_.iteration + 1, e.what());
    graph_region_eager(loss_weight, key);
    return;
  }
  DS_CHECK(host_sync_count() == syncs, "--cuda-graph: {} host synchronisations inside the captured region (must be 0)",
           host_sync_count() - syncs);
  g.failures = 0;
  graph_captured_at_ = state_.iteration + 1;
  ++graph_captures_;
  DS_LOG("cuda graph: captured the step at iteration {}: {} nodes, {:.1f} MiB in the graph's memory pool; "
         "replayed from now on", graph_captured_at_, nodes, static_cast<double>(g.graph->pool_bytes()) / (1 << 20));
  g.graph->replay();  // the captured step has not run yet
  ++graph_replays_;
#else
  (void)loss_weight;
  (void)key;
#endif
}

}  // namespace ds
