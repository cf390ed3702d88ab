// kernels_matmul.cu — the linear layer on the GPU: matmul_forward and matmul_backward, dispatching
// on --kernels (nz::kernels(), kernels.h) to the tiled shared-memory kernel below (reference) or
// cuBLAS (matmul_cublas.cu: fast, fp32 accumulation, no TF32); the bias kernels are shared by both.
// Both compute every product in fp32 and round once when storing, so they agree within rounding.
#include "column_sum.cuh"   // add_column_sums: the bias gradient
#include "cuda_common.cuh"  // load/store, NZ_CUDA_CHECK_LAUNCH, kernels.h (nz::kernels)
#include "matmul_cublas.h"  // cublas_matmul_forward, cublas_matmul_dinp, cublas_matmul_dweight

namespace nz {
namespace cuda {

namespace {

// ---- begin tiled matmul ----
// Y (M,N) = X (M,K) · Z (K,N), one 32x32 tile of Y per block.
//
// A plain kernel would read every element of X and Z from global memory N and M times. Here a
// block stages a 32x32 tile of X and a 32x32 tile of Z in shared memory, and every thread reads
// them from there 32 times: global traffic drops by the tile size. The block walks along K one tile
// pair at a time. A block has 32 x 8 threads; thread (tx,ty) computes the 4 outputs of column tx in
// rows ty, ty+8, ty+16, ty+24 of the tile, so each value read from the Z tile is used 4 times.
//
// X and Z are read through (row, column) strides, so one kernel serves all three products of a
// linear layer without transposing anything in memory:
//   forward  out  (N,OC)  = inp (N,C)   · w^T   X(m,k) = inp[m*C + k]    Z(k,n) = w[n*C + k]
//   backward dinp (N,C)   = dout (N,OC) · w     X(m,k) = dout[m*OC + k]  Z(k,n) = w[k*C + n]
//   backward dw   (OC,C) += dout^T      · inp   X(m,k) = dout[k*OC + m]  Z(k,n) = inp[k*C + n]
// Edges: tiles that hang over M, N or K are padded with zeros, so any size works.
// Each output is one thread's sum over k in increasing order: the same bits every run.
constexpr int kTile = 32;
constexpr int kTileRowsPerPass = 8;                         // blockDim.y
constexpr int kRowsPerThread = kTile / kTileRowsPerPass;    // 4

struct Strided {  // element (r, c) of a matrix lives at ptr[r * row_stride + c * col_stride]
  long row_stride, col_stride;
};

// Launched with kTile x kTileRowsPerPass threads: the bound lets the GPU's compiler keep the
// registers to what such a block may have (tests/cuda/ptxas_check.sh).
template <class T>
__global__ void __launch_bounds__(kTile * kTileRowsPerPass)
    matmul_tiled_kernel(T* Y, const T* X, Strided xs, const T* Z, Strided zs, const T* bias, int M, int N, int K,
                        bool accumulate) {
  // +1 column: threads of a warp that write down a column of the tile hit different memory banks.
  __shared__ float Xt[kTile][kTile + 1];  // Xt[m][k] = X(m0 + m, k0 + k)
  __shared__ float Zt[kTile][kTile + 1];  // Zt[k][n] = Z(k0 + k, n0 + n)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;

  float acc[kRowsPerThread] = {};
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Stage the two tiles (each thread loads 4 elements of each). Consecutive threads (tx) should
    // read consecutive addresses, so tx runs along whichever index is contiguous in memory.
    for (int r = ty; r < kTile; r += kTileRowsPerPass) {
      const bool x_k_contiguous = xs.col_stride == 1;
      const int xm = x_k_contiguous ? r : tx, xk = x_k_contiguous ? tx : r;
      const int m = m0 + xm, kx = k0 + xk;
      Xt[xm][xk] = (m < M && kx < K) ? load(X[m * xs.row_stride + kx * xs.col_stride]) : 0.0f;

      const bool z_n_contiguous = zs.col_stride == 1;
      const int zk = z_n_contiguous ? r : tx, zn = z_n_contiguous ? tx : r;
      const int kz = k0 + zk, n = n0 + zn;
      Zt[zk][zn] = (kz < K && n < N) ? load(Z[kz * zs.row_stride + n * zs.col_stride]) : 0.0f;
    }
    __syncthreads();  // the tiles are complete
    for (int k = 0; k < kTile; k++) {
      const float z = Zt[k][tx];
      for (int i = 0; i < kRowsPerThread; i++) acc[i] += Xt[ty + i * kTileRowsPerPass][k] * z;
    }
    __syncthreads();  // everyone is done with the tiles before they are overwritten
  }

  const int n = n0 + tx;
  for (int i = 0; i < kRowsPerThread; i++) {
    const int m = m0 + ty + i * kTileRowsPerPass;
    if (m >= M || n >= N) continue;
    float y = acc[i];
    if (bias) y += load(bias[n]);
    T* dst = Y + long(m) * N + n;
    if (accumulate) y += load(*dst);
    *dst = store<T>(y);
  }
}

template <class T>
void matmul_tiled(T* Y, const T* X, Strided xs, const T* Z, Strided zs, const T* bias, int M, int N,
                  int K, bool accumulate) {
  if (M == 0 || N == 0) return;
  const dim3 block(kTile, kTileRowsPerPass);
  const dim3 grid(unsigned(ceil_div(N, kTile)), unsigned(ceil_div(M, kTile)));
  matmul_tiled_kernel<T><<<grid, block>>>(Y, X, xs, Z, zs, bias, M, N, K, accumulate);
  NZ_CUDA_CHECK_LAUNCH();
}
// ---- end tiled matmul ----

// out (N,OC) = bias broadcast over the rows; cuBLAS then adds inp·w^T to it (beta = 1), so the sum
// is rounded once, as in the tiled kernel.
template <class T>
__global__ void broadcast_bias_kernel(T* out, const T* bias, int N, int OC) {
  const size_t total = size_t(N) * OC;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// dbias (OC) += sum over rows of dout (N,OC): the column sums of column_sum.cuh (two passes, so
// that the GPU is full; the same bits every run), of dout itself.
template <class T>
struct DoutValue {
  const T* dout;
  int OC;
  __device__ void operator()(int n, int o, float (&v)[1]) const { v[0] = load(dout[size_t(n) * OC + o]); }
};

}  // namespace

template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  if (kernels() == Kernels::Reference) {
    matmul_tiled(out, inp, Strided{C, 1}, w, Strided{1, C}, bias, N, OC, C, false);
    return;
  }
  if (bias) {
    broadcast_bias_kernel<T><<<grid_for(size_t(N) * OC, 256), 256>>>(out, bias, N, OC);
    NZ_CUDA_CHECK_LAUNCH();
  }
  cublas_matmul_forward(out, inp, w, N, C, OC, /*accumulate=*/bias != nullptr);
}

template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C,
                     int OC) {
  if (N == 0) return;  // nothing flows back; weight gradients are unchanged
  const bool tiled = kernels() == Kernels::Reference;
  if (dinp) {  // dinp (N,C) = dout (N,OC) · w (OC,C)
    if (tiled) matmul_tiled(dinp, dout, Strided{OC, 1}, w, Strided{C, 1}, (const T*)nullptr, N, C, OC, false);
    else cublas_matmul_dinp(dinp, dout, w, N, C, OC);
  }
  if (dw) {  // dw (OC,C) += dout^T (OC,N) · inp (N,C)
    if (tiled) matmul_tiled(dw, dout, Strided{1, OC}, inp, Strided{C, 1}, (const T*)nullptr, OC, C, N, true);
    else cublas_matmul_dweight(dw, dout, inp, N, C, OC);
  }
  if (dbias) add_column_sums(ColumnSumOutputs<T, 1>{{dbias}}, DoutValue<T>{dout, OC}, N, OC);
}

// explicit instantiations: kernel_table.inc's entries with cuda file matmul (float, bf16, fp16)
#define NZ_INSTANTIATE_CUDA_matmul
#include "kernels/kernel_instantiate.inc"

}  // namespace cuda
}  // namespace nz
