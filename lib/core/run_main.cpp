// The shared exit policy of the programs (run_main.h).
#include "lib/core/run_main.h"

#include <cstdio>
#include <exception>
#include <new>

#include "lib/core/error.h"

namespace ds {

int run_main(const char* prog, const std::function<int()>& body) {
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
