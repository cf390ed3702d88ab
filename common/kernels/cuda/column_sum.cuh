// column_sum.cuh — sums over the rows of an (N,C) matrix, one per column, deterministic and
// filling the GPU: what a bias gradient (dbias = sum_n dout[n,:]), layer norm's dw and db, and the
// fused GELU backward's bias gradient are. Used by kernels_matmul.cu, kernels_layernorm.cu and
// kernels_elementwise.cu.
//
// Why two passes. Columns are independent, so the plain kernel gives each block 32 columns and lets
// its 32 x 32 threads walk all N rows. For gpt2 (C = 768) that is 24 blocks: a 132-SM H200 runs
// them on 24 SMs and leaves the rest idle, each thread walking N/32 rows (256 at N = 8192). So the
// rows are cut into G chunks as well:
//   pass 1, grid (ceil(C/32), G), block (32, 32): block (x, g) sums chunk g of its 32 columns and
//           writes the 32 sums to partials[g][c] (fp32, in the kernels' scratch buffer);
//   pass 2, one thread per column: total = partials[0][c] + partials[1][c] + ... + partials[G-1][c],
//           added to the gradient once (one rounding in bf16, as on the CPU).
// A chunk is kColumnChunkRows = 256 rows, so at N = 8192 G = 32 and pass 1 runs 24 x 32 = 768
// blocks, about 6 per SM (and 96 x 32 for the MLP's 4C = 3072 columns); below 257 rows G = 1.
//
// Determinism. No atomics, and the order of every sum is fixed by N and C alone, never by the GPU
// (not its SM count, not how blocks are scheduled): within chunk g, thread (x, y) adds the rows
// n0 + y, n0 + y + 32, ... in increasing order; the 32 row groups are added in a fixed tree (y and
// y + 16, then y and y + 8, ..., y and y + 1); pass 2 adds the chunks in order g = 0, 1, ..., G-1.
// So the result is the same bits run after run, and on any GPU that runs the same binary (the
// same fused multiply-adds).
//
// The prologue. What is summed is not always the matrix itself: layer norm sums dout * norm and
// dout, the fused GELU backward sums the gradient it has just computed. The caller passes a small
// struct f with
//     __device__ void operator()(int n, int c, float (&v)[K]) const
// that produces the K values element (n, c) contributes (K sums are formed side by side). Pass 1
// calls it exactly once for every element, so it may also write an elementwise output.
#pragma once
#include "cuda_common.cuh"  // kWarpSize, ceil_div, scratch_buffer, load/store, NZ_CUDA_CHECK_LAUNCH

namespace nz {
namespace cuda {

constexpr int kColumnChunkRows = 256;  // rows per chunk in pass 1 (8 per thread)
constexpr int kMaxColumnChunks = 256;  // beyond 65536 rows the chunks grow instead of multiplying

// G, the number of row chunks for N rows: a function of N only (see above).
inline int column_sum_chunks(int N) {
  const int chunks = int(ceil_div(N, kColumnChunkRows));
  return chunks < kMaxColumnChunks ? chunks : kMaxColumnChunks;
}

// Where the K column sums go: out[k] (C) += sum of value k; a null out[k] is not written.
template <class T, int K>
struct ColumnSumOutputs {
  T* out[K];
};

// Pass 1. partials (K, G, C): partials[(k * G + g) * C + c] = sum over chunk g of value k of column c.
// 1024 threads a block: __launch_bounds__ holds the GPU compiler to the registers such a block may have
// (64 a thread), where without it a kernel using more would fail to launch.
template <int K, class Prologue>
__global__ void __launch_bounds__(kWarpSize * kWarpSize)
    column_partials_kernel(float* partials, Prologue f, int N, int C, int chunk_rows) {
  __shared__ float part[K][kWarpSize][kWarpSize + 1];  // +1: no bank conflicts down a column
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kWarpSize + tx;  // a warp reads 32 neighbouring columns of a row
  const int g = blockIdx.y, chunks = gridDim.y;
  const int n0 = g * chunk_rows, n1 = n0 + chunk_rows < N ? n0 + chunk_rows : N;
  float sum[K] = {};
  if (c < C)
    for (int n = n0 + ty; n < n1; n += kWarpSize) {
      float v[K];
      f(n, c, v);
      for (int k = 0; k < K; k++) sum[k] += v[k];
    }
  for (int k = 0; k < K; k++) part[k][ty][tx] = sum[k];
  __syncthreads();
  for (int half = kWarpSize / 2; half > 0; half /= 2) {  // the fixed tree over the 32 row groups
    if (ty < half)
      for (int k = 0; k < K; k++) part[k][ty][tx] += part[k][ty + half][tx];
    __syncthreads();
  }
  if (ty == 0 && c < C)
    for (int k = 0; k < K; k++) partials[(size_t(k) * chunks + g) * C + c] = part[k][0][tx];
}

// Pass 2. out[k][c] += the chunks' partial sums of column c, added in chunk order.
template <class T, int K>
__global__ void column_totals_kernel(ColumnSumOutputs<T, K> outs, const float* partials, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = 0; k < K; k++) {
    if (!outs.out[k]) continue;
    float total = 0.0f;
    for (int g = 0; g < chunks; g++) total += partials[(size_t(k) * chunks + g) * C + c];
    outs.out[k][c] = store<T>(load(outs.out[k][c]) + total);
  }
}

// outs.out[k] (C) += sum over n of value k of f(n, c): the two passes above. The partials live in
// the scratch buffer only between the two launches: K * G * C floats, 0.4 MB at most for gpt2 at
// N = 8192 (the fc bias, C = 3072).
template <class T, int K, class Prologue>
void add_column_sums(ColumnSumOutputs<T, K> outs, Prologue f, int N, int C) {
  if (N == 0 || C == 0) return;
  const int chunks = column_sum_chunks(N);
  const int chunk_rows = int(ceil_div(N, chunks));
  float* partials = static_cast<float*>(scratch_buffer(size_t(K) * chunks * C * sizeof(float)));
  const dim3 grid(unsigned(ceil_div(C, kWarpSize)), unsigned(chunks));
  column_partials_kernel<K, Prologue><<<grid, dim3(kWarpSize, kWarpSize)>>>(partials, f, N, C, chunk_rows);
  NZ_CUDA_CHECK_LAUNCH();
  const int block = 256;
  column_totals_kernel<T, K><<<unsigned(ceil_div(C, block)), block>>>(outs, partials, chunks, C);
  NZ_CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace nz
