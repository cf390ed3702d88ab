// cuda_pipeline.h — nz_emu: CUDA's asynchronous global->shared copies (cp.async on sm_80 and newer),
// the primitives of <cuda_pipeline.h> that the flash attention kernels use, emulated on the CPU. See
// cuda_runtime.h in this directory for what the emulator is.
//
//   __pipeline_memcpy_async(dst, src, n)  queue a copy of n = 4, 8 or 16 bytes from global memory to
//                                         shared memory (both n-byte aligned, as a GPU requires)
//   __pipeline_commit()                   close the thread's queued copies into a group
//   __pipeline_wait_prior(k)              wait until at most the k most recent groups are in flight
//
// Honest about the asynchrony: a copy is performed at the wait that covers it, not at the issue,
// and only for the thread that waits. A thread that reads its tile before waiting for it reads what
// the shared memory held before (the previous tile of a double buffer, or the 0xFF poison of a new
// block), and a thread that reads another thread's copies without a __syncthreads after that
// thread's wait may read them before they land (dev/emu/selftest.cu, async_missing_wait). Copies
// never waited for are dropped when the thread exits. The source is read at the wait too: a kernel
// must not write it between the issue and the wait (on a GPU the bytes copied would be undefined).
#pragma once
#include <cstddef>

#include "cuda_runtime.h"

namespace nz_emu {
void pipeline_copy(void* dst, const void* src, size_t bytes, size_t zfill);  // emu.cpp
void pipeline_commit();
void pipeline_wait_prior(size_t prior);
}  // namespace nz_emu

// always_inline: the return addresses the checks record are then in the kernel, not here
__attribute__((always_inline)) inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size_and_align, size_t zfill = 0) {
  nz_emu::pipeline_copy(dst, src, size_and_align, zfill);
}
inline void __pipeline_commit() { nz_emu::pipeline_commit(); }
__attribute__((always_inline)) inline void __pipeline_wait_prior(size_t prior) { nz_emu::pipeline_wait_prior(prior); }
