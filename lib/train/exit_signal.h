// Megatron's --exit-signal-handler: SIGTERM (a scheduler's preemption notice,
// or dsrun's teardown) sets a flag that the training loop reads after each
// iteration; the trainer then saves a checkpoint and stops.
#pragma once

namespace ds {

// Installs the SIGTERM handler (once per process).
void install_exit_signal_handler();

// Has SIGTERM arrived since the handler was installed?
bool exit_signal_received();

}  // namespace ds
