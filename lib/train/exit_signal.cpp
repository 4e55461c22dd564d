#include "lib/train/exit_signal.h"

#include <csignal>

#include "lib/core/error.h"

namespace ds {
namespace {

volatile std::sig_atomic_t g_sigterm = 0;

void on_sigterm(int) { g_sigterm = 1; }

}  // namespace

void install_exit_signal_handler() {
  struct sigaction sa = {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  DS_CHECK(sigaction(SIGTERM, &sa, nullptr) == 0, "sigaction(SIGTERM) failed");
}

bool exit_signal_received() { return g_sigterm != 0; }

}  // namespace ds
