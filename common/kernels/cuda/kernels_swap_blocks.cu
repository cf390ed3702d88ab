// kernels_swap_blocks.cu — swap_blocks (kernels/swap_blocks.h) on device memory: the (n0, n1)
// blocks of `block` bytes written out as (n1, n0). One thread per word of the output, in a
// grid-stride loop; the word is the widest of 4, 2 or 1 bytes that divides the block and both
// pointers' alignment (bf16 and fp16 blocks of an odd number of elements move as 2-byte words).
// It copies bytes and computes nothing, so its output is the CPU reference's, bit for bit.
#include <cstdint>

#include "cuda_common.cuh"         // grid_for, NZ_CUDA_CHECK_LAUNCH
#include "kernels/swap_blocks.h"

namespace nz {
namespace cuda {
namespace {

constexpr int kBlock = 256;

// out word (j n0 + i) w + k  =  in word (i n1 + j) w + k, where w = the words in a block
template <class W>
__global__ void swap_blocks_kernel(W* out, const W* in, size_t n0, size_t n1, size_t w) {
  const size_t total = n0 * n1 * w;
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < total; o += size_t(gridDim.x) * blockDim.x) {
    const size_t k = o % w, ji = o / w;  // word k of output block ji = j n0 + i
    const size_t i = ji % n0, j = ji / n0;
    out[o] = in[(i * n1 + j) * w + k];
  }
}

template <class W>
void launch(void* out, const void* in, size_t n0, size_t n1, size_t block) {
  const size_t w = block / sizeof(W), total = n0 * n1 * w;
  swap_blocks_kernel<W><<<grid_for(total, kBlock), kBlock>>>(static_cast<W*>(out), static_cast<const W*>(in), n0,
                                                             n1, w);
  NZ_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swap_blocks(void* out, const void* in, size_t n0, size_t n1, size_t block) {
  if (n0 == 0 || n1 == 0 || block == 0) return;
  const uintptr_t a = uintptr_t(out) | uintptr_t(in) | block;  // what every word must divide
  if (a % 4 == 0) launch<uint32_t>(out, in, n0, n1, block);
  else if (a % 2 == 0) launch<uint16_t>(out, in, n0, n1, block);
  else launch<uint8_t>(out, in, n0, n1, block);
}

}  // namespace cuda
}  // namespace nz
