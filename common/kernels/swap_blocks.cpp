// swap_blocks.cpp — the CPU reference of swap_blocks.h, and the backend's choice.
#include "kernels/swap_blocks.h"

#include <cstring>  // memcpy

#include "runtime/device.h"  // current_device

namespace nz {

void ref::swap_blocks(void* out, const void* in, size_t n0, size_t n1, size_t block) {
  char* o = static_cast<char*>(out);
  const char* x = static_cast<const char*>(in);
  for (size_t j = 0; j < n1; j++)
    for (size_t i = 0; i < n0; i++) memcpy(o + (j * n0 + i) * block, x + (i * n1 + j) * block, block);
}

void ops::swap_blocks(void* out, const void* in, size_t n0, size_t n1, size_t block) {
#ifdef NZ_HAVE_CUDA
  if (current_device() == Device::CUDA) return cuda::swap_blocks(out, in, n0, n1, block);
#endif
  ref::swap_blocks(out, in, n0, n1, block);
}

}  // namespace nz
