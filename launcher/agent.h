// The per-node agent: starts this node's ranks with their rendezvous
// environment, forwards or logs their output, and on the first failure, a
// signal or the loss of the head tears every rank down (SIGTERM, then SIGKILL
// after the grace period). Runs in-process for local launches and as
// `dsrun --agent ...` on remote nodes.
#pragma once
#include <string>

#include "launcher/options.h"
#include "launcher/resources.h"

namespace ds::launch {

// Which node of `active` this agent runs: --node_rank, --node_name,
// --node_name_env or --node_rank_env (exactly one). Errors name the selector.
int resolve_node_rank(const AgentOptions& a, const ActiveResources& active);

// Exit code of an agent that stopped its ranks because one stalled
// (stopped or silent for --heartbeat_timeout; launcher/liveness.h).
inline constexpr int kStallExitCode = 124;

// How run_agent ended, beyond its exit code.
struct AgentEnd {
  bool interrupted = false;  // stopped by a signal, not by a rank
  std::string cause;         // the line that started the teardown ("" when none)
};

// Runs node `node_rank`'s ranks to completion. Returns the exit code: 0, the
// first failing rank's code (128+signal for a signal death), kStallExitCode
// for a stalled rank, or 128+signal when the agent itself was told to stop.
// watch_hangup: stop when stdout's reader goes away (the ssh/pdsh connection
// to the head closed).
int run_agent(const AgentOptions& a, int node_rank, bool watch_hangup, AgentEnd* end = nullptr);

// Entry point of `dsrun --agent ...`.
int agent_main(int argc, char** argv);

}  // namespace ds::launch
