// swap_blocks.h — the layout changes around ulysses' all-to-alls (ulysses/train.cpp), on the run's
// backend: a buffer read as (n0, n1) blocks of `block` bytes is written out as (n1, n0) blocks of
// the same bytes, i.e. the first two axes swapped, each block moved whole:
//   out[(j n0 + i) block .. +block) = in[(i n1 + j) block .. +block)   for i < n0, j < n1.
// Pure data movement: the same bytes on every backend, for any storage type.
//
// Ulysses' "my tokens, every head" -> "every token, my heads" is two of these: the token rows' head
// groups to the all-to-all's S slots ((B T/S parts, S, C/S) -> (S, B T/S parts, C/S)), and, after
// the exchange, the slots' tokens to their places in the sequence ((S, B, T/S row) -> (B, S, T/S row));
// the way back swaps them again in the other order.
#pragma once
#include <cstddef>

namespace nz {

namespace ref {
// the reference: one memcpy per block, in the order of the output (kernels/swap_blocks.cpp)
void swap_blocks(void* out, const void* in, size_t n0, size_t n1, size_t block);
}  // namespace ref
namespace cuda {
// on device memory: one thread per word of a block (cuda/kernels_swap_blocks.cu)
void swap_blocks(void* out, const void* in, size_t n0, size_t n1, size_t block);
}  // namespace cuda

namespace ops {
// out and in must not overlap. On the backend of the run (the GPU: device pointers).
void swap_blocks(void* out, const void* in, size_t n0, size_t n1, size_t block);
}  // namespace ops

}  // namespace nz
