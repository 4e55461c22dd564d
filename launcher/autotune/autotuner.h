// `dsrun --autotuning tune|run ... PROGRAM --config ds_config.json ...`: reads
// the config's `autotuning` section, prunes the search space with PROGRAM's
// memory estimate, measures experiments through dsrun itself, writes the
// results (summary, ds_config_optimal.json, cmd_optimal.txt) and with `run`
// then launches the best configuration. See docs/autotuning.md.
#pragma once
#include "launcher/options.h"

namespace ds::launch::autotune {

// argc/argv: dsrun's whole command line (the launcher flags are reused for
// every experiment). Returns dsrun's exit code; user errors are ds::UserError.
int autotune_main(const Options& o, int argc, char** argv);

}  // namespace ds::launch::autotune
