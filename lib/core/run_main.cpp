// The shared exit policy of the programs (run_main.h).
#include "lib/core/run_main.h"

#include <signal.h>

#include <cstdio>
#include <exception>
#include <new>

#include "lib/core/error.h"

namespace ds {

namespace {

void on_file_size_limit(int) {}  // the write that crossed the limit fails with EFBIG instead

}  // namespace

int run_main(const char* prog, const std::function<int()>& body) {
  // A file size limit (ulimit -f) would kill the process with SIGXFSZ in the
  // middle of a write, leaving its temporaries behind. With a handler the write
  // fails with EFBIG and the usual error path removes them. A handler (not
  // SIG_IGN) is reset by exec, so programs dsrun starts keep the default.
  struct sigaction sa {};
  sa.sa_handler = on_file_size_limit;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGXFSZ, &sa, nullptr);
  try {
    return body();
  } catch (...) {
    std::fflush(stdout);  // what the program printed comes before its error line
    try {
      throw;
    } catch (const UserError& e) {
      std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "%s: error: out of host memory (an allocation failed); use a smaller model, batch or "
                   "input, or a machine with more memory\n", prog);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: internal error: %s\n", prog, e.what());
      return 2;
    } catch (...) {
      std::fprintf(stderr, "%s: internal error: an unknown exception\n", prog);
      return 2;
    }
  }
}

}  // namespace ds
