// `dstrain --estimate-memory`: how much memory a configuration needs per rank
// and per node for every ZeRO stage and optimizer-offload choice, computed
// from the model layout and the configured batch shape without allocating
// anything (the counterpart of DeepSpeed's estimate_zero2/zero3 helpers, plus
// activations). The numbers and their assumptions are described in docs/zero.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/parallel/zero_partition.h"

namespace ds {

// Activation bytes per rank for one training step (forward saves + the
// backward workspace of one layer).
struct ActivationBytes {
  int64_t saved = 0;      // kept from forward to backward (all in-flight micro-batches)
  int64_t workspace = 0;  // backward gradient buffers of one layer, logits included in `saved`
  int64_t total() const { return saved + workspace; }
};

// Pipeline parallel: the most activation-sized message buffers (B x T x C in
// the compute dtype) stage `stage` holds at once during a training step,
// following the plan PipelineExecutor runs (make_p2p_plan): a received
// activation or gradient lives from the post of its receive to the compute
// that consumes it, an input gradient from the backward that writes it to the
// post that sends it. `overlap` (1F1B and interleaved, as the executor):
// gradients on the second communicator (Comms::pp_grad), receives posted a
// compute earlier. zbh1 / zbh1_exact: the ZB-H1 schedule (vp 1).
int pipeline_message_buffers(int pp, int stage, int n_micro, int vp, bool overlap, bool zbh1 = false,
                             bool zbh1_exact = false);
// The most over the stages (the estimate is for the worst rank).
int pipeline_message_buffers_max(int pp, int n_micro, int vp, bool overlap, bool zbh1 = false,
                                 bool zbh1_exact = false);


// One (stage, offload) line of the estimate. All bytes are per rank unless named per node.
struct MemoryEstimateRow {
  int stage = 0;
  bool offload_optimizer = false;
  // offload_optimizer.device nvme (stage 3): the optimizer
  // state in the swap file (nvme_per_rank bytes), host memory holds the
  // sub-group buffers; offload_optimizer is true too.
  bool nvme = false;
  bool nvme_params = false;  // with offload_param nvme: the parameter shard in the swap file too
  bool nvme_grads = false;   // the f32 gradient shard in the swap file too (one sharding group)
  bool host_params = false;  // a GPU model with offload_param cpu (stage 3): the parameter shard in host memory
  int64_t nvme_per_rank = 0;
  bool supported = true;     // offload_optimizer needs ZeRO stage >= 1 and fp32 gradient accumulation;
                             // expert parallelism (EP > 1) ZeRO stage 0 without offload
  bool configured = false;   // the stage/offload the config asks for
  ModelStateBytes states;    // device-resident model states (zero_model_state_bytes)
  int64_t zero3_live = 0;    // stage 3: gathered parameters + the running unit's full gradient
  int64_t device_total = 0;  // states + zero3_live + activations + pipeline message buffers
  int64_t host_per_rank = 0, host_per_node = 0;
};

struct MemoryEstimate {
  int num_nodes = 1, gpus_per_node = 1, world = 1, tp = 1, pp = 1, dp = 1;
  int ulysses = 1, sdp = 1;   // DeepSpeed-Ulysses size; ZeRO partitions over sdp = ulysses x dp ranks
  ParallelLayout layout;      // the config's layout at this world size
  int64_t n_params = 0;       // whole model
  // This rank's model part: n_params less the experts on other expert-parallel
  // ranks, over tp*pp (rounded up).
  int64_t n_params_rank = 0;
  int64_t n_experts_rank = 0;  // of which expert weights (their E / EP share, over pp)
  bool vocab_assumed = false; // vocab_size was 0: GPT-2's 50257 was used
  bool approximate = false;   // tp*pp > 1: the model split is approximate
  StatePrecision precision = StatePrecision::FP32;
  ActivationBytes activations;
  int pipeline_buffers = 0;        // pp > 1: pipeline_message_buffers_max
  int64_t pipeline_buffer_bytes = 0;  // each of them
  int64_t pipeline_bytes() const { return pipeline_buffers * pipeline_buffer_bytes + weight_pass_bytes; }
  int weight_passes = 0;          // ZB-H1: most micro-batches whose weight pass waits on a stage
  int64_t weight_pass_bytes = 0;  // what they keep (deferred_weight_grad_bytes each)
  Zero3Plan zero3;            // fetch plan over the rank's units (embedding, layers, head)
  // Distillation (--kd / --mos): the teacher, whole on every rank. Sized from
  // the --*-teacher flags over the student's config; 0 when they do not give
  // its layers (its checkpoint is not read here).
  int64_t teacher_params = 0;
  int64_t teacher_bytes = 0;  // f32 weights (+ the compute copy) and its forward's activations
  std::vector<MemoryEstimateRow> rows;  // stages 0..3 x offload none/cpu, then stage 3 with nvme
};

// Pure arithmetic on the config; throws UserError when world = num_nodes *
// gpus_per_node is not a multiple of tp * pp * ulysses or the model is invalid.
MemoryEstimate estimate_memory(const TrainConfig& cfg, int num_nodes, int gpus_per_node);

// The estimate as the text dstrain prints (a few header lines and a table).
std::string estimate_memory_report(const TrainConfig& cfg, int num_nodes, int gpus_per_node);

}  // namespace ds
