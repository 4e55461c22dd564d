// token_gather / token_scatter on the CPU (lib/ops/op_args.h, TokenRowsArgs):
// row copies, any float dtype (the bytes move as they are).
#include <cstring>

#include "lib/core/error.h"
#include "lib/cpu/cpu_ops.h"

namespace ds::cpu {
namespace {

// Copies row (b, index[b, j]) of full to or from row (b, j) of part.
void token_rows(const TokenRowsArgs& a, bool gather) {
  const int64_t B = a.full.size(0), T = a.full.size(1), C = a.full.size(2), R = a.index.size(1);
  const int64_t row = C * static_cast<int64_t>(dtype_size(a.full.dtype()));
  auto* full = static_cast<char*>(a.full.raw());
  auto* part = static_cast<char*>(a.part.raw());
  const int32_t* ix = a.index.data<int32_t>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < R; ++j) {
      char* f = full + (b * T + ix[b * R + j]) * row;
      char* p = part + (b * R + j) * row;
      if (gather)
        std::memcpy(p, f, static_cast<size_t>(row));
      else
        std::memcpy(f, p, static_cast<size_t>(row));
    }
}

}  // namespace

void token_gather(const TokenRowsArgs& a, const Stream&) { token_rows(a, true); }
void token_scatter(const TokenRowsArgs& a, const Stream&) { token_rows(a, false); }

}  // namespace ds::cpu
