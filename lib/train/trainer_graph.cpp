// --cuda-graph: the whole training step up to its one host read captured
// once in a CUDA graph and replayed every step (docs/cuda.md, "CUDA
// graphs"): the copy of the step scalars and of every micro-batch's tokens
// from fixed pinned buffers, zeroing the gradients and the step statistics,
// forward and backward, the gradient norm, the update's gate (step_gate: clip
// coefficient and the skip decision, on the device from the statistics) and
// the AdamW update reading its per-step values from the step block. A
// replayed step is one graph launch and one read (statistics and the
// device's gate); the host then keeps its counters (iteration, skipped
// steps, Adam's step count, the schedule, the fp16 loss scaler) in line with
// what the device did.
//
// What a replay repeats must not change between steps, so:
// - Scalars captured as kernel arguments: the loss weight 1 / (B x T x ga)
//   (static batch and sequence length; a static fp16 loss scale is a
//   constant factor of it), the dropout key's constant part (seed, layer,
//   site, probability, in-batch offsets), the gate's clip threshold, Adam's
//   betas and eps. The schedule's learning rate and weight decay, the bias
//   corrections of Adam's step count and a dynamic fp16 loss scale live in
//   the step block (lib/ops/step_scalars.h): the host writes them into a
//   fixed pinned buffer before each replay and the graph copies them in; the
//   loss kernel multiplies its weight by the block's loss scale
//   (GptModel::set_dloss_scale) and step_gate divides it out. The scale is a
//   power of two (validate_cuda_graph), so 2^k x fl(1 / N) is the eager
//   step's fl(2^k / N) exactly. The grad scale and the skip flag are written
//   into the block inside the graph by step_gate.
// - Tokens and the dropout key's per-step part ({iteration, first sample}, read
//   by the dropout and attention kernels from memory: DropoutKey::step,
//   DropoutSpec::step_key): fixed device buffers per micro-batch, filled
//   inside the graph by a copy from fixed pinned buffers that the host
//   refills before each replay. The previous step's read waited for the
//   device, so no copy from them (or from the step scalars' buffer) is in
//   flight when they are rewritten.
// - Memory: allocations during the capture come from a pool owned by the graph
//   (cuda/core/allocator.cpp); nothing else gets those blocks while the graph
//   lives. Blocks allocated before the capture and used by the graph are the
//   persistent ones (parameters, gradients, Adam's moments, the model's
//   activation buffers, step_block_); the only code that could free one (an
//   evaluation or a checkpoint, which may reshape the model's buffers) first
//   drops the graph (invalidate_graph), and the next step captures again.
// - Host synchronisations: none inside the region. The CUDA code refuses them
//   while capturing (require_not_capturing), and the host synchronisation
//   counter must not move across the capture.
#include "lib/train/trainer.h"

#include <cstring>

#include "lib/core/device_runtime.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/sync_counter.h"

namespace ds {

struct Trainer::GraphState {
  explicit GraphState(Device dev) : rt(device_runtime(dev)), graph(rt.make_graph()) {}
  DeviceRuntime& rt;
  std::unique_ptr<DeviceGraph> graph;
  std::vector<void*> pinned_tok, pinned_tgt;  // per micro-batch: (B, T) i32, page-locked host memory
  std::vector<Tensor> tok, tgt;               // per micro-batch: (B, T) i32 on the device, fixed addresses
  std::vector<Tensor> tgt_host;               // the step's host targets (the model's checks while capturing)
  std::vector<void*> pinned_key;              // per micro-batch: (2) i64 {iteration, first sample}, page-locked
  std::vector<Tensor> key;                    // per micro-batch: (2) i64 on the device (DropoutKey::step)
  int64_t eager_steps = 0;  // graph-mode steps run eagerly so far (the warm-up)
  int failures = 0;         // captures in a row that failed
  ~GraphState() {
    graph.reset();  // before the buffers it addresses
    for (void* p : pinned_tok) rt.free_pinned(p);
    for (void* p : pinned_tgt) rt.free_pinned(p);
    for (void* p : pinned_key) rt.free_pinned(p);
  }
};

void Trainer::GraphStateDelete::operator()(GraphState* g) const { delete g; }

Trainer::~Trainer() = default;

void Trainer::setup_cuda_graph() {
  if (!cfg_.cuda_graph) return;
  // validate_cuda_graph refused every other layout and device already; these
  // hold by construction.
  DS_CHECK(dev_.is_cuda() && !pipe_ && comms_.world->size() == 1 && !curriculum_ && pinned_terms_,
           "--cuda-graph: unsupported configuration reached the trainer");
  std::unique_ptr<GraphState, GraphStateDelete> g(new GraphState(dev_));
  const int64_t ga = cfg_.batch.grad_accum_steps, B = cfg_.batch.micro_batch_size, T = cfg_.model.seq_length;
  const size_t bytes = static_cast<size_t>(B * T) * sizeof(int32_t);
  for (int64_t m = 0; m < ga; ++m) {
    g->pinned_tok.push_back(g->rt.alloc_pinned(bytes));
    g->pinned_tgt.push_back(g->rt.alloc_pinned(bytes));
    g->tok.push_back(Tensor::empty({B, T}, DType::I32, dev_));
    g->tgt.push_back(Tensor::empty({B, T}, DType::I32, dev_));
    g->pinned_key.push_back(g->rt.alloc_pinned(2 * sizeof(int64_t)));
    g->key.push_back(Tensor::empty({2}, DType::I64, dev_));
  }
  g->tgt_host.resize(ga);
  // A dynamic fp16 loss scale enters the loss gradient from the step block
  // (every graph-mode step, eager warm-up included; an evaluation computes no
  // gradient, so it is unaffected).
  if (scaler_ && scaler_->dynamic()) model_->set_dloss_scale(step_scalars().view(AdamWSlot::LossScale, {1}));
  graph_ = std::move(g);
  DS_LOG("cuda graph: {} eager warm-up steps, then the step up to its host read, AdamW update included, is "
         "captured and replayed ({} micro-batches of {} x {} tokens, their dropout keys and the step scalars from "
         "fixed pinned buffers)",
         cfg_.cuda_graph_warmup, ga, B, T);
}

void Trainer::invalidate_graph(const char* why) {
  if (!graph_ || !graph_->graph->ready()) return;
  graph_->graph = graph_->rt.make_graph();  // the old one returns its pool to the cache
  DS_LOG("cuda graph: released for the {} at iteration {}; the next step captures again", why, state_.iteration);
}

// The step as train_step runs it eagerly with device_update_, but the step
// scalars, the tokens and the dropout keys' per-step part come from the fixed
// pinned buffers (the same work in the warm-up and in the capture, so the
// capture finds the warm-up's blocks cached).
void Trainer::graph_region_eager(float loss_weight, DropoutKey key, const StepHyper& h) {
  GraphState& g = *graph_;
  const int64_t ga = cfg_.batch.grad_accum_steps;
  // fp16: a static loss scale is in loss_weight (a constant); a dynamic one
  // is read from the step block by the loss kernel and the gate.
  const bool block_scale = scaler_ && scaler_->dynamic();
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  const float w = block_scale ? static_cast<float>(1.0 / static_cast<double>(cfg_.batch.micro_batch_size *
                                                                             cfg_.model.seq_length * ga))
                              : loss_weight;
  copy_update_terms();
  opt_->zero_grads();
  begin_step_stats();
  for (int64_t m = 0; m < ga; ++m) {
    g.rt.copy_pinned_async(g.tok[m].raw(), g.pinned_tok[m], g.tok[m].nbytes());
    g.rt.copy_pinned_async(g.tgt[m].raw(), g.pinned_tgt[m], g.tgt[m].nbytes());
    g.rt.copy_pinned_async(g.key[m].raw(), g.pinned_key[m], g.key[m].nbytes());
    key.step = g.key[m];  // the ops read {iteration, first sample} from it
    if (m + 1 == ga) opt_->begin_last_micro_batch();
    model_->forward_backward(g.tok[m], g.tgt[m], w, key, g.tgt_host[m]);
  }
  end_step_stats();
  update_on_device(h, scale, block_scale);
}

void Trainer::graph_region(float loss_weight, DropoutKey key, const StepHyper& h) {
  GraphState& g = *graph_;
  const int64_t ga = cfg_.batch.grad_accum_steps;
  stage_update_terms(h);  // Adam's step count and the loss scale as the previous read left them
  for (int64_t m = 0; m < ga; ++m) {
    heartbeat_.beat_if_started();
    MicroBatch mb = data_->train_batch_host(state_.consumed_samples, static_cast<int>(m), 0, 1);
    DS_CHECK(mb.tokens.nbytes() == g.tok[m].nbytes(), "--cuda-graph: micro-batch shape changed");
    std::memcpy(g.pinned_tok[m], mb.tokens.raw(), mb.tokens.nbytes());
    std::memcpy(g.pinned_tgt[m], mb.targets.raw(), mb.targets.nbytes());
    g.tgt_host[m] = mb.targets_host;
    const int64_t step_key[2] = {key.iteration, mb.first_sample};
    std::memcpy(g.pinned_key[m], step_key, sizeof(step_key));
  }
  if (g.graph->stale()) invalidate_graph("reallocated stream workspace");
  if (g.graph->ready()) {
    g.graph->replay();
    ++graph_replays_;
    return;
  }
  if (g.eager_steps < cfg_.cuda_graph_warmup) {
    graph_region_eager(loss_weight, key, h);
    ++g.eager_steps;
    return;
  }
  const int64_t syncs = host_sync_count();
  size_t nodes = 0;
  try {
    g.graph->begin_capture();
    graph_region_eager(loss_weight, key, h);
    nodes = g.graph->end_capture();
  } catch (const std::exception& e) {
    // Nothing captured has run: the step runs eagerly and the next one tries
    // again (a block the warm-up never allocated is cached by then). The
    // host's half of the interrupted step (units acquired, the overlap armed)
    // is forgotten first.
    g.graph->abort_capture();
    g.graph = g.rt.make_graph();
    model_->abandon_pass();
    opt_->abandon_step();
    DS_USER_CHECK(++g.failures < 3, "--cuda-graph: capturing the step failed 3 times in a row (iteration {}): {}",
                  state_.iteration + 1, e.what());
    DS_LOG("warning: --cuda-graph: capturing the step at iteration {} failed, it runs eagerly and the next step "
           "captures again: {}", state_.iteration + 1, e.what());
    graph_region_eager(loss_weight, key, h);
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
}

}  // namespace ds
