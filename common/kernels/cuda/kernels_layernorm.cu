// kernels_layernorm.cu — layer normalization over the last axis, forward and backward.
//   norm = (x - mean) * rstd,   rstd = 1 / sqrt(var + 1e-5),   out = norm * w + b
// Rows are independent, so one warp handles one row: its 32 lanes stride over the C channels and
// combine their partial sums with the warp butterfly (warp_sum), a fixed order. The gradients of w
// and b are sums over rows instead: column_sum.cuh. Two fusions with the residual connection around
// a layer norm save a pass over memory each: residual_layernorm_forward (the sum, then its layer
// norm) and layernorm_backward_residual (the layer norm's dinp plus the skip path's gradient).
#include "column_sum.cuh"   // add_column_sums: dw and db
#include "cuda_common.cuh"  // load/store, warp_sum, NZ_CUDA_CHECK_LAUNCH

namespace nz {
namespace cuda {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kWarpsPerBlock = 8;  // rows per block of the row kernels

// One row of layer norm, by the 32 lanes of a warp: y (C) = (x - m) * s * w + b (b may be null), and
// lane 0 saves m and s (mean, rstd: null pointers mean "not saved", e.g. for inference). lane_sum is
// this lane's sum of x[c] over its channels c = lane, lane + 32, ...: the caller forms it while it
// reads the row for the first time (the fused kernel below, while it writes the row).
template <class T>
__device__ void layernorm_row(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int C,
                              int lane, float lane_sum) {
  // Two passes (mean, then the mean of squared deviations): no cancellation, unlike E[x^2]-E[x]^2.
  const float m = warp_sum(lane_sum) / C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = load(x[c]) - m;
    sq += d * d;
  }
  const float var = warp_sum(sq) / C;
  const float s = 1.0f / sqrtf(var + kLayerNormEps);
  for (int c = lane; c < C; c += kWarpSize) {
    float v = (load(x[c]) - m) * s * load(w[c]);
    if (b) v += load(b[c]);
    y[c] = store<T>(v);
  }
  if (lane == 0) {
    if (mean) *mean = m;
    if (rstd) *rstd = s;
  }
}

// inp, out (N,C); mean, rstd (N) saved for the backward; b may be null.
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* w,
                                         const T* b, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;  // the same for the whole warp, so the shuffles below stay complete
  const T* x = inp + size_t(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += load(x[c]);
  layernorm_row(out + size_t(row) * C, mean ? mean + row : nullptr, rstd ? rstd + row : nullptr, x, w, b, C,
                lane, sum);
}

// Fused: res (N,C) = a + b rounded to T (res may alias a or b), then out = layernorm(res). One warp
// per row reads a and b once: each lane writes its channels of res and sums them as it goes, and
// the layer norm's two later passes read back those same channels, which this lane wrote itself
// (from its cache, rather than a second kernel reading the whole of res from memory).
template <class T>
__global__ void residual_layernorm_forward_kernel(T* res, T* out, float* mean, float* rstd, const T* a,
                                                  const T* b, const T* w, const T* bias, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t at = size_t(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const T r = store<T>(load(a[at + c]) + load(b[at + c]));
    res[at + c] = r;
    sum += load(r);  // the stored (rounded) value, which the layer norm reads
  }
  layernorm_row(out + at, mean ? mean + row : nullptr, rstd ? rstd + row : nullptr, res + at, w, bias, C,
                lane, sum);
}

// dinp (N,C), overwritten:   with g = w * dout,
//   dinp = dskip + (g - mean_c(g) - norm * mean_c(g * norm)) * rstd
// (the two means are the gradient flowing through the row's mean and variance). dskip, the skip
// connection's gradient, may be null; the layer norm's part is rounded to T before it is added, as
// when it was stored and added by residual_forward (the CPU's rule).
template <class T>
__global__ void layernorm_backward_input_kernel(T* dinp, const T* dskip, const T* dout, const T* inp,
                                                const T* w, const float* mean, const float* rstd, int N,
                                                int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  const T* dy = dout + size_t(row) * C;
  const float m = mean[row], s = rstd[row];

  float g_sum = 0.0f, g_norm_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (load(x[c]) - m) * s;
    const float g = load(w[c]) * load(dy[c]);
    g_sum += g;
    g_norm_sum += g * norm;
  }
  const float g_mean = warp_sum(g_sum) / C;
  const float g_norm_mean = warp_sum(g_norm_sum) / C;

  T* dx = dinp + size_t(row) * C;
  const T* skip = dskip ? dskip + size_t(row) * C : nullptr;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (load(x[c]) - m) * s;
    const float g = load(w[c]) * load(dy[c]);
    const T d = store<T>((g - g_mean - norm * g_norm_mean) * s);
    dx[c] = skip ? store<T>(load(skip[c]) + load(d)) : d;
  }
}

// dw (C) += sum_n dout * norm,   db (C) += sum_n dout   (either may be null).
// Sums over rows, one per channel: the two-pass column sums of column_sum.cuh (enough blocks to fill
// the GPU, the same bits every run), with this prologue giving each element's two terms.
template <class T>
struct LayerNormParamTerms {
  const T* dout;
  const T* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(int n, int c, float (&v)[2]) const {
    const float dy = load(dout[size_t(n) * C + c]);
    const float norm = (load(inp[size_t(n) * C + c]) - mean[n]) * rstd[n];
    v[0] = dy * norm;  // dw
    v[1] = dy;         // db
  }
};

}  // namespace

template <class T>
void layernorm_forward(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* inp, const T* w, const T* b,
                       int N, int C) {
  if (N == 0) return;
  const unsigned blocks = unsigned(ceil_div(N, kWarpsPerBlock));
  layernorm_forward_kernel<T><<<blocks, kWarpsPerBlock * kWarpSize>>>(out, mean, rstd, inp, w, b, N, C);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void residual_layernorm_forward(T* res, T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* a, const T* b,
                                const T* w, const T* bias, int N, int C) {
  if (N == 0) return;
  const unsigned blocks = unsigned(ceil_div(N, kWarpsPerBlock));
  residual_layernorm_forward_kernel<T><<<blocks, kWarpsPerBlock * kWarpSize>>>(res, out, mean, rstd, a, b, w,
                                                                                bias, N, C);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_backward_residual(T* dinp, T* dw, T* db, const T* dskip, const T* dout, const T* inp,
                                 const T* w, const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  if (N == 0 || C == 0) return;
  if (dinp) {
    const unsigned blocks = unsigned(ceil_div(N, kWarpsPerBlock));
    layernorm_backward_input_kernel<T><<<blocks, kWarpsPerBlock * kWarpSize>>>(dinp, dskip, dout, inp, w,
                                                                              mean, rstd, N, C);
    NZ_CUDA_CHECK_LAUNCH();
  }
  if (dw || db)
    add_column_sums(ColumnSumOutputs<T, 2>{{dw, db}}, LayerNormParamTerms<T>{dout, inp, mean, rstd, C}, N, C);
}

template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  layernorm_backward_residual(dinp, dw, db, static_cast<const T*>(nullptr), dout, inp, w, mean, rstd, N, C);
}

// explicit instantiations: kernel_table.inc's entries with cuda file layernorm (float, bf16, fp16)
#define NZ_INSTANTIATE_CUDA_layernorm
#include "kernels/kernel_instantiate.inc"

}  // namespace cuda
}  // namespace nz
