// Pipeline-parallel schedules as data: for each pipeline rank, the ordered list
// of receive / compute / send actions of one global batch, following
// Megatron-LM's 1F1B (PipeDream-Flush) and interleaved 1F1B (virtual stages),
// and Megatron-DeepSpeed's zero-bubble ZB-H1.
// Nothing here communicates; an executor walks its rank's list and performs
// each action. The tests' simulator (test/parallel/pipeline_sim.h) plays all
// ranks' lists against each other over in-order point-to-point channels, so
// the schedules (and any list an executor derives from them) are checked on
// CPU. See docs/pipeline.md.
#pragma once
#include <string>
#include <vector>

namespace ds {

// OneFOneB: PipeDream-Flush 1F1B, one model chunk per rank.
// Interleaved1F1B: Megatron's interleaved 1F1B; each rank holds
// `virtual_stages` model chunks, chunk c of rank r being virtual stage c*PP + r.
// ZeroBubbleH1: Megatron-DeepSpeed's ZB-H1 (--enable-zbh1-pipeline), 1F1B's
// forwards, backwards and messages with the backward split into an
// input-gradient pass and a weight-gradient pass where that shortens the
// bubble: a stage's first `stage` backwards leave their weight gradients
// for later (so the gradient reaches the previous stage sooner) and the
// cooldown fills its gaps with them. The steady phase runs whole backwards
// there (upstream's default variation: the weight gradients of a parameter
// are then summed in another micro-batch order than 1F1B's).
// ZeroBubbleH1Exact (--enable-zbh1-exact-semantics): the steady phase splits
// too, so every weight pass runs in micro-batch order and the gradients are
// summed in 1F1B's order, bit for bit.
enum class ScheduleKind { OneFOneB, Interleaved1F1B, ZeroBubbleH1, ZeroBubbleH1Exact };

// The zero-bubble kinds: BackwardInput is a backward that leaves the weight
// gradients of the layers' linear layers for a later WeightGrad of the same
// micro-batch (the oldest one pending: weight passes run in the order of
// their input passes). Backward is the whole backward.
enum class ActionKind {
  RecvForward,
  Forward,
  SendForward,
  RecvBackward,
  Backward,
  SendBackward,
  BackwardInput,
  WeightGrad
};

// One step of a rank's schedule. `micro` is the micro-batch, `chunk` the model
// chunk (virtual stage) on this rank, always 0 for 1F1B. Sends and receives
// name the local chunk whose data moves: SendForward(m, c) sends the output of
// Forward(m, c); RecvForward(m, c) receives the input of Forward(m, c);
// RecvBackward(m, c) receives the gradient of that output; SendBackward(m, c)
// sends the input gradient produced by Backward(m, c).
// Consecutive send/receive actions form one batch that the executor posts
// together (batched isend/irecv, an NCCL group) and waits on as a whole.
struct PipeAction {
  ActionKind kind = ActionKind::Forward;
  int micro = 0;
  int chunk = 0;
  bool operator==(const PipeAction&) const = default;
};

bool is_communication(ActionKind kind);
// Backward or BackwardInput: consumes the output gradient, frees the
// activations, produces the input gradient.
bool is_backward(ActionKind kind);
bool is_zero_bubble(ScheduleKind kind);
// "F3", "F3.1" (micro 3, chunk 1 when virtual_stages > 1), "RecvF3", "SendB2.0",
// "BI3" (BackwardInput), "W3"...
std::string to_string(const PipeAction& action, int virtual_stages = 1);
std::string to_string(ScheduleKind kind);  // "1f1b", "interleaved-1f1b", "zbh1", "zbh1-exact"
// The schedule a run uses: interleaved with virtual stages, else ZB-H1 when
// asked for (exact or not), else 1F1B.
ScheduleKind pipeline_schedule_kind(int virtual_stages, bool zbh1, bool zbh1_exact);

// Actions of pipeline rank `stage` (0-based) for one global batch of n_micro
// micro-batches. Throws ds::UserError naming the numbers for invalid
// combinations: sizes < 1, stage outside [0, pp), virtual_stages != 1 for 1F1B
// and ZB-H1, and for the interleaved schedule pp < 2 or n_micro % pp != 0 (Megatron's rule).
std::vector<PipeAction> make_schedule(ScheduleKind kind, int pp, int stage, int n_micro,
                                      int virtual_stages = 1);
// make_schedule for every stage 0..pp-1.
std::vector<std::vector<PipeAction>> make_all_schedules(ScheduleKind kind, int pp, int n_micro,
                                                        int virtual_stages = 1);

// Megatron's warmup count: forward passes a stage runs before its steady 1F1B
// phase, counted in (micro-batch, chunk) forward passes.
//   1F1B, ZB-H1: min(pp - stage - 1, n_micro)
//   interleaved: n_micro * v when n_micro == pp (all forwards first), else
//                min(2 * (pp - stage - 1) + (v - 1) * pp, n_micro * v)
// The cooldown runs the same number of backward passes after the steady phase.
int warmup_micro_batches(ScheduleKind kind, int pp, int stage, int n_micro, int virtual_stages = 1);

// Most forward activations (forwarded, not yet backwarded, over all chunks) the
// stage holds at once: min(warmup + 1, n_micro * v); for 1F1B that is
// min(pp - stage, n_micro). The schedules reach this bound exactly.
int max_live_activations(ScheduleKind kind, int pp, int stage, int n_micro, int virtual_stages = 1);

// Weight passes a zero-bubble stage holds at once (input gradients done, weight
// gradients not yet): what it keeps for them is copied at the input pass.
// At most stage + 1; 0 for the other schedules and on stage 0.
int max_pending_weight_grads(ScheduleKind kind, int pp, int stage, int n_micro);

// Idle time over ideal compute time: (pp - 1) / n_micro, divided by v when
// interleaved (Megatron's formula; equal forward and backward cost per layer).
// ZB-H1: (pp - 1) / (3 n_micro), with the forward, the input-gradient and the
// weight-gradient passes equal in cost (the zero-bubble paper's accounting;
// 1F1B's bubble is (pp - 1) / n_micro in the same units); the simulator
// measures it for n_micro >= pp (exact semantics: one weight pass more when
// n_micro > pp).
double bubble_fraction(ScheduleKind kind, int pp, int n_micro, int virtual_stages = 1);

// Virtual stages: with pp ranks and v chunks each, the model is cut into
// pp * v consecutive stages and chunk c of rank r is stage c * pp + r.
struct VirtualStage {
  int rank = 0;
  int chunk = 0;
  bool operator==(const VirtualStage&) const = default;
};
int virtual_stage_index(int pp, int rank, int chunk);                // c * pp + r
VirtualStage locate_virtual_stage(int pp, int virtual_stages, int s);  // inverse
// Whom this (rank, chunk) sends activations to (SendForward) and receives
// gradients from (RecvBackward): the next virtual stage, wrapping from the last
// rank to rank 0 with chunk + 1. Requires a next stage to exist.
VirtualStage forward_peer(int pp, int virtual_stages, int rank, int chunk);
// Whom it receives activations from (RecvForward) and sends gradients to
// (SendBackward): the previous virtual stage. Requires one to exist.
VirtualStage backward_peer(int pp, int virtual_stages, int rank, int chunk);

}  // namespace ds
