// kernels_decode.cu — the two ops of a KV-cached decode step that kernels.h does not have
// (decoder.h): the embedding of one position, one query row attending over the cache, and the
// dequantisation of an int8 unit (quant.h).
// The attention is the reference attention kernel's row pos (common/kernels/cuda/kernels_attention.cu),
// one warp per (b, h), with K and V read from the cache (B, Tc, C) instead of qkv.
#include "runtime/check.h"  // NZ_CHECK
#include "kernels/cuda/cuda_common.cuh"  // load/store, warp_sum, NZ_CUDA_CHECK_LAUNCH
#include "inference/decoder.h"
#include "inference/quant.h"          // kQuantBlock

namespace nz {
namespace decode_cuda {
namespace {

using cuda::kWarpSize;

// out[b] (C) = wte[tokens[b]] + wpe[pos]
template <class T>
__global__ void embedding_at_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int pos, int C,
                                    size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t b = i / C;
    const int c = int(i % C);
    out[i] = store<T>(load(wte[size_t(tokens[b]) * C + c]) + load(wpe[size_t(pos) * C + c]));
  }
}

// One warp per (b, h): scores of positions 0..pos in shared memory (Tc floats per warp).
template <class T>
__global__ void attention_at_kernel(T* out, const T* qkv, const T* kcache, const T* vcache, int pos, int B,
                                    int Tc, int C, int NH) {
  extern __shared__ float score_rows[];  // (warps per block, Tc)
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int bh = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (bh >= B * NH) return;  // whole warps only
  const int b = bh / NH, h = bh % NH, hs = C / NH;
  const float scale = 1.0f / sqrtf(float(hs));
  float* p = score_rows + size_t(warp) * Tc;
  const T* q = qkv + size_t(b) * 3 * C + size_t(h) * hs;
  const T* k = kcache + size_t(b) * Tc * C + size_t(h) * hs;
  const T* v = vcache + size_t(b) * Tc * C + size_t(h) * hs;
  float max_score = -INFINITY;
  for (int t2 = 0; t2 <= pos; t2++) {  // the scores, a warp dot product each
    float s = 0.0f;
    for (int i = lane; i < hs; i += kWarpSize) s += load(q[i]) * load(k[size_t(t2) * C + i]);
    s = cuda::warp_sum(s) * scale;
    if (lane == 0) p[t2] = s;
    max_score = fmaxf(max_score, s);
  }
  __syncwarp();
  float sum = 0.0f;
  for (int t2 = lane; t2 <= pos; t2 += kWarpSize) {
    const float e = expf(p[t2] - max_score);
    p[t2] = e;
    sum += e;
  }
  const float inv_sum = 1.0f / cuda::warp_sum(sum);
  for (int t2 = lane; t2 <= pos; t2 += kWarpSize) p[t2] *= inv_sum;
  __syncwarp();
  T* o = out + size_t(b) * C + size_t(h) * hs;  // lanes over channels, t2 in order
  for (int i = lane; i < hs; i += kWarpSize) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= pos; t2++) acc += p[t2] * load(v[size_t(t2) * C + i]);
    o[i] = store<T>(acc);
  }
}

// out[i] = q[i] · scale of its block of 64 (quant.h)
template <class T>
__global__ void dequantize_int8_kernel(T* out, const int8_t* q, const float* scales, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = store<T>(float(q[i]) * scales[i / kQuantBlock]);
}

}  // namespace

template <class T>
void dequantize_int8(T* out, const int8_t* q, const float* scales, size_t n) {
  if (n == 0) return;
  dequantize_int8_kernel<T><<<cuda::grid_for(n, 256), 256>>>(out, q, scales, n);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void embedding_at(T* out, const int* tokens, const T* wte, const T* wpe, int pos, int B, int C) {
  const size_t total = size_t(B) * C;
  if (total == 0) return;
  embedding_at_kernel<T><<<cuda::grid_for(total, 256), 256>>>(out, tokens, wte, wpe, pos, C, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void attention_at(T* out, const T* qkv, const T* kcache, const T* vcache, int pos, int B, int Tc, int C, int NH) {
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int warps = 4;
  const size_t smem = size_t(warps) * Tc * sizeof(float);  // 16 KB at Tc = 1024
  const unsigned blocks = unsigned(cuda::ceil_div(size_t(B) * NH, warps));
  attention_at_kernel<T><<<blocks, warps * kWarpSize, smem>>>(out, qkv, kcache, vcache, pos, B, Tc, C, NH);
  NZ_CUDA_CHECK_LAUNCH();
}

#define NZ_INSTANTIATE(T)                                                                 \
  template void dequantize_int8<T>(T*, const int8_t*, const float*, size_t);              \
  template void embedding_at<T>(T*, const int*, const T*, const T*, int, int, int);       \
  template void attention_at<T>(T*, const T*, const T*, const T*, int, int, int, int, int);
NZ_INSTANTIATE(float)
NZ_INSTANTIATE(bf16)
#undef NZ_INSTANTIATE

}  // namespace decode_cuda
}  // namespace nz
