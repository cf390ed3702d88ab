// cuda_common.cuh — what the CUDA kernel files share: launch sizes, the scratch buffer, and
// deterministic warp and block reductions.
//
// Storage types: kernels are templates over T = float or nz::bf16 and read/write through
// nz::load / nz::store (dtype.h, __host__ __device__ under nvcc): every value is loaded to float,
// the arithmetic is done in float, and the result is rounded to nearest even once when stored —
// exactly the CPU reference's rule. The two backends still differ in three ways, which is why the
// tests compare them within a tolerance and never bit for bit:
//  - summation order: warp-strided partial sums and butterflies, cuBLAS's own blocking;
//  - fused multiply-adds: nvcc contracts a * b + c into one FMA (one rounding instead of two) by
//    default in device code (--fmad=true); the Makefile's -ffp-contract=off reaches only the host
//    compiler, so the CPU rounds twice where the GPU rounds once. Except where a kernel's twin runs
//    on the CPU in a real run (AdamW and the gradient accumulation: offload's and infinity's host
//    optimizer): those are written with __fmul_rn / __fadd_rn, which nvcc never fuses, and give the
//    CPU's bits (the emulator fuses like nvcc, dev/emu.mk, so a kernel that forgets shows there);
//  - the math library: device expf, logf, tanhf, rsqrtf are CUDA's (a few ulp from the host libm's).
//
// Determinism: no kernel uses floating-point atomics. Every sum is either one thread's loop in a
// fixed order, or a reduction with a fixed shape (warp butterfly + fixed tree over warps) whose
// block size is a constant, so a kernel gives the same bits every run on the same GPU with the same
// binary (the same FMA choices). cuBLAS documents the same: bitwise run to run on GPUs of the same
// architecture and SM count with the same library version, on one stream (as here); another GPU
// model or cuBLAS version may pick another algorithm. NCCL's sums are not in rank order (comm.h): bitwise across runs with the
// same ranks and topology in practice, but NCCL does not promise it.
#pragma once
#include <cuda_runtime.h>  // __shfl_xor_sync, dim3

#include <cmath>    // INFINITY
#include <cstddef>

#include "cuda_check.h"  // NZ_CUDA_CHECK, NZ_CUDA_CHECK_LAUNCH
#include "kernels/dtype.h"       // nz::bf16, nz::load, nz::store
#include "kernels/kernels.h"     // the declarations this directory implements (nz::cuda::*)

namespace nz {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped so the grid size
// is a small int (each thread then handles several elements).
inline unsigned grid_for(size_t n, int block) {
  size_t g = ceil_div(n, size_t(block));
  const size_t cap = size_t(1) << 16;
  return unsigned(g < cap ? g : cap);
}

// A device buffer the kernels use for temporaries: sum_squares' per-block partial sums, the column
// sums' per-chunk partials (column_sum.cuh), flash attention's D, the hand-written attention
// backward's per-row sums, and the cuBLAS attention's scores of one batch element (NH*T*T fp32 plus
// as many storage-type elements: 75 MB for gpt2 at T = 1024 in bf16, the largest use).
// It grows on demand and is kept for the life of the process; every use is on the default stream,
// so consecutive uses never overlap. (runtime.cu; not tracked by the memory ledger: it shows up in
// the difference between the ledger and cudaMemGetInfo that the trainers print.)
void* scratch_buffer(size_t bytes);

// Sum over the 32 lanes of a warp. The xor butterfly adds the same pairs in the same order on every
// run, and since a + b == b + a exactly, every lane ends with the identical total.
template <class A>
__device__ inline A warp_sum(A v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over a 1-D block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// Each warp sums its lanes, then every warp sums the per-warp totals in the same fixed order.
template <class A>
__device__ inline A block_sum(A v) {
  __shared__ A warp_totals[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  A total = lane < num_warps ? warp_totals[lane] : A(0);
  total = warp_sum(total);
  __syncthreads();  // warp_totals may be reused by the caller's next block_sum
  return total;
}

// Same for the maximum.
__device__ inline float block_max(float v) {
  __shared__ float warp_maxes[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  if (lane == 0) warp_maxes[warp] = v;
  __syncthreads();
  float m = lane < num_warps ? warp_maxes[lane] : -INFINITY;
  m = warp_max(m);
  __syncthreads();
  return m;
}

}  // namespace cuda
}  // namespace nz
