// kernels_attention.cu — causal multi-head self-attention, forward and backward, as simple correct
// kernels (no flash attention): the full (T,T) probability matrix is materialized, as the CPU
// reference does, and one warp handles one row (or one column) of it.
//
// Layouts: qkv (B,T,3C) = [q | k | v] along the last axis, head h of each at channels
// h*hs .. h*hs+hs-1 (hs = C/NH); att (B,NH,T,T); out (B,T,C) with head h at channels h*hs...
//   scores[t][t2] = q[t]·k[t2] / sqrt(hs)   for t2 <= t (causal)
//   att[t][t2]    = softmax over t2 of scores[t]      (0 above the diagonal)
//   out[t]        = sum_t2 att[t][t2] v[t2]
//
// Two implementations, chosen with --kernels (nz::kernels(), kernels.h):
//   reference — the hand-written kernels below: one warp per row (or column), every product a warp
//            dot product. Simple to read, but latency-bound: slow at long sequences.
//   fast      — (the default) the four products as batched cuBLAS GEMMs on tensor cores, with only
//            the causal softmax and its backward as kernels (the end of this file). The scores are
//            computed for the whole (T,T) square, so half the product is wasted; still far faster.
//            With --attention flash instead: kernels_flash_attention.cu, no (T,T) matrix at all.
#include "cuda_common.cuh"      // load/store, warp_sum, warp_max, scratch_buffer, NZ_CUDA_CHECK_LAUNCH
#include "flash_attention.h"    // flash_attention_forward, flash_attention_backward
#include "matmul_cublas.h"      // cublas_gemm_batched

namespace nz {
namespace cuda {
namespace {

constexpr int kMaxHeadSize = 256;                              // hs limit of the backward kernel
constexpr int kHeadChunks = kMaxHeadSize / kWarpSize;          // per-lane accumulators there
constexpr size_t kMaxRowSmemBytes = 48 * 1024;                 // default dynamic shared memory limit

// Pointers to head h of position t of batch b in qkv (B,T,3C): which = 0 (q), 1 (k), 2 (v).
template <class T>
__device__ inline const T* qkv_head(const T* qkv, int b, int t, int h, int which, int Tn, int C, int hs) {
  return qkv + (size_t(b) * Tn + t) * 3 * C + size_t(which) * C + size_t(h) * hs;
}

// x·y over n elements by a whole warp: lanes stride over the elements, then the butterfly.
// Every lane gets the same value, and the same call always gives the same bits.
template <class T>
__device__ inline float warp_dot(const T* x, const T* y, int n) {
  const int lane = threadIdx.x % kWarpSize;
  float sum = 0.0f;
  for (int i = lane; i < n; i += kWarpSize) sum += load(x[i]) * load(y[i]);
  return warp_sum(sum);
}

// One warp per row (b,h,t) of att. The row's scores live in shared memory (Tn floats per warp).
template <class T>
__global__ void attention_forward_kernel(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  extern __shared__ float row_buffers[];  // (warps per block, Tn)
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps_per_block = blockDim.x / kWarpSize;
  const size_t row = size_t(blockIdx.x) * warps_per_block + warp;  // ((b*NH + h)*Tn + t)
  if (row >= size_t(B) * NH * Tn) return;  // whole warps only: the shuffles stay complete
  const int t = int(row % Tn), h = int(row / Tn % NH), b = int(row / (size_t(Tn) * NH));
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(float(hs));
  float* p = row_buffers + size_t(warp) * Tn;
  const T* q = qkv_head(qkv, b, t, h, 0, Tn, C, hs);

  // 1. scores for t2 = 0..t, and their maximum (every lane holds the same values)
  float max_score = -INFINITY;
  for (int t2 = 0; t2 <= t; t2++) {
    const float s = warp_dot(q, qkv_head(qkv, b, t2, h, 1, Tn, C, hs), hs) * scale;
    if (lane == 0) p[t2] = s;
    max_score = fmaxf(max_score, s);
  }
  __syncwarp();  // p[] written by lane 0 is read by all lanes below

  // 2. exponentials (shifted by the maximum so none overflows) and their sum
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) {
    const float e = expf(p[t2] - max_score);
    p[t2] = e;
    sum += e;
  }
  const float inv_sum = 1.0f / warp_sum(sum);

  // 3. probabilities, saved in att. p keeps them in fp32 (not rounded to bf16) for the weighted
  //    sum below, as the CPU reference does.
  T* att_row = att + row * Tn;
  for (int t2 = lane; t2 < Tn; t2 += kWarpSize) {
    if (t2 <= t) {
      p[t2] *= inv_sum;
      att_row[t2] = store<T>(p[t2]);
    } else {
      att_row[t2] = store<T>(0.0f);  // the future is masked
    }
  }
  __syncwarp();

  // 4. out[t] = sum_t2 att[t][t2] v[t2]: lanes over the head's channels, t2 in order
  T* o = out + (size_t(b) * Tn + t) * C + size_t(h) * hs;
  for (int i = lane; i < hs; i += kWarpSize) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += p[t2] * load(qkv_head(qkv, b, t2, h, 2, Tn, C, hs)[i]);
    o[i] = store<T>(acc);
  }
}

// Backward. With datt[t][t2] = dout[t]·v[t2] and the softmax backward
//   dscore[t][t2] = att[t][t2] * (datt[t][t2] - rowsum[t]),   rowsum[t] = sum_j att[t][j] datt[t][j]
// the gradients are
//   dq[t]  = scale * sum_{t2 <= t} dscore[t][t2] k[t2]      (a sum along row t)
//   dk[t2] = scale * sum_{t >= t2} dscore[t][t2] q[t]       (a sum down column t2)
//   dv[t2] =         sum_{t >= t2} att[t][t2]    dout[t]    (a sum down column t2)
// Adding into dk, dv from every row would need atomics (order-dependent bits). Instead two kernels:
// one warp per ROW computes rowsum[t] and dq[t]; then one warp per COLUMN recomputes
// datt[t][t2] (the same warp_dot, so the same bits) and sums dk[t2], dv[t2] over t in order.

// Kernel 1: one warp per row (b,h,t). Writes dq (overwrite) and rowsum (B,NH,T) to scratch.
template <class T>
__global__ void attention_backward_rows_kernel(T* dqkv, float* rowsums, const T* dout, const T* qkv,
                                               const T* att, int B, int Tn, int C, int NH) {
  extern __shared__ float row_buffers[];  // (warps per block, Tn): datt, then dscore
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps_per_block = blockDim.x / kWarpSize;
  const size_t row = size_t(blockIdx.x) * warps_per_block + warp;
  if (row >= size_t(B) * NH * Tn) return;
  const int t = int(row % Tn), h = int(row / Tn % NH), b = int(row / (size_t(Tn) * NH));
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(float(hs));
  float* d = row_buffers + size_t(warp) * Tn;
  const T* dout_t = dout + (size_t(b) * Tn + t) * C + size_t(h) * hs;
  const T* att_row = att + row * Tn;

  for (int t2 = 0; t2 <= t; t2++) {  // datt[t][t2]
    const float datt = warp_dot(dout_t, qkv_head(qkv, b, t2, h, 2, Tn, C, hs), hs);
    if (lane == 0) d[t2] = datt;
  }
  __syncwarp();
  float partial = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) partial += load(att_row[t2]) * d[t2];
  const float rowsum = warp_sum(partial);
  if (lane == 0) rowsums[row] = rowsum;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) d[t2] = load(att_row[t2]) * (d[t2] - rowsum);
  __syncwarp();

  T* dq = dqkv + (size_t(b) * Tn + t) * 3 * C + size_t(h) * hs;
  for (int i = lane; i < hs; i += kWarpSize) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += d[t2] * load(qkv_head(qkv, b, t2, h, 1, Tn, C, hs)[i]);
    dq[i] = store<T>(acc * scale);
  }
}

// Kernel 2: one warp per column (b,h,t2). Writes dk[t2] and dv[t2] (overwrite). Lane l keeps the
// accumulators of channels l, l+32, ... in registers (hs <= kMaxHeadSize). Launched with
// kColumnWarps warps a block: the bound keeps its registers to what such a block may have.
constexpr int kColumnWarps = 4;
template <class T>
__global__ void __launch_bounds__(kColumnWarps * kWarpSize)
    attention_backward_columns_kernel(T* dqkv, const float* rowsums, const T* dout, const T* qkv, const T* att, int B,
                                      int Tn, int C, int NH) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps_per_block = blockDim.x / kWarpSize;
  const size_t col = size_t(blockIdx.x) * warps_per_block + warp;  // ((b*NH + h)*Tn + t2)
  if (col >= size_t(B) * NH * Tn) return;
  const int t2 = int(col % Tn), h = int(col / Tn % NH), b = int(col / (size_t(Tn) * NH));
  const size_t bh = col / Tn;  // b*NH + h
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(float(hs));
  const T* v_t2 = qkv_head(qkv, b, t2, h, 2, Tn, C, hs);

  float dk[kHeadChunks] = {}, dv[kHeadChunks] = {};
  for (int t = t2; t < Tn; t++) {
    const size_t row = bh * Tn + t;
    const float a = load(att[row * Tn + t2]);
    const T* dout_t = dout + (size_t(b) * Tn + t) * C + size_t(h) * hs;
    const float datt = warp_dot(dout_t, v_t2, hs);  // bit-identical to kernel 1's value
    const float dscore = a * (datt - rowsums[row]);
    const T* q_t = qkv_head(qkv, b, t, h, 0, Tn, C, hs);
#pragma unroll
    for (int j = 0; j < kHeadChunks; j++) {
      const int i = lane + j * kWarpSize;
      if (i < hs) {
        dk[j] += dscore * load(q_t[i]);
        dv[j] += a * load(dout_t[i]);
      }
    }
  }
  T* dk_out = dqkv + (size_t(b) * Tn + t2) * 3 * C + C + size_t(h) * hs;
  T* dv_out = dk_out + C;
#pragma unroll
  for (int j = 0; j < kHeadChunks; j++) {
    const int i = lane + j * kWarpSize;
    if (i < hs) {
      dk_out[i] = store<T>(dk[j] * scale);
      dv_out[i] = store<T>(dv[j]);
    }
  }
}

// Warps per block for the row kernels: up to 4, fewer when a row buffer is large.
int row_kernel_warps(int Tn) {
  const size_t row_bytes = size_t(Tn) * sizeof(float);
  NZ_CHECK(row_bytes <= kMaxRowSmemBytes,
           "attention: T = %d needs %zu bytes of shared memory per row, at most %zu are available",
           Tn, row_bytes, kMaxRowSmemBytes);
  size_t warps = kMaxRowSmemBytes / row_bytes;
  return int(warps < 4 ? warps : 4);
}

void check_heads(int C, int NH) {
  NZ_CHECK(NH > 0 && C % NH == 0, "attention: C = %d is not divisible by NH = %d", C, NH);
  NZ_CHECK(C / NH <= kMaxHeadSize, "attention: head size %d exceeds the CUDA kernel's limit %d",
           C / NH, kMaxHeadSize);
}

// ---- the cuBLAS path ----
// For one batch element, rows = NH*T rows of a (NH,T,T) score matrix; row r is (h, t = r % T).

// att row = softmax over t2 <= t of the (already scaled) fp32 scores, zeros above the diagonal.
// One warp per row; the maximum and the sum are warp reductions (fixed order: same bits every run).
template <class T>
__global__ void causal_softmax_kernel(T* att, const float* scores, int rows, int Tn) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (row >= rows) return;  // whole warps only
  const int t = row % Tn;
  const float* s = scores + size_t(row) * Tn;
  T* a = att + size_t(row) * Tn;
  float m = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) m = fmaxf(m, s[t2]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) sum += expf(s[t2] - m);
  const float inv_sum = 1.0f / warp_sum(sum);
  for (int t2 = lane; t2 < Tn; t2 += kWarpSize) a[t2] = store<T>(t2 <= t ? expf(s[t2] - m) * inv_sum : 0.0f);
}

// dscore row = scale * att * (datt - sum_j att_j datt_j) for t2 <= t, zeros above the diagonal
// (the scale of the scores, folded in here so the two products after it need none).
template <class T>
__global__ void causal_softmax_backward_kernel(T* dscore, const float* datt, const T* att, int rows, int Tn,
                                               float scale) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (row >= rows) return;
  const int t = row % Tn;
  const float* d = datt + size_t(row) * Tn;
  const T* a = att + size_t(row) * Tn;
  T* ds = dscore + size_t(row) * Tn;
  float partial = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarpSize) partial += load(a[t2]) * d[t2];
  const float rowsum = warp_sum(partial);
  for (int t2 = lane; t2 < Tn; t2 += kWarpSize)
    ds[t2] = store<T>(t2 <= t ? scale * load(a[t2]) * (d[t2] - rowsum) : 0.0f);
}

constexpr int kSoftmaxWarps = 4;  // rows per block of the two kernels above

// Per batch element b, per head (the GEMM batch, stride hs through qkv's channels), in cuBLAS's
// column-major terms: a row-major (r,c) matrix with row stride ld is a column-major (c,r) one.
//   scores (T,T)  = scale * q · k^T     col-major: scores^T = k (op T) · q^T      [fp32]
//   att           = causal_softmax(scores)
//   out (T,hs)    = att · v             col-major: out^T    = v^T · att^T
template <class T>
void attention_forward_cublas(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C, rows = NH * Tn;
  const long long TT = (long long)Tn * Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  float* scores = static_cast<float*>(scratch_buffer(size_t(NH) * TT * sizeof(float)));
  const unsigned blocks = unsigned(ceil_div(rows, kSoftmaxWarps));
  for (int b = 0; b < B; b++) {
    const T* q = qkv + size_t(b) * Tn * C3;
    const T *k = q + C, *v = q + 2 * C;
    T* att_b = att + size_t(b) * NH * TT;
    cublas_gemm_batched<T, float>(true, false, Tn, Tn, hs, scale, k, C3, hs, q, C3, hs, scores, Tn, TT, NH);
    causal_softmax_kernel<T><<<blocks, kSoftmaxWarps * kWarpSize>>>(att_b, scores, rows, Tn);
    NZ_CUDA_CHECK_LAUNCH();
    cublas_gemm_batched<T, T>(false, false, hs, Tn, Tn, 1.0f, v, C3, hs, att_b, Tn, TT,
                              out + size_t(b) * Tn * C, C, hs, NH);
  }
}

// Backward, per batch element and head:
//   datt (T,T)  = dout · v^T            col-major: datt^T = v (op T) · dout^T     [fp32]
//   dv (T,hs)   = att^T · dout          col-major: dv^T   = dout^T · att (op T)
//   dscore      = causal_softmax_backward(datt) * scale
//   dq (T,hs)   = dscore · k            col-major: dq^T   = k^T · dscore^T
//   dk (T,hs)   = dscore^T · q          col-major: dk^T   = q^T · dscore (op T)
template <class T>
void attention_backward_cublas(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C,
                               int NH) {
  const int hs = C / NH, C3 = 3 * C, rows = NH * Tn;
  const long long TT = (long long)Tn * Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  const size_t n = size_t(NH) * TT;
  char* scratch = static_cast<char*>(scratch_buffer(n * (sizeof(float) + sizeof(T))));
  float* datt = reinterpret_cast<float*>(scratch);
  T* dscore = reinterpret_cast<T*>(scratch + n * sizeof(float));
  const unsigned blocks = unsigned(ceil_div(rows, kSoftmaxWarps));
  for (int b = 0; b < B; b++) {
    const T* q = qkv + size_t(b) * Tn * C3;
    const T *k = q + C, *v = q + 2 * C;
    T* dq = dqkv + size_t(b) * Tn * C3;
    T *dk = dq + C, *dv = dq + 2 * C;
    const T* dout_b = dout + size_t(b) * Tn * C;
    const T* att_b = att + size_t(b) * NH * TT;
    cublas_gemm_batched<T, float>(true, false, Tn, Tn, hs, 1.0f, v, C3, hs, dout_b, C, hs, datt, Tn, TT, NH);
    cublas_gemm_batched<T, T>(false, true, hs, Tn, Tn, 1.0f, dout_b, C, hs, att_b, Tn, TT, dv, C3, hs, NH);
    causal_softmax_backward_kernel<T><<<blocks, kSoftmaxWarps * kWarpSize>>>(dscore, datt, att_b, rows, Tn, scale);
    NZ_CUDA_CHECK_LAUNCH();
    cublas_gemm_batched<T, T>(false, false, hs, Tn, Tn, 1.0f, k, C3, hs, dscore, Tn, TT, dq, C3, hs, NH);
    cublas_gemm_batched<T, T>(false, true, hs, Tn, Tn, 1.0f, q, C3, hs, dscore, Tn, TT, dk, C3, hs, NH);
  }
}

}  // namespace

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  check_heads(C, NH);
  const size_t rows = size_t(B) * NH * Tn;
  if (rows == 0) return;
  if (kernels() == Kernels::Fast && attention() == Attention::Flash && flash_attention_fits(C, NH))
    return flash_attention_forward(out, reinterpret_cast<float*>(att), qkv, B, Tn, C, NH);  // att: the lse (B,NH,T)
  if (kernels() == Kernels::Fast) return attention_forward_cublas(out, att, qkv, B, Tn, C, NH);
  const int warps = row_kernel_warps(Tn);
  const unsigned blocks = unsigned(ceil_div(rows, warps));
  const size_t smem = size_t(warps) * Tn * sizeof(float);
  attention_forward_kernel<T><<<blocks, warps * kWarpSize, smem>>>(out, att, qkv, B, Tn, C, NH);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const T* out, int B, int Tn, int C,
                        int NH) {
  check_heads(C, NH);
  const size_t rows = size_t(B) * NH * Tn;
  if (rows == 0) return;
  if (kernels() == Kernels::Fast && attention() == Attention::Flash && flash_attention_fits(C, NH))
    return flash_attention_backward(dqkv, dout, qkv, reinterpret_cast<const float*>(att), out, B, Tn, C, NH);
  if (kernels() == Kernels::Fast) return attention_backward_cublas(dqkv, dout, qkv, att, B, Tn, C, NH);
  float* rowsums = static_cast<float*>(scratch_buffer(rows * sizeof(float)));  // (B,NH,T)

  const int warps = row_kernel_warps(Tn);
  const size_t smem = size_t(warps) * Tn * sizeof(float);
  attention_backward_rows_kernel<T><<<unsigned(ceil_div(rows, warps)), warps * kWarpSize, smem>>>(
      dqkv, rowsums, dout, qkv, att, B, Tn, C, NH);
  NZ_CUDA_CHECK_LAUNCH();

  attention_backward_columns_kernel<T><<<unsigned(ceil_div(rows, kColumnWarps)), kColumnWarps * kWarpSize>>>(
      dqkv, rowsums, dout, qkv, att, B, Tn, C, NH);
  NZ_CUDA_CHECK_LAUNCH();
}

// explicit instantiations: kernel_table.inc's entries with cuda file attention (float, bf16, fp16)
#define NZ_INSTANTIATE_CUDA_attention
#include "kernels/kernel_instantiate.inc"

}  // namespace cuda
}  // namespace nz
