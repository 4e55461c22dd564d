// Containment of a job's processes against the death of dsrun itself.
// run_guarded(fn) forks: the parent stays a thin guard (the pid the user and
// the shell see), the child (the worker) runs fn, i.e. the head and/or the
// agent that starts and supervises the ranks. Both are child subreapers, so a
// process that leaves its rank's group (setsid) and loses its parent is
// adopted by the nearest of them instead of init.
//  - guard SIGKILLed: the worker gets PR_SET_PDEATHSIG=SIGTERM, tears the job
//    down as on Ctrl-C and kills every process it adopted;
//  - worker SIGKILLed: the ranks die with it (their own PDEATHSIG) and whatever
//    they started is adopted by the guard, which kills it and exits 137.
// The guard forwards SIGINT/SIGTERM/SIGHUP sent to it with kill(); signals from
// the terminal reach the worker directly (same process group).
#pragma once
#include <functional>

namespace ds::launch {

// Returns fn's exit code (in the guard: the worker's, or 128+signal).
int run_guarded(const std::function<int()>& fn);

// The pid that stands for this dsrun process: the guard's in a worker (what
// the user and --save_pid see), else this process's.
int guard_pid();

// Kills (SIGKILL) and reaps every process adopted by this one, again and again
// until none is left (killing one may orphan its own children to us) or about
// two seconds passed. Returns how many were killed.
int kill_all_adopted();

}  // namespace ds::launch
