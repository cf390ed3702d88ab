// cuda_check.h — check every CUDA runtime call; a failure names the file, the line, the call and
// CUDA's own explanation, then aborts the whole MPI job through nz::fatal (check.h).
#pragma once
#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorName, cudaGetErrorString, cudaGetLastError

#include "runtime/check.h"  // nz::fatal

#define NZ_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    cudaError_t nz_err_ = (call);                                                            \
    if (nz_err_ != cudaSuccess)                                                              \
      ::nz::fatal(__FILE__, __LINE__, "CUDA error %s (%s) in %s", cudaGetErrorName(nz_err_), \
                  cudaGetErrorString(nz_err_), #call);                                       \
  } while (0)

// After a kernel launch: a bad launch configuration (grid of 0 blocks, too much shared memory)
// is only reported by cudaGetLastError. Errors inside the kernel surface at the next synchronizing
// call, which is checked too.
#define NZ_CUDA_CHECK_LAUNCH() NZ_CUDA_CHECK(cudaGetLastError())
