// The restart loop of --max_restarts / --elastic_training (restart.h): each
// attempt is a complete launch (plan, transport, teardown); between attempts
// the failure is attributed to a host, an elastic job picks its next hosts,
// and one log line says why it restarts, where, with which layout and from
// which iteration the program resumes.
#include "launcher/restart.h"

#include <algorithm>

#include "lib/core/error.h"
#include "launcher/elastic.h"
#include "launcher/guard.h"
#include "launcher/head.h"
#include "launcher/ssh_transport.h"

namespace ds::launch {
namespace {

std::string include_spec(const ActiveResources& all, const std::vector<int>& pick) {
  std::string spec;
  for (int i : pick) {
    if (!spec.empty()) spec += '@';
    spec += fmt::format("{}:{}", all[i].host, fmt::join(all[i].slots, ","));
  }
  return spec;
}

std::string host_list(const ActiveResources& a) {
  std::string s;
  for (const auto& n : a) s += (s.empty() ? "" : ", ") + n.host;
  return s;
}

// dstrain must resume from a checkpoint, or every restart would start over.
void check_resumable(const ProgramCheckpoint& pc, const Options& o) {
  if (!pc.is_dstrain) {
    if (pc.load_dir.empty())
      fmt::print(stderr, "dsrun: note: with --max_restarts {} a restart runs '{}' again from the start; it must "
                 "resume from its own checkpoint\n", o.max_restarts, o.program);
    return;
  }
  DS_USER_CHECK(!pc.load_dir.empty(), "--max_restarts {}: dstrain has no checkpoint to resume from after a restart; "
                "give it --load DIR --save DIR --save-interval N (the same DIR)", o.max_restarts);
  if (pc.save_dir.empty())
    fmt::print(stderr, "dsrun: note: dstrain has --load {} but no --save: every restart resumes from the checkpoint "
               "already there\n", pc.load_dir);
  else if (pc.save_dir != pc.load_dir)
    fmt::print(stderr, "dsrun: note: dstrain saves to {} but a restart resumes from --load {}\n", pc.save_dir,
               pc.load_dir);
}

class RestartLoop {
 public:
  RestartLoop(const PlanInputs& in, LaunchPlan first)
      : in_(in), first_(std::move(first)), all_(first_.active), health_(all_.size()),
        dropped_at_(all_.size(), -1), prog_(inspect_program(in.opts.program, in.opts.args)) {
    const Options& o = in_.opts;
    check_resumable(prog_, o);
    if (!o.elastic_training) return;
    DS_USER_CHECK(first_.transport == Transport::Ssh, "--elastic_training needs the built-in ssh launcher "
                  "(--launcher ssh, with a hostfile of remote hosts); this launch uses '{}'",
                  transport_name(first_.transport));
    limits_.min_nodes = o.min_elastic_nodes > 0 ? o.min_elastic_nodes : 1;
    limits_.max_nodes = o.max_elastic_nodes > 0 ? o.max_elastic_nodes : static_cast<int>(all_.size());
    DS_USER_CHECK(limits_.min_nodes <= static_cast<int>(all_.size()), "--min_elastic_nodes {} is more than the {} "
                  "host(s) selected", limits_.min_nodes, all_.size());
    limits_.elasticity = prog_.elasticity;
  }

  int run();

 private:
  bool pick_hosts(int attempt, std::vector<std::unique_ptr<SshConnection>>* conns);
  std::string layout(const ActiveResources& a) const;
  std::string resume_point() const;

  PlanInputs in_;
  LaunchPlan first_;
  ActiveResources all_;           // every host the job may use, hostfile order
  std::vector<HostHealth> health_;
  std::vector<int> dropped_at_;   // attempt before which a host was dropped
  ProgramCheckpoint prog_;
  ElasticLimits limits_;
  std::vector<int> hosts_;        // indices into all_ of the current attempt
};

std::string RestartLoop::layout(const ActiveResources& a) const {
  int64_t world = 0;
  for (const auto& n : a) world += static_cast<int64_t>(n.slots.size());
  try {
    return describe_layout(world, prog_.elasticity);
  } catch (const UserError&) {
    return describe_layout(world, std::nullopt);
  }
}

std::string RestartLoop::resume_point() const {
  if (prog_.load_dir.empty()) return "the program starts again (no checkpoint directory known to dsrun)";
  const int64_t it = latest_iteration(prog_.load_dir);
  if (it < 0) return fmt::format("no checkpoint in {} yet: training starts from iteration 0", prog_.load_dir);
  return fmt::format("resuming from iteration {} ({}/latest)", it, prog_.load_dir);
}

// Connects to every host that may take part (dropped ones only from the
// second restart after their drop on), then keeps the largest usable prefix.
bool RestartLoop::pick_hosts(int attempt, std::vector<std::unique_ptr<SshConnection>>* conns) {
  std::vector<std::string> names;
  std::vector<int> index;
  for (size_t i = 0; i < all_.size(); ++i) {
    if (health_[i].dropped && dropped_at_[i] == attempt) continue;  // just dropped: sits this one out
    names.push_back(all_[i].host);
    index.push_back(static_cast<int>(i));
  }
  const Options& o = in_.opts;
  std::vector<std::string> errors;
  auto open = ssh_try_connect_all(names, {o.ssh_port, o.ssh_user, o.ssh_identity, o.ssh_known_hosts,
                                          o.ssh_no_host_key_check, o.ssh_timeout}, &errors);
  std::vector<bool> usable(all_.size(), false);
  std::vector<std::unique_ptr<SshConnection>> by_host(all_.size());
  for (size_t k = 0; k < names.size(); ++k) {
    const int i = index[k];
    if (!open[k]) {
      fmt::print(stderr, "dsrun: elastic: host {} is not usable now: {}\n", all_[i].host, errors[k]);
      continue;
    }
    usable[i] = true;
    by_host[i] = std::move(open[k]);
    if (health_[i].dropped) {
      health_[i].dropped = false;
      fmt::print(stderr, "dsrun: elastic: host {} answers again and is taken back\n", all_[i].host);
    }
  }
  std::vector<int> slots;
  for (const auto& n : all_) slots.push_back(static_cast<int>(n.slots.size()));
  std::string why;
  hosts_ = choose_elastic_hosts(slots, usable, limits_, &why);
  if (hosts_.empty()) {
    fmt::print(stderr, "dsrun: elastic: cannot start attempt {}: {}\n", attempt + 1, why);
    return false;
  }
  conns->clear();
  for (int i : hosts_) conns->push_back(std::move(by_host[i]));
  return true;
}

int RestartLoop::run() {
  const Options& o = in_.opts;
  AttemptResult last;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::unique_ptr<SshConnection>> conns;
    PlanInputs in = in_;
    in.attempt = attempt;  // a fresh job token for every attempt (make_plan)
    LaunchPlan p;
    try {
      if (o.elastic_training) {
        if (!pick_hosts(attempt, &conns)) return attempt == 0 ? 1 : last.code;
        in.opts.include = include_spec(all_, hosts_);
        in.opts.exclude.clear();
        in.opts.num_gpus = -1;
        // A master address that names a host this attempt does not use is discovered anew.
        bool master_gone = false;
        for (size_t i = 0; i < all_.size(); ++i)
          master_gone |= all_[i].host == o.master_addr && std::find(hosts_.begin(), hosts_.end(), i) == hosts_.end();
        if (master_gone) in.opts.master_addr.clear();
        p = make_plan(in);
      } else {
        p = attempt == 0 ? std::move(first_) : make_plan(in);
      }
      if (attempt == 0 && o.elastic_training)
        fmt::print(stderr, "dsrun: elastic: starting on {} host(s) ({}); layout: {}\n", p.active.size(),
                   host_list(p.active), layout(p.active));
      if (attempt > 0)
        fmt::print(stderr, "dsrun: restart {} of {} after {}: hosts {} ({} node(s)); layout: {}; {}\n", attempt,
                   o.max_restarts, last.cause, host_list(p.active), p.active.size(), layout(p.active),
                   resume_point());
      last = run_attempt(p, in, std::move(conns));
    } catch (const UserError& e) {
      if (attempt == 0) throw;
      fmt::print(stderr, "dsrun: error: {}\n", e.what());
      last = AttemptResult{1, false, -1, false, fmt::format("a failed launch ({})", e.what())};
    }
    if (last.code == 0) {
      if (attempt > 0) fmt::print(stderr, "dsrun: the job finished after {} restart(s)\n", attempt);
      return 0;
    }
    if (last.interrupted) return last.code;
    if (attempt >= o.max_restarts) {
      fmt::print(stderr, "dsrun: attempt {} ended with {}; no restarts left (--max_restarts {}); exit code {}\n",
                 attempt + 1, last.cause, o.max_restarts, last.code);
      return last.code;
    }
    if (o.elastic_training && last.failed_node >= 0 && last.failed_node < static_cast<int>(hosts_.size())) {
      const int h = hosts_[last.failed_node];
      if (record_host_failure(health_, hosts_, h, last.heartbeat_lost, last.cause)) {
        dropped_at_[h] = attempt + 1;
        fmt::print(stderr, "dsrun: elastic: dropping host {} ({}); it is tried again from the restart after next\n",
                   all_[h].host, health_[h].why);
      }
    }
  }
}

}  // namespace

int run_with_restarts(const PlanInputs& in, LaunchPlan first) {
  const bool local = first.transport == Transport::Local;
  RestartLoop loop(in, std::move(first));
  // In-process ranks: the whole loop runs in the guarded worker (guard.h).
  if (local) return run_guarded([&] { return loop.run(); });
  return loop.run();
}

}  // namespace ds::launch
