// kernels_elementwise.cu — the ops where each output element depends on a few inputs: embedding
// (forward and its gather-style backward), GELU, residual, cast, gradient accumulation, AdamW; and
// GELU's two fusions with the fc layer before it (its bias and GELU forward; GELU's backward and
// the bias gradient).
// Most are one grid-stride loop: thread i handles elements i, i + (all threads), ...
#include "column_sum.cuh"   // add_column_sums: the bias gradient of gelu_backward_bias
#include "cuda_common.cuh"  // load/store, grid_for, NZ_CUDA_CHECK_LAUNCH, kernels.h (nz::kernels)
#include "matmul_cublas.h"  // cublas_matmul_forward: matmul_bias_gelu_forward's product

namespace nz {
namespace cuda {
namespace {

constexpr int kBlock = 256;

// The grid-stride loop: for (i = this thread; i < n; i += threads in the grid)
#define NZ_GRID_STRIDE_LOOP(i, n)                                                    \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n);            \
       i += size_t(gridDim.x) * blockDim.x)

// ---- embedding ----
// out (B,T,C) = wte[tokens[b,t]] + wpe[t]
template <class T>
__global__ void embedding_forward_kernel(T* out, const int* tokens, const T* wte, const T* wpe,
                                         int Tn, int C, size_t total) {
  NZ_GRID_STRIDE_LOOP(i, total) {
    const size_t bt = i / C;
    const int c = int(i % C), t = int(bt % Tn);
    out[i] = store<T>(load(wte[size_t(tokens[bt]) * C + c]) + load(wpe[size_t(t) * C + c]));
  }
}

// dwte[tokens[b,t]] += dout[b,t]. The same token can appear many times, so threads that add
// into the same row would race. Instead of atomics (order-dependent bits), each thread owns a set
// of wte elements outright: thread (c, bucket) owns channel c of every token id with
// id % num_buckets == bucket, and walks all (b,t) positions in order, adding the ones it owns.
// So each dwte element gets its contributions in (b,t) order — the CPU reference's serial order.
constexpr int kTokenBuckets = 32;  // gridDim.y: more buckets, more parallelism, more re-reads of tokens
template <class T>
__global__ void embedding_backward_wte_kernel(T* dwte, const T* dout, const int* tokens, int BT, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int bucket = blockIdx.y;
  if (c >= C) return;
  for (int bt = 0; bt < BT; bt++) {
    const int token = tokens[bt];  // the same address for the whole warp: one broadcast read
    if (token % kTokenBuckets != bucket) continue;
    T* dst = dwte + size_t(token) * C + c;
    *dst = store<T>(load(*dst) + load(dout[size_t(bt) * C + c]));
  }
}

// dwpe[t] += sum_b dout[b,t]: one thread per (t,c) sums b = 0, 1, ... in order, then adds the sum
// to the gradient once (one rounding in bf16), like the CPU reference.
template <class T>
__global__ void embedding_backward_wpe_kernel(T* dwpe, const T* dout, int B, int Tn, int C) {
  const size_t total = size_t(Tn) * C;
  NZ_GRID_STRIDE_LOOP(i, total) {  // i = t*C + c
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += load(dout[size_t(b) * total + i]);
    dwpe[i] = store<T>(load(dwpe[i]) + sum);
  }
}

// ---- the tensor rung's vocabulary pieces: wte holds rows [lo, lo + V) of the vocabulary ----
// out (N,C) = wte[tokens[i] - lo] for the tokens this rank holds, zeros for the others
template <class T>
__global__ void vocab_embedding_forward_kernel(T* out, const int* tokens, const T* wte, int lo, int V, int C,
                                               size_t total) {
  NZ_GRID_STRIDE_LOOP(i, total) {
    const int tok = tokens[i / C] - lo, c = int(i % C);
    out[i] = tok >= 0 && tok < V ? wte[size_t(tok) * C + c] : store<T>(0.0f);
  }
}

// dwte[tokens[i] - lo] += dout[i] for the tokens this rank holds: embedding_backward_wte_kernel's
// ownership (thread (c, bucket) owns channel c of the rows with row % buckets == bucket and walks
// every token in order), so each element gets its contributions in token order, as on the CPU
template <class T>
__global__ void vocab_embedding_backward_kernel(T* dwte, const T* dout, const int* tokens, int lo, int V, int N,
                                                int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int bucket = blockIdx.y;
  if (c >= C) return;
  for (int i = 0; i < N; i++) {
    const int row = tokens[i] - lo;
    if (row < 0 || row >= V || row % kTokenBuckets != bucket) continue;
    T* dst = dwte + size_t(row) * C + c;
    *dst = store<T>(load(*dst) + load(dout[size_t(i) * C + c]));
  }
}

// y (N,C) += b (C)
template <class T>
__global__ void add_bias_kernel(T* y, const T* b, int C, size_t total) {
  NZ_GRID_STRIDE_LOOP(i, total) y[i] = store<T>(load(y[i]) + load(b[i % C]));
}

// ---- GELU, tanh approximation: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

__device__ inline float gelu(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu / dx = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
__device__ inline float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float th = tanhf(u);
  const float sech2 = 1.0f - th * th;
  const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx;
}

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
  NZ_GRID_STRIDE_LOOP(i, n) out[i] = store<T>(gelu(load(inp[i])));
}

template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  NZ_GRID_STRIDE_LOOP(i, n) dinp[i] = store<T>(gelu_grad(load(inp[i])) * load(dout[i]));
}

// Fused with the fc layer before it (matmul_bias_gelu_forward): fc (N,OC) holds inp @ w^T from
// cuBLAS; add the bias (may be null), round to T, and write both fc and gelu(fc) in the same pass.
template <class T>
__global__ void bias_gelu_kernel(T* fc, T* fcg, const T* bias, int OC, size_t total) {
  NZ_GRID_STRIDE_LOOP(i, total) {
    const T v = store<T>(bias ? load(fc[i]) + load(bias[i % OC]) : load(fc[i]));
    fc[i] = v;
    fcg[i] = store<T>(gelu(load(v)));
  }
}

// Fused with the bias gradient (gelu_backward_bias): each element's gradient is computed, stored,
// and handed to the column sums (column_sum.cuh) as it was stored, so dbias is the column sum of
// dinp without a second pass reading dinp back. Pass 1 of the column sums visits every element
// exactly once, so every element of dinp is written exactly once. dinp may alias dout.
template <class T>
struct GeluBackwardTerm {
  T* dinp;
  const T* inp;
  const T* dout;
  int OC;
  __device__ void operator()(int n, int o, float (&v)[1]) const {
    const size_t i = size_t(n) * OC + o;
    const T d = store<T>(gelu_grad(load(inp[i])) * load(dout[i]));
    dinp[i] = d;
    v[0] = load(d);
  }
};

// ---- residual: out = a + b (out may alias a or b: each element is read, then written, by one thread)
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t n) {
  NZ_GRID_STRIDE_LOOP(i, n) out[i] = store<T>(load(a[i]) + load(b[i]));
}

// ---- cast: dst = src converted; float -> bf16 rounds to nearest even (nz::store) ----
template <class D, class S>
__global__ void cast_kernel(D* dst, const S* src, size_t n) {
  NZ_GRID_STRIDE_LOOP(i, n) dst[i] = store<D>(load(src[i]));
}

// ---- accumulate: dst = (first ? 0 : dst) + src * scale ----
// Written with __fmul_rn / __fadd_rn, which nvcc never fuses into an FMA: offload accumulates its
// gradients on the CPU (two roundings), and must get the bits stage2 gets here (cuda_common.cuh).
template <class T>
__global__ void accumulate_kernel(T* dst, const T* src, size_t n, float scale, bool first) {
  NZ_GRID_STRIDE_LOOP(i, n) {
    const float add = __fmul_rn(load(src[i]), scale);
    dst[i] = store<T>(first ? add : __fadd_rn(load(dst[i]), add));
  }
}

// ---- AdamW on fp32 master weights; the gradient may be bf16 ----
// bias_correction1 = 1 - beta1^t and bias_correction2 = 1 - beta2^t are computed once on the host.
template <class T>
__global__ void adamw_kernel(float* p, float* m, float* v, const T* g, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, float bias_correction1, float bias_correction2) {
  // Every product and sum rounded on its own (__fmul_rn, __fadd_rn: never fused into an FMA), in
  // the CPU's order (nz::cpu::adamw_update): offload and infinity run AdamW on the CPU, and train the
  // same bits as stage2 and stage3 only if the GPU rounds where the CPU does.
  NZ_GRID_STRIDE_LOOP(i, n) {
    const float grad = __fmul_rn(load(g[i]), grad_scale);  // grad_scale: global-norm clipping
    const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(1.0f - beta1, grad));
    const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(1.0f - beta2, grad), grad));
    m[i] = mi;
    v[i] = vi;
    const float m_hat = __fdiv_rn(mi, bias_correction1), v_hat = __fdiv_rn(vi, bias_correction2);
    // Decoupled weight decay: the decay term uses the parameter, not the gradient.
    const float update = __fadd_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), eps)), __fmul_rn(weight_decay, p[i]));
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, update));
  }
}

}  // namespace

// ---- the launchers (declared in kernel_table.inc) ----

template <class T>
void embedding_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  const size_t total = size_t(B) * Tn * C;
  if (total == 0) return;
  embedding_forward_kernel<T><<<grid_for(total, kBlock), kBlock>>>(out, tokens, wte, wpe, Tn, C, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C) {
  if (size_t(B) * Tn * C == 0) return;
  if (dwte) {
    const int block = 128;
    const dim3 grid(unsigned(ceil_div(C, block)), kTokenBuckets);
    embedding_backward_wte_kernel<T><<<grid, block>>>(dwte, dout, tokens, B * Tn, C);
    NZ_CUDA_CHECK_LAUNCH();
  }
  if (dwpe) {
    embedding_backward_wpe_kernel<T><<<grid_for(size_t(Tn) * C, kBlock), kBlock>>>(dwpe, dout, B, Tn, C);
    NZ_CUDA_CHECK_LAUNCH();
  }
}

template <class T>
void vocab_embedding_forward(T* out, const int* tokens, const T* wte, int lo, int V, int N, int C) {
  const size_t total = size_t(N) * C;
  if (total == 0) return;
  vocab_embedding_forward_kernel<T><<<grid_for(total, kBlock), kBlock>>>(out, tokens, wte, lo, V, C, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void vocab_embedding_backward(T* dwte, const T* dout, const int* tokens, int lo, int V, int N, int C) {
  if (size_t(N) * C == 0) return;
  const int block = 128;
  const dim3 grid(unsigned(ceil_div(C, block)), kTokenBuckets);
  vocab_embedding_backward_kernel<T><<<grid, block>>>(dwte, dout, tokens, lo, V, N, C);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void add_bias(T* y, const T* b, int N, int C) {
  const size_t total = size_t(N) * C;
  if (total == 0) return;
  add_bias_kernel<T><<<grid_for(total, kBlock), kBlock>>>(y, b, C, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  if (n == 0) return;
  gelu_forward_kernel<T><<<grid_for(n, kBlock), kBlock>>>(out, inp, n);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  if (n == 0) return;
  gelu_backward_kernel<T><<<grid_for(n, kBlock), kBlock>>>(dinp, inp, dout, n);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_backward_bias(T* dinp, T* dbias, const T* inp, const T* dout, int N, int OC) {
  if (!dbias) return gelu_backward(dinp, inp, dout, size_t(N) * OC);
  add_column_sums(ColumnSumOutputs<T, 1>{{dbias}}, GeluBackwardTerm<T>{dinp, inp, dout, OC}, N, OC);
}

// fc = inp @ w^T + bias, fcg = gelu(fc). Reference kernels: the two ops one after the other (the
// tiled matmul adds the bias). Fast: cuBLAS writes the product alone (beta = 0) and one kernel adds
// the bias and applies the GELU, instead of a bias broadcast before cuBLAS and a GELU kernel after.
// In bf16 and fp16 the product is then rounded to T before the bias is added (twice where the CPU
// rounds once): the price of not keeping an fp32 copy of the (N,OC) product; within the tests'
// tolerances.
template <class T>
void matmul_bias_gelu_forward(T* fc, T* fcg, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  const size_t total = size_t(N) * OC;
  if (total == 0) return;
  if (kernels() == Kernels::Reference) {
    matmul_forward(fc, inp, w, bias, N, C, OC);
    gelu_forward(fcg, fc, total);
    return;
  }
  cublas_matmul_forward(fc, inp, w, N, C, OC, /*accumulate=*/false);
  bias_gelu_kernel<T><<<grid_for(total, kBlock), kBlock>>>(fc, fcg, bias, OC, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
  if (n == 0) return;
  residual_forward_kernel<T><<<grid_for(n, kBlock), kBlock>>>(out, a, b, n);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class D, class S>
void cast(D* dst, const S* src, size_t n) {
  if (n == 0) return;
  cast_kernel<D, S><<<grid_for(n, kBlock), kBlock>>>(dst, src, n);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void accumulate(T* dst, const T* src, size_t n, float scale, bool first) {
  if (n == 0) return;
  accumulate_kernel<T><<<grid_for(n, kBlock), kBlock>>>(dst, src, n, scale, first);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void adamw_update(float* p, float* m, float* v, const T* g, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t) {
  if (n == 0) return;
  const float bias_correction1 = 1.0f - powf(beta1, float(t));
  const float bias_correction2 = 1.0f - powf(beta2, float(t));
  adamw_kernel<T><<<grid_for(n, kBlock), kBlock>>>(p, m, v, g, n, lr, beta1, beta2, eps, weight_decay,
                                                  grad_scale, bias_correction1, bias_correction2);
  NZ_CUDA_CHECK_LAUNCH();
}

// explicit instantiations: kernel_table.inc's entries with cuda file elementwise (float, bf16, fp16)
#define NZ_INSTANTIATE_CUDA_elementwise
#include "kernels/kernel_instantiate.inc"

#undef NZ_GRID_STRIDE_LOOP

}  // namespace cuda
}  // namespace nz
