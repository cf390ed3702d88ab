// kernels_quantize.cu — the block quantizer of kernels/quantize.h on device memory: the same rule,
// the same packed layout, the same bits as the CPU loops of quantize.cpp (tests/zeropp/
// test_cuda_quantize.cpp holds them equal on the edge cases). Every step of the rule is one IEEE
// fp32 operation with no sum in it (a maximum, a division, a product, a rounding to the nearest
// even integer), so unlike the other kernels there is nothing for the GPU to do in another order:
//   absmax   the block's maximum of |x| (block_max: a maximum is exact in any order); a NaN or an
//            infinity makes it +inf, and the block gets scale NaN, codes 0 (the CPU's rule)
//   scale    absmax / qmax, one ulp lower if qmax * scale overflows (nextafterf)
//   code     clamp(rintf(x / scale), -qmax, qmax): rintf rounds half to even (not roundf)
#include <cfloat>   // FLT_MAX
#include <cstring>  // memcpy: the scales follow the codes, not always on a 4-byte boundary

#include "cuda_common.cuh"      // block_max, block_sum, grid_for, scratch_buffer
#include "kernels/quantize.h"   // BlockQuant, nz::quant_cuda
#include "runtime/check.h"      // NZ_CHECK
#include "runtime/device.h"     // copy_bytes

namespace nz {
namespace quant_cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline float scale_at(const uint8_t* scales, size_t b) {
  float s;
  memcpy(&s, scales + 4 * b, 4);
  return s;
}

// One value's code, as quantize.cpp's code_of: 0 when the scale is 0 or NaN.
__device__ inline int code_of(float x, float scale, int qmax) {
  if (!(scale > 0)) return 0;
  const float r = rintf(x / scale);  // ties to even
  return int(fminf(float(qmax), fmaxf(-float(qmax), r)));
}

// One CUDA block per quantization block (grid-stride over them). int8: a thread per value; int4: a
// thread per byte, values 2k (low nibble) and 2k+1 (high nibble; 0 past the end of x).
template <class T>
__global__ void quantize_kernel(const T* x, size_t n, size_t block, int bits, uint8_t* codes,
                                uint8_t* scales) {
  const int qmax = (1 << (bits - 1)) - 1;
  const size_t nb = (n + block - 1) / block;
  for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const size_t begin = b * block, end = begin + block < n ? begin + block : n;
    float m = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = load(x[i]);
      m = fabsf(v) <= FLT_MAX ? fmaxf(m, fabsf(v)) : INFINITY;  // a NaN or inf: the block has no scale
    }
    const float absmax = cuda::block_max(m);  // every thread gets it
    float scale = NAN;
    if (absmax != INFINITY) {
      scale = absmax / float(qmax);
      if (float(qmax) * scale > FLT_MAX) scale = nextafterf(scale, 0.0f);
    }
    if (threadIdx.x == 0) memcpy(scales + 4 * b, &scale, 4);
    if (bits == 8) {
      for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
        codes[i] = uint8_t(int8_t(code_of(load(x[i]), scale, qmax)));
    } else {
      for (size_t i = begin + 2 * threadIdx.x; i < end; i += 2 * size_t(blockDim.x)) {
        const int lo = code_of(load(x[i]), scale, qmax);
        const int hi = i + 1 < end ? code_of(load(x[i + 1]), scale, qmax) : 0;
        codes[i / 2] = uint8_t((uint8_t(lo) & 0xF) | ((uint8_t(hi) & 0xF) << 4));
      }
    }
  }
}

// The blocks whose scale is NaN (one CUDA block): the count quantize_blocks returns.
__global__ void count_nan_scales_kernel(const uint8_t* scales, size_t nb, unsigned* count) {
  unsigned mine = 0;
  for (size_t b = threadIdx.x; b < nb; b += blockDim.x) mine += scale_at(scales, b) != scale_at(scales, b) ? 1u : 0u;  // NaN
  const unsigned total = cuda::block_sum(mine);
  if (threadIdx.x == 0) *count = total;
}

// out[i] = float(code i) * scale of its block, stored in T: one product, one rounding.
template <class T>
__global__ void dequantize_kernel(const uint8_t* codes, const uint8_t* scales, size_t n, size_t block,
                                  int bits, T* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    int q;
    if (bits == 8) {
      q = int8_t(codes[i]);
    } else {
      const uint8_t nib = (i % 2 == 0) ? (codes[i / 2] & 0xF) : (codes[i / 2] >> 4);
      q = int8_t(uint8_t(nib << 4)) >> 4;  // sign-extend the nibble
    }
    out[i] = store<T>(float(q) * scale_at(scales, i / block));
  }
}

}  // namespace

template <class T>
size_t quantize_packed(const BlockQuant& q, const T* x, size_t n, void* packed) {
  NZ_CHECK(q.bits == 8 || q.bits == 4, "quantize: %d bits, expected 8 or 4", q.bits);
  NZ_CHECK(q.block >= 1 && (q.bits == 8 || q.block % 2 == 0),
           "quantize on the GPU: int4 blocks of %zu values, expected an even number", q.block);
  if (n == 0) return 0;
  uint8_t* codes = static_cast<uint8_t*>(packed);
  uint8_t* scales = codes + q.code_bytes(n);
  const size_t nb = q.blocks(n);
  quantize_kernel<T><<<cuda::grid_for(nb, 1), kThreads>>>(x, n, q.block, q.bits, codes, scales);
  NZ_CUDA_CHECK_LAUNCH();
  unsigned* count = static_cast<unsigned*>(cuda::scratch_buffer(sizeof(unsigned)));
  count_nan_scales_kernel<<<1, kThreads>>>(scales, nb, count);
  NZ_CUDA_CHECK_LAUNCH();
  unsigned bad = 0;
  copy_bytes(&bad, Location::Host, count, Location::Device, sizeof bad);
  return bad;
}

template <class T>
void dequantize_packed(const BlockQuant& q, const void* packed, size_t n, T* out) {
  NZ_CHECK(q.bits == 8 || q.bits == 4, "dequantize: %d bits, expected 8 or 4", q.bits);
  if (n == 0) return;
  const uint8_t* codes = static_cast<const uint8_t*>(packed);
  dequantize_kernel<T><<<cuda::grid_for(n, kThreads), kThreads>>>(codes, codes + q.code_bytes(n), n, q.block,
                                                                   q.bits, out);
  NZ_CUDA_CHECK_LAUNCH();
}

#define NZ_INSTANTIATE(T)                                                                  \
  template size_t quantize_packed<T>(const BlockQuant&, const T*, size_t, void*);         \
  template void dequantize_packed<T>(const BlockQuant&, const void*, size_t, T*);
NZ_INSTANTIATE(float)
NZ_INSTANTIATE(bf16)
NZ_INSTANTIATE(f16)
#undef NZ_INSTANTIATE

}  // namespace quant_cuda
}  // namespace nz
