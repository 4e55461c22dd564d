// An execution stream handle passed to every op. On CPU it is empty and ops run
// synchronously; on CUDA `handle` is a cudaStream_t (kept as void* so that code
// outside cuda/ never includes CUDA headers).
#pragma once

namespace ds {

struct Stream {
  void* handle = nullptr;
};

}  // namespace ds
