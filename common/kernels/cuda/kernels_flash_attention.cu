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
// gradient is one thread's (or one warp's) sum in a fixed order (no atomics: the same bits every run):
//   backward dq   one block per query tile: dq, key tiles streamed as in the forward;
//   backward dkdv one block per key tile: dk and dv, query tiles streamed (only those at or after
//                 the key tile: causal).
// D needs out: the forward's output, which the model keeps anyway (it is the attention projection's
// input), so a small kernel reads it and writes D (B,NH,T) before the two. Each of the two recomputes
// p; that is the price of storing (B,NH,T) floats instead of (B,NH,T,T) probabilities.
//
// Two families of kernels compute this; flash_attention_uses_wmma (flash_attention.h) says which runs.
//
// The CUDA-core kernels (fp32 storage; head sizes that are not a multiple of 16): one thread per row
// of a tile, its row's accumulators in shared memory (rows padded by one float so that the 32
// threads of a warp, each on its own row, hit 32 different banks). The products are plain fp32 loops:
// the kernel to read first, and every probability stays in fp32.
//
// The tensor-core kernels (bf16 and fp16 storage; head size 16, 32, ..., 128): the same algorithm
// with its matrix products on the tensor cores, through CUDA's WMMA API (nvcuda::wmma, <mma.h>): a
// warp multiplies a 16×16 tile of bf16/half by another and adds the product into a 16×16 fp32
// accumulator in one call (mma_sync). An H200 does ~990 TFLOP/s that way against ~67 in fp32 on the
// CUDA cores. (bf16 WMMA needs sm_80 or newer, the Makefile's oldest target.) A warp owns
// 16 rows:
//   forward, dq:  16 query rows of a block's 64 (4 warps); K and V stream past in tiles of 32 keys;
//   dk, dv:       16 keys of a block's 32 (2 warps); Q and dout stream past in tiles of 16 queries.
// On the tensor cores: every product of two matrices — S = Q K^T and O += P V (forward); S,
// dP = dout V^T and dq += dS K (dq); S^T = K Q^T, dP^T = V dout^T, dv += P^T dout and dk += dS^T Q
// (dk, dv). On the CUDA cores, plain threads, two lanes per row of the warp's 16 (each half of the
// row's columns): the causal mask, the exps, the row maxima and sums, the rescaling of O, dS = p (dP -
// D), and every load from and store to global memory. That is elementwise and per-row work, which a
// matrix unit does not do. Plain threads see a fragment (WMMA's name for a tile held by a warp) only through shared
// memory — store_matrix_sync, then __syncwarp() — because which lane holds which element of a
// fragment is the hardware's undocumented business: no code here indexes a fragment's elements.
// The warp's rows of Q (and dout) and its accumulators (O; dq; dk, dv) stay in registers, as
// fragments, for the whole loop; the scores go through the warp's own piece of shared memory, and so
// does O, 16 columns at a time, to be rescaled by the rows' correction factors. The dk/dv block's K
// and V come into shared memory once, for its whole loop over query tiles.
// Tiles move as FlashAttention-2's do: global -> shared memory in 16-byte pieces (8 bf16/half) by
// asynchronous copies (cp.async, <cuda_pipeline.h>), double-buffered: while the warps compute on one
// tile (K, V; or Q, dout, lse, D for dk/dv), the next one's copy is in flight into the other buffer,
// so one __syncthreads per tile both says "this tile has landed" and "the previous tile is free".
// Results leave in 16-byte stores too (each lane's 8 values of a 16-column piece).
//
// Precision of the tensor-core kernels. The products take bf16/half inputs and add in fp32. Q, K, V
// and dout are already bf16/half (the storage type) and enter exactly. But P (forward and backward)
// and dS (backward) are fp32 results, rounded to bf16/half to enter the tensor cores: a new rounding,
// of relative error at most u = 2^-8 (bf16) or 2^-11 (fp16) on each value (fp16 adds an absolute
// 2^-25 where a value is below its normal range, 2^-14). So, beyond the CUDA-core kernels' error,
//   |out[t] error| <= u sum_t2 P[t][t2] |v[t2]|  (<= u max|v|; the sums l keep the unrounded p),
//   |dv[t2] error| <= u sum_t P[t][t2] |dout[t]|,
//   |dq[t] error|  <= u scale sum_t2 |dS[t][t2]| |k[t2]|,   |dk[t2] error| <= u scale sum_t |dS[t][t2]| |q[t]|
// elementwise, to first order in u; tests/cuda/test_cuda_kernels.cpp grants each element exactly these
// (with fp16's underflow term).
//
// Determinism, both families: no atomics, and every sum in a fixed order — one thread's loop in
// order; a row's two halves added as first + second by both of its lanes (the same bits: a + b ==
// b + a); inside an mma_sync, the tensor cores' own fixed order; across tiles, the tiles in order.
//
// Shared memory at head size 128 (64): forward 48 KiB (32 KiB), dq 57 KiB (41 KiB), dk/dv 42 KiB
// (27 KiB); dq at head size 128 is the one above the 48 KiB a block gets without an opt-in, and asks
// for it (cudaFuncSetAttribute; an H100/H200 allows 227 KiB). The CUDA-core kernels stay within 48
// KiB: the largest tile that fits, pick_tile.
#include <cuda_pipeline.h>  // __pipeline_memcpy_async, _commit, _wait_prior: cp.async, global -> shared
#include <mma.h>            // nvcuda::wmma: fragments, load/store_matrix_sync, mma_sync (the tensor cores)

#include <algorithm>    // std::min, std::max (constexpr: usable in device code with --expt-relaxed-constexpr)
#include <cstdint>      // uintptr_t
#include <type_traits>  // std::is_same_v

#include "cuda_common.cuh"     // load/store, scratch_buffer, NZ_CUDA_CHECK_LAUNCH, kWarpSize, kFullMask
#include "flash_attention.h"  // the declarations, flash_attention_uses_wmma

namespace nz {
namespace cuda {
namespace {

constexpr size_t kSmemLimit = 48 * 1024;  // dynamic shared memory without an opt-in

// ================================================================================================
// The CUDA-core kernels (every storage type, every head size up to 128)

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


// ================================================================================================
// The tensor-core kernels (bf16, fp16; head size a multiple of 16)

namespace wmma = nvcuda::wmma;

// The CUDA type with T's bits, which WMMA's functions take: nz::bf16 has __nv_bfloat16's layout,
// nz::f16 __half's (dtype.h). Shared tiles are kept as T and handed to WMMA through as_wmma.
template <class T>
struct wmma_type;
template <>
struct wmma_type<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct wmma_type<f16> {
  using type = __half;
};
template <class T>
__device__ inline const typename wmma_type<T>::type* as_wmma(const T* p) {
  return reinterpret_cast<const typename wmma_type<T>::type*>(p);
}

// The fragments: 16×16 tiles held by a warp. A operand (row_major: row r of the tile is a row in
// memory), B operand (row_major), B read transposed (col_major: column c of the tile is a row in
// memory, so K^T's tile is read from K's rows), and the fp32 accumulator.
constexpr int kFrag = 16;
template <class T>
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, typename wmma_type<T>::type, wmma::row_major>;
template <class T>
using FragB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, typename wmma_type<T>::type, wmma::row_major>;
template <class T>
using FragBt = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, typename wmma_type<T>::type, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// A head of hs channels is hs / 16 fragments wide, at most kMaxHeadFrags. The per-head fragment
// arrays have a size fixed at compile time, kHeadFrags (a kernel's template parameter): 4 for head
// sizes up to 64 (gpt2's), 8 above, so that the smaller heads' kernels do not hold registers for
// fragments they never use (with_head_frags). Every loop over them is unrolled (#pragma unroll, a
// constant trip count, the real count as a condition inside) so that each fragment has a fixed register.
constexpr int kMaxHeadFrags = kMaxFlashHeadSize / kFrag;  // 8
template <class F>
void with_head_frags(int hs, F&& launch) {  // launch(std::integral_constant<int, kHeadFrags>)
  if (hs <= 4 * kFrag) launch(std::integral_constant<int, 4>{});
  else launch(std::integral_constant<int, kMaxHeadFrags>{});
}

// Tiles (rows; every shared tile's rows padded so that consecutive rows start in different banks,
// and a row stays a multiple of 16 bytes, as WMMA requires):
//   forward, dq: a block of kQWarps warps, 16 query rows each; K, V tiles of kKeys rows of hs + 8;
//                a warp's scores (16, kLdScore) fp32 and probabilities (16, kLdProb) bf16/half.
//   dk, dv:      a block of kKWarps warps, 16 keys each; Q, dout tiles of kQueries rows of hs + 8;
//                a warp's transposed scores (16, kLdScoreT) fp32 and probabilities (16, kLdProbT).
constexpr int kQWarps = 4, kQRows = kQWarps * kFrag, kKeys = 32;  // 64 query rows per block
constexpr int kLdScore = kKeys + 4, kLdProb = kKeys + 8;
constexpr int kKWarps = 2, kKRows = kKWarps * kFrag, kQueries = 16;  // 32 keys per block
constexpr int kLdScoreT = kQueries + 4, kLdProbT = kQueries + 8;

// Registers: the blocks an SM (65536 registers) should hold at once, which caps a thread's registers
// (__launch_bounds__). At head sizes up to 64: forward 5 blocks (20 warps, <= 96 registers), dq 4
// (16 warps, <= 128), dk/dv 8 (16 warps, <= 128), met without spilling (sm_90). Above, no cap:
// capping them (the forward at 128, dq and dk/dv at 168) makes them spill, so they keep what they
// need (164-208 registers, 8-12 warps per SM).
template <int kHeadFrags>
constexpr int kForwardBlocksPerSM = kHeadFrags <= 4 ? 5 : 1;
template <int kHeadFrags>
constexpr int kDqBlocksPerSM = kHeadFrags <= 4 ? 4 : 1;
template <int kHeadFrags>
constexpr int kDkDvBlocksPerSM = kHeadFrags <= 4 ? 8 : 1;

// Shared memory of each kernel in bytes (the kernels carve it up in this order; bf16 and half are
// both 2 bytes). Every part's size is a multiple of 32 bytes, so every part, and every 16-row,
// 16-column piece of one, starts 32-byte aligned, as WMMA requires.
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2, "16-bit storage types");
size_t wmma_forward_smem(int hs) {  // two buffers of K, V; per warp: scores, probabilities
  return 4 * kKeys * (hs + 8) * sizeof(bf16) + kQRows * (kLdScore * sizeof(float) + kLdProb * sizeof(bf16));
}
size_t wmma_dq_smem(int hs) {  // two buffers of K, V; per warp: scores, dP, dS
  return 4 * kKeys * (hs + 8) * sizeof(bf16) + kQRows * (2 * kLdScore * sizeof(float) + kLdProb * sizeof(bf16));
}
size_t wmma_dkdv_smem(int hs) {  // K, V, two buffers of Q, dout; per warp: S^T, dP^T, P^T, dS^T; 2 x lse, D
  return (2 * kKRows + 4 * kQueries) * (hs + 8) * sizeof(bf16) +
         kKRows * (2 * kLdScoreT * sizeof(float) + 2 * kLdProbT * sizeof(bf16)) + 4 * kQueries * sizeof(float);
}

// Rows t0 .. t0 + n - 1 of one head into a shared tile (n, ldh), in 16-byte pieces (8 bf16/half: every
// row of the head, of qkv and of a tile starts 16-byte aligned, as hs, C and ldh are multiples of 8),
// copied asynchronously (cp.async: global -> shared memory without a detour through registers, so
// the threads go on computing while the copy is in flight). Row t of the head starts at src + t *
// stride. Rows past the sequence's end are zeros, stored directly (they act as keys and queries that
// add nothing). The block's threads share the copy, consecutive threads on consecutive pieces
// (coalesced). The caller commits the copies as a group (__pipeline_commit) and, before anyone
// reads the tile, waits for them (__pipeline_wait_prior) and then meets the block at a __syncthreads:
// a thread's wait covers its own copies only.
constexpr int kVec = 16 / sizeof(bf16);  // elements per 16-byte piece
template <class T>
__device__ inline void stage_rows(T* tile, int ldh, const T* src, size_t stride, int t0, int n, int Tn, int hs) {
  const int pieces = hs / kVec;
  for (int e = threadIdx.x; e < n * pieces; e += blockDim.x) {
    const int i = e / pieces, d = e % pieces * kVec, t = t0 + i;
    T* dst = tile + i * ldh + d;
    if (t < Tn) __pipeline_memcpy_async(dst, src + size_t(t) * stride + d, 16);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// One float per row (lse, D) for rows t0 .. t0 + n - 1, by 4-byte asynchronous copies, zeros past the end.
__device__ inline void stage_floats(float* dst, const float* src, int t0, int n, int Tn) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (t0 + i < Tn) __pipeline_memcpy_async(dst + i, src + t0 + i, 4);
    else dst[i] = 0.0f;
  }
}

// Every copy this thread has issued lands, then every thread's (the __syncthreads).
__device__ inline void wait_staged() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
}

// Per-row work on an accumulator goes through the warp's scratch, a (16, ld) fp32 tile of shared
// memory: the accumulator is stored there (store_matrix_sync), and lanes 2r and 2r+1 take 8 of row
// r's 16 values each. (Which lane holds which element of a fragment is undocumented, so a fragment's
// elements are never indexed directly.) The __syncwarp()s order the lanes' accesses to the scratch
// against the warp's store and load.
//   scale_rows: acc *= factor, factor being the lane's row's;
//   store_tile: dst_r[c] = acc[r][c] * factor, dst_r being the lane's row's place in global memory
//               (null for a row past the sequence's end).
__device__ inline void scale_rows(FragAcc& acc, float* scratch, int ld, float factor) {
  const int lane = threadIdx.x % kWarpSize, r = lane / 2, side = lane % 2;
  __syncwarp();  // every lane is done with the scratch
  wmma::store_matrix_sync(scratch, acc, ld, wmma::mem_row_major);
  __syncwarp();
  for (int c = side * (kFrag / 2); c < (side + 1) * (kFrag / 2); c++) scratch[r * ld + c] *= factor;
  __syncwarp();
  wmma::load_matrix_sync(acc, scratch, ld, wmma::mem_row_major);
}

template <class T>
__device__ inline void store_tile(T* dst_r, const FragAcc& acc, float* scratch, int ld, float factor) {
  const int lane = threadIdx.x % kWarpSize, r = lane / 2, side = lane % 2;
  __syncwarp();
  wmma::store_matrix_sync(scratch, acc, ld, wmma::mem_row_major);
  __syncwarp();
  if (dst_r) {  // the lane's 8 values (16 bytes) in one store
    alignas(16) T piece[kFrag / 2];
    for (int c = 0; c < kFrag / 2; c++) piece[c] = store<T>(scratch[r * ld + side * (kFrag / 2) + c] * factor);
    *reinterpret_cast<uint4*>(dst_r + side * (kFrag / 2)) = *reinterpret_cast<const uint4*>(piece);
  }
}

// Forward: block (64-row query tile, h, b), 4 warps; warp w owns queries q0 + 16w ... q0 + 16w + 15.
// Shared memory (T unless said): two buffers of Ks, Vs (kKeys, hs + 8), the next tile's copy in flight
// in one while the warps compute on the other; per warp S (16, kLdScore) fp32, the scores and then
// the scratch through which O is rescaled and written; P (16, kLdProb).
template <class T, int kHeadFrags>
__global__ void __launch_bounds__(kQWarps * kWarpSize, kForwardBlocksPerSM<kHeadFrags>)
flash_forward_wmma_kernel(T* out, float* lse, const T* qkv, int Tn, int C, int NH) {
  extern __shared__ __align__(32) float smem[];  // WMMA's tiles must start 32-byte aligned
  const int hs = C / NH, ldh = hs + 8, head_frags = hs / kFrag;
  T* kv_buffers = reinterpret_cast<T*>(smem);  // buffer i: Ks at kv_buffers + 2i kKeys ldh, then Vs
  float* scores = reinterpret_cast<float*>(kv_buffers + 4 * kKeys * ldh);
  T* probs = reinterpret_cast<T*>(scores + kQRows * kLdScore);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int q0 = blockIdx.x * kQRows, h = blockIdx.y, b = blockIdx.z;
  const int w0 = q0 + warp * kFrag;  // the warp's first query
  float* S = scores + warp * kFrag * kLdScore;
  T* P = probs + warp * kFrag * kLdProb;
  const int r = lane / 2, side = lane % 2, t = w0 + r;  // per-row work: lanes 2r, 2r+1 share query t
  const bool warp_active = w0 < Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  const size_t stride = size_t(3) * C;  // between rows of qkv
  const T* q_src = qkv + size_t(b) * Tn * stride + size_t(h) * hs;
  const T* k_src = q_src + C;
  const T* v_src = q_src + 2 * C;

  // Q: the block's 64 rows staged through buffer 0 (its Ks and Vs: exactly their size), then each
  // warp's 16 rows into registers as head_frags A fragments. O (16, hs) starts at zero in accumulators.
  stage_rows(kv_buffers, ldh, q_src, stride, q0, kQRows, Tn, hs);
  wait_staged();
  FragA<T> q[kHeadFrags];
  FragAcc o[kHeadFrags];
#pragma unroll
  for (int f = 0; f < kHeadFrags; f++)
    if (f < head_frags) {
      wmma::load_matrix_sync(q[f], as_wmma(kv_buffers + warp * kFrag * ldh + f * kFrag), ldh);
      wmma::fill_fragment(o[f], 0.0f);
    }
  float m = -INFINITY, l = 0.0f;  // query t's running maximum and sum (both of its lanes keep them)
  __syncthreads();  // every warp has its Q: buffer 0 can take the first K, V tile

  const int last_key = std::min(q0 + kQRows, Tn) - 1;  // causal: no key after the block's last query
  stage_rows(kv_buffers, ldh, k_src, stride, 0, kKeys, Tn, hs);
  stage_rows(kv_buffers + kKeys * ldh, ldh, v_src, stride, 0, kKeys, Tn, hs);
  for (int k0 = 0, it = 0; k0 <= last_key; k0 += kKeys, it++) {
    // this tile lands, and every warp is done with the other buffer (the previous tile): the next
    // tile goes there, in flight while this one is computed
    wait_staged();
    const T* Ks = kv_buffers + (it % 2) * 2 * kKeys * ldh;
    const T* Vs = Ks + kKeys * ldh;
    if (k0 + kKeys <= last_key) {
      T* next = kv_buffers + ((it + 1) % 2) * 2 * kKeys * ldh;
      stage_rows(next, ldh, k_src, stride, k0 + kKeys, kKeys, Tn, hs);
      stage_rows(next + kKeys * ldh, ldh, v_src, stride, k0 + kKeys, kKeys, Tn, hs);
    }
    if (!warp_active || k0 > w0 + kFrag - 1) continue;  // causal: the tile is after all of the warp's queries

    // tensor cores: S = Q K^T (16, kKeys), 16 keys at a time, a sum over the head's 16-channel pieces
    for (int j = 0; j < kKeys / kFrag; j++) {
      FragAcc s;
      wmma::fill_fragment(s, 0.0f);
#pragma unroll
      for (int f = 0; f < kHeadFrags; f++)
        if (f < head_frags) {
          FragBt<T> kt;  // K^T (channels 16f.., keys 16j..), read from K's rows
          wmma::load_matrix_sync(kt, as_wmma(Ks + j * kFrag * ldh + f * kFrag), ldh);
          wmma::mma_sync(s, q[f], kt, s);
        }
      wmma::store_matrix_sync(S + j * kFrag, s, kLdScore, wmma::mem_row_major);
    }
    __syncwarp();  // every lane's share of S is written

    // CUDA cores, the online softmax: lanes 2r and 2r+1 take 16 of query t's 32 scores each
    float* s_row = S + r * kLdScore + side * (kKeys / 2);
    T* p_row = P + r * kLdProb + side * (kKeys / 2);
    const int key0 = k0 + side * (kKeys / 2);
    float tile_max = -INFINITY;
    for (int c = 0; c < kKeys / 2; c++) {
      s_row[c] = key0 + c <= t ? s_row[c] * scale : -INFINITY;  // causal mask
      tile_max = fmaxf(tile_max, s_row[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));  // with the other half of the row
    const float m_new = fmaxf(m, tile_max);  // finite: key 0 is in the first tile of every query
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
    for (int c = 0; c < kKeys / 2; c++) {
      const float p = expf(s_row[c] - m_new);
      sum += p;
      p_row[c] = store<T>(p);  // rounded to bf16/half for the tensor cores (the header's bound)
    }
    l = l * correction + (sum + __shfl_xor_sync(kFullMask, sum, 1));  // l keeps the unrounded p
    m = m_new;

    // O *= correction, row by row: each 16-column piece of O through S (the scores are used up)
#pragma unroll
    for (int f = 0; f < kHeadFrags; f++)
      if (f < head_frags) scale_rows(o[f], S, kLdScore, correction);

    // tensor cores: O += P V, P (16, kKeys) against V (kKeys, hs), 16 keys and 16 channels at a time
    __syncwarp();  // every lane's P is written
    FragA<T> p[kKeys / kFrag];
    for (int j = 0; j < kKeys / kFrag; j++) wmma::load_matrix_sync(p[j], as_wmma(P + j * kFrag), kLdProb);
#pragma unroll
    for (int f = 0; f < kHeadFrags; f++)
      if (f < head_frags)
        for (int j = 0; j < kKeys / kFrag; j++) {
          FragB<T> v;  // V (keys 16j.., channels 16f..)
          wmma::load_matrix_sync(v, as_wmma(Vs + j * kFrag * ldh + f * kFrag), ldh);
          wmma::mma_sync(o[f], p[j], v, o[f]);
        }
  }
  if (!warp_active) return;

  // out = O / l, 16 columns at a time through S; lse = m + log l
  T* out_t = t < Tn ? out + (size_t(b) * Tn + t) * C + size_t(h) * hs : nullptr;
#pragma unroll
  for (int f = 0; f < kHeadFrags; f++)
    if (f < head_frags) store_tile(out_t ? out_t + f * kFrag : nullptr, o[f], S, kLdScore, 1.0f / l);
  if (t < Tn && side == 0) lse[(size_t(b) * NH + h) * Tn + t] = m + logf(l);
}

// dq: block (64-row query tile, h, b), 4 warps; warp w owns queries q0 + 16w ... q0 + 16w + 15.
// Shared memory (T unless said): two buffers of Ks, Vs (kKeys, hs + 8), as in the forward; per warp
// S, dP (16, kLdScore) fp32 and dS (16, kLdProb). Q and dout, like the forward's Q, come into
// registers through the two buffers.
template <class T, int kHeadFrags>
__global__ void __launch_bounds__(kQWarps * kWarpSize, kDqBlocksPerSM<kHeadFrags>)
flash_backward_dq_wmma_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                              const float* D, int Tn, int C, int NH) {
  extern __shared__ __align__(32) float smem[];  // WMMA's tiles must start 32-byte aligned
  const int hs = C / NH, ldh = hs + 8, head_frags = hs / kFrag;
  T* kv_buffers = reinterpret_cast<T*>(smem);  // buffer i: Ks at kv_buffers + 2i kKeys ldh, then Vs
  float* scores = reinterpret_cast<float*>(kv_buffers + 4 * kKeys * ldh);
  float* dprobs = scores + kQRows * kLdScore;
  T* dscores = reinterpret_cast<T*>(dprobs + kQRows * kLdScore);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int q0 = blockIdx.x * kQRows, h = blockIdx.y, b = blockIdx.z;
  const int w0 = q0 + warp * kFrag;
  float* S = scores + warp * kFrag * kLdScore;
  float* dP = dprobs + warp * kFrag * kLdScore;
  T* dS = dscores + warp * kFrag * kLdProb;
  const int r = lane / 2, side = lane % 2, t = w0 + r;
  const bool warp_active = w0 < Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  const size_t stride = size_t(3) * C;
  const T* q_src = qkv + size_t(b) * Tn * stride + size_t(h) * hs;
  const T* k_src = q_src + C;
  const T* v_src = q_src + 2 * C;
  const T* dout_src = dout + size_t(b) * Tn * C + size_t(h) * hs;
  const size_t row = (size_t(b) * NH + h) * Tn + t;
  const float lse_t = t < Tn ? lse[row] : 0.0f, D_t = t < Tn ? D[row] : 0.0f;

  FragA<T> q[kHeadFrags], dout_f[kHeadFrags];
  FragAcc dq[kHeadFrags];
  T* q_rows = kv_buffers;                       // buffer 0 (64 rows)
  T* dout_rows = kv_buffers + 2 * kKeys * ldh;  // buffer 1
  stage_rows(q_rows, ldh, q_src, stride, q0, kQRows, Tn, hs);
  stage_rows(dout_rows, ldh, dout_src, size_t(C), q0, kQRows, Tn, hs);
  wait_staged();
#pragma unroll
  for (int f = 0; f < kHeadFrags; f++)
    if (f < head_frags) {
      wmma::load_matrix_sync(q[f], as_wmma(q_rows + warp * kFrag * ldh + f * kFrag), ldh);
      wmma::load_matrix_sync(dout_f[f], as_wmma(dout_rows + warp * kFrag * ldh + f * kFrag), ldh);
      wmma::fill_fragment(dq[f], 0.0f);
    }
  __syncthreads();  // every warp has its Q and dout: the buffers can take K, V tiles

  const int last_key = std::min(q0 + kQRows, Tn) - 1;
  stage_rows(kv_buffers, ldh, k_src, stride, 0, kKeys, Tn, hs);
  stage_rows(kv_buffers + kKeys * ldh, ldh, v_src, stride, 0, kKeys, Tn, hs);
  for (int k0 = 0, it = 0; k0 <= last_key; k0 += kKeys, it++) {
    wait_staged();  // this tile is here; the other buffer is free for the next (as in the forward)
    const T* Ks = kv_buffers + (it % 2) * 2 * kKeys * ldh;
    const T* Vs = Ks + kKeys * ldh;
    if (k0 + kKeys <= last_key) {
      T* next = kv_buffers + ((it + 1) % 2) * 2 * kKeys * ldh;
      stage_rows(next, ldh, k_src, stride, k0 + kKeys, kKeys, Tn, hs);
      stage_rows(next + kKeys * ldh, ldh, v_src, stride, k0 + kKeys, kKeys, Tn, hs);
    }
    if (!warp_active || k0 > w0 + kFrag - 1) continue;

    // tensor cores: S = Q K^T and dP = dout V^T (16, kKeys), 16 keys at a time
    for (int j = 0; j < kKeys / kFrag; j++) {
      FragAcc s, dp;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(dp, 0.0f);
#pragma unroll
      for (int f = 0; f < kHeadFrags; f++)
        if (f < head_frags) {
          FragBt<T> kt, vt;  // K^T and V^T (channels 16f.., keys 16j..)
          wmma::load_matrix_sync(kt, as_wmma(Ks + j * kFrag * ldh + f * kFrag), ldh);
          wmma::load_matrix_sync(vt, as_wmma(Vs + j * kFrag * ldh + f * kFrag), ldh);
          wmma::mma_sync(s, q[f], kt, s);
          wmma::mma_sync(dp, dout_f[f], vt, dp);
        }
      wmma::store_matrix_sync(S + j * kFrag, s, kLdScore, wmma::mem_row_major);
      wmma::store_matrix_sync(dP + j * kFrag, dp, kLdScore, wmma::mem_row_major);
    }
    __syncwarp();

    // CUDA cores: dS = p (dP - D), p recomputed from the saved lse; lanes 2r, 2r+1 take 16 keys each
    for (int c = side * (kKeys / 2); c < (side + 1) * (kKeys / 2); c++) {
      const int key = k0 + c;
      const float p = key <= t ? expf(S[r * kLdScore + c] * scale - lse_t) : 0.0f;
      dS[r * kLdProb + c] = store<T>(p * (dP[r * kLdScore + c] - D_t));  // rounded for the tensor cores
    }
    __syncwarp();

    // tensor cores: dq += dS K, dS (16, kKeys) against K (kKeys, hs)
    FragA<T> ds[kKeys / kFrag];
    for (int j = 0; j < kKeys / kFrag; j++) wmma::load_matrix_sync(ds[j], as_wmma(dS + j * kFrag), kLdProb);
#pragma unroll
    for (int f = 0; f < kHeadFrags; f++)
      if (f < head_frags)
        for (int j = 0; j < kKeys / kFrag; j++) {
          FragB<T> k;  // K (keys 16j.., channels 16f..)
          wmma::load_matrix_sync(k, as_wmma(Ks + j * kFrag * ldh + f * kFrag), ldh);
          wmma::mma_sync(dq[f], ds[j], k, dq[f]);
        }
  }
  if (!warp_active) return;

  // dq * scale into dqkv's q part, 16 columns at a time through S
  T* dq_t = t < Tn ? dqkv + (size_t(b) * Tn + t) * stride + size_t(h) * hs : nullptr;
#pragma unroll
  for (int f = 0; f < kHeadFrags; f++)
    if (f < head_frags) store_tile(dq_t ? dq_t + f * kFrag : nullptr, dq[f], S, kLdScore, scale);
}

// dk, dv: block (32-key tile, h, b), 2 warps; warp w owns keys k0 + 16w ... k0 + 16w + 15, whose
// transposed scores S^T (keys, queries) it computes directly as K Q^T. Shared memory (T unless
// said): Ks, Vs (kKRows, hs + 8), loaded once for the whole loop; two buffers of Qs, dOs (kQueries,
// hs + 8), the next query tile's copy in flight in one while the warps compute on the other; per
// warp St, dPt (16, kLdScoreT) fp32, Pt, dSt (16, kLdProbT); two buffers of lse_s, D_s (kQueries) fp32.
template <class T, int kHeadFrags>
__global__ void __launch_bounds__(kKWarps * kWarpSize, kDkDvBlocksPerSM<kHeadFrags>)
flash_backward_dkdv_wmma_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                                const float* D, int Tn, int C, int NH) {
  extern __shared__ __align__(32) float smem[];  // WMMA's tiles must start 32-byte aligned
  const int hs = C / NH, ldh = hs + 8, head_frags = hs / kFrag;
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + kKRows * ldh;
  T* q_buffers = Vs + kKRows * ldh;  // buffer i: Qs at q_buffers + 2i kQueries ldh, then dOs
  float* st_all = reinterpret_cast<float*>(q_buffers + 4 * kQueries * ldh);
  float* dpt_all = st_all + kKRows * kLdScoreT;
  T* pt_all = reinterpret_cast<T*>(dpt_all + kKRows * kLdScoreT);
  T* dst_all = pt_all + kKRows * kLdProbT;
  float* row_buffers = reinterpret_cast<float*>(dst_all + kKRows * kLdProbT);  // buffer i: lse_s, D_s
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int k0 = blockIdx.x * kKRows, h = blockIdx.y, b = blockIdx.z;
  const int w0 = k0 + warp * kFrag;  // the warp's first key
  float* St = st_all + warp * kFrag * kLdScoreT;
  float* dPt = dpt_all + warp * kFrag * kLdScoreT;
  T* Pt = pt_all + warp * kFrag * kLdProbT;
  T* dSt = dst_all + warp * kFrag * kLdProbT;
  const int r = lane / 2, side = lane % 2, tk = w0 + r;  // lanes 2r, 2r+1 share key tk
  const bool warp_active = w0 < Tn;
  const float scale = 1.0f / sqrtf(float(hs));
  const size_t stride = size_t(3) * C;
  const T* q_src = qkv + size_t(b) * Tn * stride + size_t(h) * hs;
  const T* k_src = q_src + C;
  const T* v_src = q_src + 2 * C;
  const T* dout_src = dout + size_t(b) * Tn * C + size_t(h) * hs;
  const float* lse_bh = lse + (size_t(b) * NH + h) * Tn;
  const float* D_bh = D + (size_t(b) * NH + h) * Tn;

  // the query tile q0 into buffer `buf`: Q, dout, lse, D
  auto stage_queries = [&](int q0, int buf) {
    T* Qs = q_buffers + buf * 2 * kQueries * ldh;
    float* rows = row_buffers + buf * 2 * kQueries;
    stage_rows(Qs, ldh, q_src, stride, q0, kQueries, Tn, hs);
    stage_rows(Qs + kQueries * ldh, ldh, dout_src, size_t(C), q0, kQueries, Tn, hs);
    stage_floats(rows, lse_bh, q0, kQueries, Tn);
    stage_floats(rows + kQueries, D_bh, q0, kQueries, Tn);
  };
  stage_rows(Ks, ldh, k_src, stride, k0, kKRows, Tn, hs);  // K, V once, with the first query tile
  stage_rows(Vs, ldh, v_src, stride, k0, kKRows, Tn, hs);
  stage_queries(k0, 0);
  FragAcc dk[kHeadFrags], dv[kHeadFrags];
#pragma unroll
  for (int f = 0; f < kHeadFrags; f++)
    if (f < head_frags) {
      wmma::fill_fragment(dk[f], 0.0f);
      wmma::fill_fragment(dv[f], 0.0f);
    }

  for (int q0 = k0, it = 0; q0 < Tn; q0 += kQueries, it++) {  // causal: queries before the key tile never see it
    wait_staged();  // this query tile is here; the other buffer is free for the next (as in the forward)
    const T* Qs = q_buffers + (it % 2) * 2 * kQueries * ldh;
    const T* dOs = Qs + kQueries * ldh;
    const float* lse_s = row_buffers + (it % 2) * 2 * kQueries;
    const float* D_s = lse_s + kQueries;
    if (q0 + kQueries < Tn) stage_queries(q0 + kQueries, (it + 1) % 2);
    if (!warp_active || q0 + kQueries - 1 < w0) continue;  // causal: every query of the tile is before the warp's keys

    // tensor cores: S^T = K Q^T and dP^T = V dout^T (16 keys, 16 queries)
    FragAcc st, dpt;
    wmma::fill_fragment(st, 0.0f);
    wmma::fill_fragment(dpt, 0.0f);
#pragma unroll
    for (int f = 0; f < kHeadFrags; f++)
      if (f < head_frags) {
        FragA<T> kf, vf;    // the warp's keys' K and V (channels 16f..)
        FragBt<T> qt, dot;  // Q^T and dout^T (channels 16f.., queries), read from their rows
        wmma::load_matrix_sync(kf, as_wmma(Ks + warp * kFrag * ldh + f * kFrag), ldh);
        wmma::load_matrix_sync(vf, as_wmma(Vs + warp * kFrag * ldh + f * kFrag), ldh);
        wmma::load_matrix_sync(qt, as_wmma(Qs + f * kFrag), ldh);
        wmma::load_matrix_sync(dot, as_wmma(dOs + f * kFrag), ldh);
        wmma::mma_sync(st, kf, qt, st);
        wmma::mma_sync(dpt, vf, dot, dpt);
      }
    wmma::store_matrix_sync(St, st, kLdScoreT, wmma::mem_row_major);
    wmma::store_matrix_sync(dPt, dpt, kLdScoreT, wmma::mem_row_major);
    __syncwarp();

    // CUDA cores: P^T and dS^T = P^T (dP^T - D); lanes 2r, 2r+1 take 8 of key tk's 16 queries each
    for (int i = side * (kQueries / 2); i < (side + 1) * (kQueries / 2); i++) {
      const int tq = q0 + i;
      const float p = tq >= tk && tq < Tn ? expf(St[r * kLdScoreT + i] * scale - lse_s[i]) : 0.0f;
      Pt[r * kLdProbT + i] = store<T>(p);  // both rounded for the tensor cores
      dSt[r * kLdProbT + i] = store<T>(p * (dPt[r * kLdScoreT + i] - D_s[i]));
    }
    __syncwarp();

    // tensor cores: dv += P^T dout, dk += dS^T Q, (16 keys, 16 queries) against (16 queries, hs)
    FragA<T> pt, dst;
    wmma::load_matrix_sync(pt, as_wmma(Pt), kLdProbT);
    wmma::load_matrix_sync(dst, as_wmma(dSt), kLdProbT);
#pragma unroll
    for (int f = 0; f < kHeadFrags; f++)
      if (f < head_frags) {
        FragB<T> dof, qf;  // dout and Q (queries, channels 16f..)
        wmma::load_matrix_sync(dof, as_wmma(dOs + f * kFrag), ldh);
        wmma::load_matrix_sync(qf, as_wmma(Qs + f * kFrag), ldh);
        wmma::mma_sync(dv[f], pt, dof, dv[f]);
        wmma::mma_sync(dk[f], dst, qf, dk[f]);
      }
  }
  if (!warp_active) return;

  // dk * scale and dv into dqkv's k and v parts, 16 columns at a time through St
  T* dk_t = tk < Tn ? dqkv + (size_t(b) * Tn + tk) * stride + C + size_t(h) * hs : nullptr;
  T* dv_t = tk < Tn ? dk_t + C : nullptr;
#pragma unroll
  for (int f = 0; f < kHeadFrags; f++)
    if (f < head_frags) {
      store_tile(dk_t ? dk_t + f * kFrag : nullptr, dk[f], St, kLdScoreT, scale);
      store_tile(dv_t ? dv_t + f * kFrag : nullptr, dv[f], St, kLdScoreT, 1.0f);
    }
}
}  // namespace

// The tensor-core kernels move rows in 16-byte pieces: every tensor they read or write must start
// 16-byte aligned (cudaMalloc's are 256-byte aligned, the model's activations 64-byte).
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Which kernels: flash_attention_uses_wmma (flash_attention.h). `if constexpr` keeps the tensor-core
// kernels from being compiled for fp32, which WMMA does not take.
template <class T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH) {
  if constexpr (!std::is_same_v<T, float>) {
    if (flash_attention_uses_wmma<T>(C, NH)) {
      NZ_CHECK(aligned16(out) && aligned16(qkv), "flash attention: out and qkv must be 16-byte aligned");
      const dim3 grid(unsigned(ceil_div(Tn, kQRows)), unsigned(NH), unsigned(B));
      with_head_frags(C / NH, [&](auto head_frags) {
        constexpr int kHeadFrags = decltype(head_frags)::value;
        flash_forward_wmma_kernel<T, kHeadFrags><<<grid, kQWarps * kWarpSize, wmma_forward_smem(C / NH)>>>(
            out, lse, qkv, Tn, C, NH);
      });
      NZ_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  size_t smem = 0;
  const int tile = pick_tile(C / NH, 4, 1, 0, &smem);
  const dim3 grid(unsigned(ceil_div(Tn, tile)), unsigned(NH), unsigned(B));
  flash_forward_kernel<T><<<grid, tile, smem>>>(out, lse, qkv, Tn, C, NH, tile);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const float* lse, const T* out, int B,
                              int Tn, int C, int NH) {
  // D (B,NH,T) in the kernels' scratch, from the forward's saved output
  const size_t rows = size_t(B) * NH * Tn;
  float* D = static_cast<float*>(scratch_buffer(rows * sizeof(float)));
  const int threads = 128;
  flash_backward_d_kernel<T><<<unsigned(ceil_div(rows, threads)), threads>>>(D, dout, out, B, Tn, C, NH);
  NZ_CUDA_CHECK_LAUNCH();

  if constexpr (!std::is_same_v<T, float>) {
    if (flash_attention_uses_wmma<T>(C, NH)) {
      NZ_CHECK(aligned16(dqkv) && aligned16(dout) && aligned16(qkv),
               "flash attention: dqkv, dout and qkv must be 16-byte aligned");
      const int hs = C / NH;
      const size_t dq_smem = wmma_dq_smem(hs);
      with_head_frags(hs, [&](auto head_frags) {
        constexpr int kHeadFrags = decltype(head_frags)::value;
        if (dq_smem > kSmemLimit)  // head size 128's double buffers: above 48 KiB, which needs an opt-in
          NZ_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dq_wmma_kernel<T, kHeadFrags>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq_smem)));
        dim3 grid(unsigned(ceil_div(Tn, kQRows)), unsigned(NH), unsigned(B));
        flash_backward_dq_wmma_kernel<T, kHeadFrags><<<grid, kQWarps * kWarpSize, dq_smem>>>(dqkv, dout, qkv, lse, D,
                                                                                              Tn, C, NH);
        NZ_CUDA_CHECK_LAUNCH();
        grid = dim3(unsigned(ceil_div(Tn, kKRows)), unsigned(NH), unsigned(B));
        flash_backward_dkdv_wmma_kernel<T, kHeadFrags><<<grid, kKWarps * kWarpSize, wmma_dkdv_smem(hs)>>>(
            dqkv, dout, qkv, lse, D, Tn, C, NH);
        NZ_CUDA_CHECK_LAUNCH();
      });
      return;
    }
  }
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
  template void flash_attention_backward<T>(T*, const T*, const T*, const float*, const T*, int, int, int, int);
NZ_INSTANTIATE(float)
NZ_INSTANTIATE(bf16)
NZ_INSTANTIATE(f16)
#undef NZ_INSTANTIATE

}  // namespace cuda
}  // namespace nz
