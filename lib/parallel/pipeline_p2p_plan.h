// How a pipeline rank posts the send/receive actions of its schedule
// (lib/parallel/pipeline_schedule.h) as asynchronous batches, and which batch
// each compute action waits for. Pure data, so the deadlock-freedom of the
// posting order is checked on CPU (test/parallel/test_pipeline_p2p_plan.cpp)
// against a model of the executor: per rank one FIFO queue of batches per
// communicator (its communication thread or stream), every message a
// rendezvous.
//
// Without overlap every run of consecutive send/receive actions is one batch
// and the next compute waits for it: the 1F1B steady state then pairs each
// send with the receive its next compute needs, so the transfer sits between
// two computes. With overlap (Megatron's overlap_p2p_comm) activations and
// gradients go on two queues and receives are posted ahead of the compute
// that needs them, so the message a neighbour produces while this rank
// computes arrives during that compute:
// - 1F1B: each receive is posted one compute earlier, in a batch of its own
//   right after the run it moves into. Sends stay where they are (their data
//   is produced by the compute before them).
// - Interleaved 1F1B: each queue keeps the schedule's sequence of batches
//   (moving a receive ahead of a send deadlocks the ring of activation
//   queues), and a batch is posted one compute earlier when that compute
//   produces nothing it sends. In the steady state the forward's half
//   (SendF, the next RecvF) goes out before the backward, the backward's half
//   (SendB, the next RecvB) before the next forward: both receives a compute
//   ahead. In warmup and cooldown a receive stays right before its compute.
// The bytes moved and their order per channel are the same either way.
#pragma once
#include <vector>

#include "lib/parallel/pipeline_schedule.h"

namespace ds {

struct P2PPlanStep {
  enum class Kind { Post, Compute };
  Kind kind = Kind::Compute;
  std::vector<PipeAction> batch;  // Post: actions posted together as one asynchronous batch
  int queue = 0;                  // Post: 0 without overlap, else p2p_queue() of every action
  PipeAction compute;             // Compute: the Forward or Backward
  // Compute: indices (into the plan's posts, in posting order) of the batches
  // it waits for first: the one holding the receive it consumes and, for a
  // Backward, the one that sent its forward's output (whose buffer the
  // backward frees).
  std::vector<int> waits;
};

// Which of the rank's two communication queues carries an action: 0 for
// activations (SendForward, RecvForward), 1 for their gradients.
int p2p_queue(ActionKind kind);

// The rank's actions (make_schedule(kind, ...)) as posts and computes;
// `overlap` posts receives early as described above. The receive order per
// message channel stays that of `actions`, so the k-th message of a channel
// still lands in the k-th receive.
std::vector<P2PPlanStep> make_p2p_plan(const std::vector<PipeAction>& actions, ScheduleKind kind, bool overlap);

}  // namespace ds
