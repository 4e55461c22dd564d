// DS_HOST_DEVICE: a function compiled for both the host and the device (by
// nvcc), or a plain inline function for the host compiler. For the few rules
// both backends must apply with the same bits (dropout masks, the optimizer
// step's gate).
#pragma once

#if defined(__CUDACC__)
#define DS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DS_HOST_DEVICE inline
#endif
