// kernels_flash_attention.cu — causal self-attention without the (T,T) matrix, in the manner of
// FlashAttention: the scores of a tile of queries against a tile of keys live only in shared memory,
// and the softmax is computed "online" while the key tiles stream past.
//
// Layouts as in kernels_attention.cu: qkv (B,T,3C) = [q | k | v], head h at channels h*hs...;
// out (B,T,C). What the forward saves for the backward is not the probabilities but one number per
// row, the log of the softmax's denominator:
//   lse[b][h][t] = log sum_{t2 <= t} exp(s[t][t2]),   s[t][t2] = q[t]·k[t2] / sqrt(hs)
// so that the backward can recompute any probability as p[t][t2] = exp(s[t][t2] - lse[t]).
//
// Online softmax, for one query row and key tiles j = 0, 1, ... (m: the running maximum, l: the
// running sum of exp(s - m), o: the running sum of exp(s - m) v):
//   m' = max(m, max_j s);   l = l exp(m - m') + sum_j exp(s - m');   o = o exp(m - m') + sum_j exp(s - m') v
// and at the end out = o / l, lse = m + log l. Every exp is of a number <= 0: nothing overflows.
// Causal: a key tile entirely after the query tile's last row contributes nothing and is never
// loaded — about half the tiles at long sequences.
//
// Backward, with dP = dout · v^T, D[t] = sum_t2 p[t][t2] dP[t][t2] = dout[t]·out[t], and
// dS = p (dP - D):  dq = scale dS k,  dk = scale dS^T q,  dv = p^T dout. Two kernels, so that every
// gradient is one thread's sum in a fixed order (no atomics: the same bits every run):
//   flash_backward_dq   one block per query tile: dq, key tiles streamed as in the forward;
//   flash_backward_dkdv one block per key tile: dk and dv, query tiles streamed (only those at or
//                       after the key tile: causal).
// D needs out, which the backward's interface (kernel_decls.inc) does not pass, so it is recomputed
// by the forward kernel into scratch. Each of the three recomputes p; that is the price of storing
// (B,NH,T) floats instead of (B,NH,T,T) probabilities.
//
// One thread per row of a tile, its row's accumulators in shared memory (rows padded by one float
// so that the 32 threads of a warp, each on its own row, hit 32 different banks). The products are
// plain fp32 loops on the CUDA cores: a kernel to read, and the memory-lean alternative to the
// batched cuBLAS GEMMs (--attention gemm, kernels_attention.cu), which run on tensor cores.
#include <algorithm>  // std::min, std::max (constexpr: usable in device code with --expt-relaxed-constexpr)

#include "cuda_common.cuh"     // load/store, scratch_buffer, NZ_CUDA_CHECK_LAUNCH
#include "flash_attention.h"  // the declarations

namespace nz {
namespace cuda {
namespace {

constexpr size_t kSmemLimit = 48 * 1024;  // dynamic shared memory without an opt-in

template <class T>
__device__ inline const T* head_row(const T* qkv, int b, int t, int h, int which, int Tn, int C, int hs) {
  return qkv + (size_t(b) * Tn + t) * 3 * C + size_t(which) * C + size_t(h) * hs;
}

// Thread i's share of loading a tile of K and V into shared memory: key row tk into row i of Ks
// and Vs (zeros past the sequence's end, so a partial last tile reads as keys that add nothing).
template <class T>
__device__ inline void load_kv_row(float* Ks, float* Vs, int ld, const T* qkv, int b, int tk, int i, int h,
                                   int Tn, int C, int hs) {
  const T* k_src = head_row(qkv, b, tk < Tn ? tk : 0, h, 1, Tn, C, hs);
  for (int d = 0; d < hs; d++) {
    Ks[i * ld + d] = tk < Tn ? load(k_src[d]) : 0.0f;
    Vs[i * ld + d] = tk < Tn ? load(k_src[C + d]) : 0.0f;
  }
}

__device__ inline float dot_rows(const float* x, const float* y, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; d++) s += x[d] * y[d];
  return s;
}

// Forward: block (query tile, h, b), `tile` threads, thread i owns query t = q0 + i.
// Shared memory (floats, ld = hs + 1): Qs, Ks, Vs, Os (tile, ld) and Ps (tile, tile + 1).
template <class T>
__global__ void flash_forward_kernel(T* out, float* lse, const T* qkv, int Tn, int C, int NH, int tile) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = hs + 1, lp = tile + 1;
  float *Qs = smem, *Ks = Qs + tile * ld, *Vs = Ks + tile * ld, *Os = Vs + tile * ld, *Ps = Os + tile * ld;
  const int i = threadIdx.x, q0 = blockIdx.x * tile, h = blockIdx.y, b = blockIdx.z;
  const int t = q0 + i;
  const bool active = t < Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  float *q = Qs + i * ld, *o = Os + i * ld, *p = Ps + i * lp;

  const T* q_src = head_row(qkv, b, active ? t : 0, h, 0, Tn, C, hs);
  for (int d = 0; d < hs; d++) {
    q[d] = active ? load(q_src[d]) : 0.0f;
    o[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last_key = std::min(q0 + tile, Tn) - 1;  // causal: no key after the tile's last query
  for (int k0 = 0; k0 <= last_key; k0 += tile) {
    __syncthreads();  // every thread is done with the previous K, V tile
    load_kv_row(Ks, Vs, ld, qkv, b, k0 + i, i, h, Tn, C, hs);
    __syncthreads();
    if (!active) continue;
    const int n = std::min(tile, t - k0 + 1);  // keys of this tile at or before t (>= 1)

    // scores of this tile, their maximum, and the rescaling of what came before
    float tile_max = -INFINITY;
    for (int j = 0; j < n; j++) {
      p[j] = dot_rows(q, Ks + j * ld, hs) * scale;
      tile_max = fmaxf(tile_max, p[j]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= correction;
    for (int j = 0; j < n; j++) {
      p[j] = expf(p[j] - m_new);
      l += p[j];
    }
    // o = o * correction + sum_j p[j] v[j], keys in order
    for (int d = 0; d < hs; d++) {
      float acc = o[d] * correction;
      for (int j = 0; j < n; j++) acc += p[j] * Vs[j * ld + d];
      o[d] = acc;
    }
    m = m_new;
  }
  if (!active) return;
  T* out_t = out + (size_t(b) * Tn + t) * C + size_t(h) * hs;
  const float inv_l = 1.0f / l;
  for (int d = 0; d < hs; d++) out_t[d] = store<T>(o[d] * inv_l);
  lse[(size_t(b) * NH + h) * Tn + t] = m + logf(l);
}

// D[b][h][t] = dout[t]·out[t] (head h): one thread per row.
template <class T>
__global__ void flash_backward_d_kernel(float* D, const T* dout, const T* out, int B, int Tn, int C, int NH) {
  const size_t row = size_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (b*NH + h)*Tn + t
  if (row >= size_t(B) * NH * Tn) return;
  const int t = int(row % Tn), h = int(row / Tn % NH), b = int(row / (size_t(Tn) * NH));
  const int hs = C / NH;
  const size_t at = (size_t(b) * Tn + t) * C + size_t(h) * hs;
  float s = 0.0f;
  for (int d = 0; d < hs; d++) s += load(dout[at + d]) * load(out[at + d]);
  D[row] = s;
}

// dq: block (query tile, h, b), thread i owns query t. Shared memory (floats, ld = hs + 1):
// Qs, dOs, Ks, Vs, dQs (tile, ld) and dSs (tile, tile + 1).
template <class T>
__global__ void flash_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                         int Tn, int C, int NH, int tile) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = hs + 1, lp = tile + 1;
  float *Qs = smem, *dOs = Qs + tile * ld, *Ks = dOs + tile * ld, *Vs = Ks + tile * ld;
  float *dQs = Vs + tile * ld, *dSs = dQs + tile * ld;
  const int i = threadIdx.x, q0 = blockIdx.x * tile, h = blockIdx.y, b = blockIdx.z;
  const int t = q0 + i;
  const bool active = t < Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  float *q = Qs + i * ld, *dout_t = dOs + i * ld, *dq = dQs + i * ld, *ds = dSs + i * lp;

  const size_t row = (size_t(b) * NH + h) * Tn + (active ? t : 0);
  const T* q_src = head_row(qkv, b, active ? t : 0, h, 0, Tn, C, hs);
  const T* dout_src = dout + (size_t(b) * Tn + (active ? t : 0)) * C + size_t(h) * hs;
  for (int d = 0; d < hs; d++) {
    q[d] = active ? load(q_src[d]) : 0.0f;
    dout_t[d] = active ? load(dout_src[d]) : 0.0f;
    dq[d] = 0.0f;
  }
  const float lse_t = active ? lse[row] : 0.0f, D_t = active ? D[row] : 0.0f;
  const int last_key = std::min(q0 + tile, Tn) - 1;
  for (int k0 = 0; k0 <= last_key; k0 += tile) {
    __syncthreads();
    load_kv_row(Ks, Vs, ld, qkv, b, k0 + i, i, h, Tn, C, hs);
    __syncthreads();
    if (!active) continue;
    const int n = std::min(tile, t - k0 + 1);
    for (int j = 0; j < n; j++) {  // dS[t][j] = p (dP - D), p recomputed from the saved lse
      const float p = expf(dot_rows(q, Ks + j * ld, hs) * scale - lse_t);
      ds[j] = p * (dot_rows(dout_t, Vs + j * ld, hs) - D_t);
    }
    for (int d = 0; d < hs; d++) {  // dq += dS k, keys in order
      float acc = dq[d];
      for (int j = 0; j < n; j++) acc += ds[j] * Ks[j * ld + d];
      dq[d] = acc;
    }
  }
  if (!active) return;
  T* dq_out = dqkv + (size_t(b) * Tn + t) * 3 * C + size_t(h) * hs;
  for (int d = 0; d < hs; d++) dq_out[d] = store<T>(dq[d] * scale);
}

// dk, dv: block (key tile, h, b), thread j owns key tk = k0 + j. Shared memory (floats,
// ld = hs + 1): Ks, Vs, dKs, dVs, Qs, dOs (tile, ld), Ps, dSs (tile, tile + 1), lse_s, D_s (tile).
template <class T>
__global__ void flash_backward_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                           const float* D, int Tn, int C, int NH, int tile) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = hs + 1, lp = tile + 1;
  float *Ks = smem, *Vs = Ks + tile * ld, *dKs = Vs + tile * ld, *dVs = dKs + tile * ld;
  float *Qs = dVs + tile * ld, *dOs = Qs + tile * ld, *Ps = dOs + tile * ld, *dSs = Ps + tile * lp;
  float *lse_s = dSs + tile * lp, *D_s = lse_s + tile;
  const int j = threadIdx.x, k0 = blockIdx.x * tile, h = blockIdx.y, b = blockIdx.z;
  const int tk = k0 + j;
  const bool active = tk < Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  float *k = Ks + j * ld, *v = Vs + j * ld, *dk = dKs + j * ld, *dv = dVs + j * ld;
  float *p = Ps + j * lp, *ds = dSs + j * lp;

  const T* k_src = head_row(qkv, b, active ? tk : 0, h, 1, Tn, C, hs);
  for (int d = 0; d < hs; d++) {
    k[d] = active ? load(k_src[d]) : 0.0f;
    v[d] = active ? load(k_src[C + d]) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  for (int q0 = k0; q0 < Tn; q0 += tile) {  // causal: queries before the key tile never see it
    __syncthreads();
    const int tq = q0 + j;  // thread j loads query row tq
    const bool q_ok = tq < Tn;
    const T* q_src = head_row(qkv, b, q_ok ? tq : 0, h, 0, Tn, C, hs);
    const T* dout_src = dout + (size_t(b) * Tn + (q_ok ? tq : 0)) * C + size_t(h) * hs;
    for (int d = 0; d < hs; d++) {
      Qs[j * ld + d] = q_ok ? load(q_src[d]) : 0.0f;
      dOs[j * ld + d] = q_ok ? load(dout_src[d]) : 0.0f;
    }
    const size_t row = (size_t(b) * NH + h) * Tn + (q_ok ? tq : 0);
    lse_s[j] = q_ok ? lse[row] : 0.0f;
    D_s[j] = q_ok ? D[row] : 0.0f;
    __syncthreads();
    if (!active) continue;
    // the queries of this tile that see key tk: q0 + i >= tk, and q0 + i < Tn
    const int first = std::max(0, tk - q0), end = std::min(tile, Tn - q0);
    for (int i = first; i < end; i++) {
      const float* q = Qs + i * ld;
      p[i] = expf(dot_rows(q, k, hs) * scale - lse_s[i]);
      ds[i] = p[i] * (dot_rows(dOs + i * ld, v, hs) - D_s[i]);
    }
    for (int d = 0; d < hs; d++) {  // dv += p^T dout, dk += dS^T q, queries in order
      float acc_v = dv[d], acc_k = dk[d];
      for (int i = first; i < end; i++) {
        acc_v += p[i] * dOs[i * ld + d];
        acc_k += ds[i] * Qs[i * ld + d];
      }
      dv[d] = acc_v;
      dk[d] = acc_k;
    }
  }
  if (!active) return;
  T* dk_out = dqkv + (size_t(b) * Tn + tk) * 3 * C + C + size_t(h) * hs;
  T* dv_out = dk_out + C;
  for (int d = 0; d < hs; d++) {
    dk_out[d] = store<T>(dk[d] * scale);
    dv_out[d] = store<T>(dv[d]);
  }
}

// The largest tile (32, 16 or 8 rows) whose shared memory fits without an opt-in: `row_arrays`
// arrays of (tile, hs + 1) floats, `score_arrays` of (tile, tile + 1), `vectors` of (tile).
int pick_tile(int hs, int row_arrays, int score_arrays, int vectors, size_t* smem) {
  for (int tile = 32; tile >= 8; tile /= 2) {
    *smem = sizeof(float) * (size_t(row_arrays) * tile * (hs + 1) + size_t(score_arrays) * tile * (tile + 1) +
                             size_t(vectors) * tile);
    if (*smem <= kSmemLimit) return tile;
  }
  NZ_CHECK(false, "flash attention: head size %d needs more shared memory than %zu bytes", hs, kSmemLimit);
  return 0;
}

}  // namespace

template <class T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH) {
  size_t smem = 0;
  const int tile = pick_tile(C / NH, 4, 1, 0, &smem);
  const dim3 grid(unsigned(ceil_div(Tn, tile)), unsigned(NH), unsigned(B));
  flash_forward_kernel<T><<<grid, tile, smem>>>(out, lse, qkv, Tn, C, NH, tile);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const float* lse, int B, int Tn, int C,
                              int NH) {
  // scratch: out recomputed (B,T,C), its lse (B,NH,T) (bitwise the saved one), D (B,NH,T)
  const size_t rows = size_t(B) * NH * Tn, n_out = size_t(B) * Tn * C;
  const size_t out_bytes = (n_out * sizeof(T) + 255) / 256 * 256;
  char* scratch = static_cast<char*>(scratch_buffer(out_bytes + 2 * rows * sizeof(float)));
  T* out = reinterpret_cast<T*>(scratch);
  float* lse_again = reinterpret_cast<float*>(scratch + out_bytes);
  float* D = lse_again + rows;
  flash_attention_forward(out, lse_again, qkv, B, Tn, C, NH);
  const int threads = 128;
  flash_backward_d_kernel<T><<<unsigned(ceil_div(rows, threads)), threads>>>(D, dout, out, B, Tn, C, NH);
  NZ_CUDA_CHECK_LAUNCH();

  size_t smem = 0;
  int tile = pick_tile(C / NH, 5, 1, 0, &smem);
  dim3 grid(unsigned(ceil_div(Tn, tile)), unsigned(NH), unsigned(B));
  flash_backward_dq_kernel<T><<<grid, tile, smem>>>(dqkv, dout, qkv, lse, D, Tn, C, NH, tile);
  NZ_CUDA_CHECK_LAUNCH();
  tile = pick_tile(C / NH, 6, 2, 2, &smem);
  grid = dim3(unsigned(ceil_div(Tn, tile)), unsigned(NH), unsigned(B));
  flash_backward_dkdv_kernel<T><<<grid, tile, smem>>>(dqkv, dout, qkv, lse, D, Tn, C, NH, tile);
  NZ_CUDA_CHECK_LAUNCH();
}

#define NZ_INSTANTIATE(T)                                                                          \
  template void flash_attention_forward<T>(T*, float*, const T*, int, int, int, int);             \
  template void flash_attention_backward<T>(T*, const T*, const T*, const float*, int, int, int, int);
NZ_INSTANTIATE(float)
NZ_INSTANTIATE(bf16)
NZ_INSTANTIATE(f16)
#undef NZ_INSTANTIATE

}  // namespace cuda
}  // namespace nz
