// kernels_cpu.cpp — the fast CPU backend: every op of the GPT model, forward beside backward (the
// textbook version of each, the one to read first, is in kernels_ref.cpp; tests/kernels/test_kernels_ref.cpp
// checks these against it).
//
// One plain function per op over raw row-major arrays, shapes in the comments. T is the storage
// type (float, bf16, or double for the finite-difference tests); all arithmetic is done in
// A = acc_t<T> through nz::load() / nz::store<T>(), so a bf16 tensor is read into fp32, computed on
// in fp32 and rounded (to nearest even) once, when it is stored.
//
// Determinism. The trainers are compared bit for bit, so every kernel here gives the same bits
// every run for the same shapes and thread count. The loops written here do more: each output
// element is computed by exactly one thread and every sum runs in a fixed order, whatever the
// number of threads; no reduction is ever split across threads, no atomics. Reductions over rows
// (weight and bias gradients) are therefore parallelized over the OUTPUT (channels), each thread
// walking all rows in order. The matrix products go to the BLAS, which keeps the same promise
// (blas_gemm() below says why).
//
// Speed: the matrix products (most of the time of a step) are BLAS calls, attention's as a batch
// over all heads; a layer's bf16 products go to the CPU's bf16 instructions (gemm_bf16.h); softmax and GELU use exp_vec(), an exp the compiler can vectorize; sum_squares
// adds in the CUDA kernel's fixed order (65,536 running sums, then trees), vectorized. dev/bench/bench_kernels times every kernel, `make bench` a step.
//
// Conventions (kernels.h): weight/bias gradients accumulate (+=), input gradients are overwritten
// (=), a null bias / dbias / dinp pointer means "none".
#include <algorithm>    // std::min, std::max
#include <cmath>        // std::exp, std::log, std::sqrt, std::nearbyint, powf
#include <cstdint>      // uint32_t, int32_t (exp_vec builds 2^n from its bits)
#include <cstring>      // std::memmove, std::memcpy
#include <type_traits>  // std::is_same_v
#include <vector>       // the per-thread scratch buffer

#include <cblas.h>  // cblas_sgemm, cblas_dgemm (OpenBLAS, OpenMP build: see the Makefile)
#include <omp.h>    // omp_in_parallel

#include "runtime/check.h"      // NZ_CHECK
#include "runtime/device.h"     // current_device (flash_attention_in_force)
#include "kernels/gemm_bf16.h"  // bf16_gemm: bf16 products on the CPU's bf16 instructions
#include "kernels/kernels.h"    // the declarations (kernel_table.inc in nz::cpu), set_kernels
#include "kernels/cuda/flash_attention.h"  // cuda::flash_attention_fits (a header function: no CUDA needed)

namespace nz {

// --kernels: which kernels ops.h runs (kernels.h). One switch for both backends.
static Kernels g_kernels = Kernels::Fast;
void set_kernels(Kernels k) { g_kernels = k; }
Kernels kernels() { return g_kernels; }
// --attention: which attention the CUDA fast path runs (kernels.h).
static Attention g_attention = Attention::Gemm;
void set_attention(Attention a) { g_attention = a; }
Attention attention() { return g_attention; }
bool flash_attention_in_force(int C, int NH) {  // the CPU has no flash attention
  return current_device() == Device::CUDA && g_kernels == Kernels::Fast && g_attention == Attention::Flash &&
         cuda::flash_attention_fits(C, NH);
}

namespace cpu {

namespace {

// Channels handled together by one thread when a gradient is summed over rows: long enough for
// contiguous (vectorizable) inner loops, short enough to keep the partial sums on the stack.
constexpr int kChannelBlock = 64;

// A scratch buffer of n elements, kept from one call to the next, so that the training loop does
// not allocate. One buffer per thread (and element type): inside a parallel region each thread
// gets its own. A kernel asks for it once and carves it up; it only grows.
template <class A>
A* scratch(size_t n) {
  static thread_local std::vector<A> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// cond ? a : b, written with an integer bit mask. The compiler vectorizes this form; a plain ?: on
// floats it leaves as a branch under strict IEEE flags (-ftrapping-math), and the loop unvectorized.
inline float select(bool cond, float a, float b) {
  uint32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  const uint32_t mask = 0u - uint32_t(cond);  // all ones if cond, else zero
  const uint32_t bits = (ia & mask) | (ib & ~mask);
  float r;
  std::memcpy(&r, &bits, 4);
  return r;
}

// exp(x) for the softmax and GELU loops. std::exp is a library call, one element at a time, and
// was the largest cost after the matmuls; this one is plain arithmetic that the loops vectorize.
//   exp(x) = 2^n * exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2],
// exp(r) by its Taylor series up to r^7/7! (within 2 ulp of the true value), and 2^n made from
// its bits. Outside [-87, 88] a float exp is (nearly) 0 or inf: n is computed from x clamped to
// that range (so that 2^n is a normal float) and the 0 or inf is put back at the end. r is
// computed from x itself, so a NaN stays NaN.
inline float exp_vec(float x) {
  const float xc = select(x >= -87.0f, select(x <= 88.0f, x, 88.0f), -87.0f);  // NaN -> -87
  const float n = std::nearbyint(xc * 1.44269504f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts; n * 0.693359375 is exact
  float p = 1.0f / 5040;  // Horner's rule for sum_k r^k / k!, k = 7 down to 0
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 1.0f / 2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;  // 2^n: exponent field n + 127, mantissa 0
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return select(x < -87.0f, 0.0f, select(x > 88.0f, INFINITY, p * two_n));
}
// The double-precision build (finite-difference tests) keeps the library exp.
inline double exp_vec(double x) { return std::exp(x); }

// GELU (GPT-2's tanh approximation) as x * sig, sig = sigmoid(2u) = 0.5 (1 + tanh u),
// u = sqrt(2/pi) (x + 0.044715 x^3): gelu_forward below says why. One definition of each, used by
// the plain GELU kernels and by the fused ones, so that both give the same bits.
template <class A>
inline A gelu_sigmoid(A x) {
  const A s = A(0.7978845608028654);  // sqrt(2/pi)
  const A k = A(0.044715);
  const A u = s * (x + k * x * x * x);
  return A(1) / (A(1) + exp_vec(A(-2) * u));
}
template <class A>
inline A gelu_of(A x) {
  return x * gelu_sigmoid(x);
}
// d/dx [x sig] = sig + x * 2 sig (1 - sig) * du/dx,  du/dx = s (1 + 3 k x^2)
template <class A>
inline A gelu_grad_of(A x) {
  const A s = A(0.7978845608028654);
  const A k = A(0.044715);
  const A sig = gelu_sigmoid(x);
  return sig + x * A(2) * sig * (A(1) - sig) * s * (A(1) + A(3) * k * x * x);
}

// ---------------------------------------------------------------------------------------------
// Matrix products: one BLAS call each (sgemm, or dgemm for the double-precision tests).
//   c (M,N) = alpha * op(a) (M,K) @ op(b) (K,N),   op(x) = x or x^T,   row-major, c overwritten
// A BLAS packs blocks of a and b into its caches and runs a register-tiled kernel written for this
// very processor: 80-90% of the machine's peak, where a portable loop gets a fraction of it. (The
// textbook triple loop, the lesson, is nz::ref::matmul_forward.)
//
// Determinism. The library splits the work among threads by blocks of rows and columns of c, never
// along K, and sums each element's K terms in an order fixed by the shapes alone (its own block
// sizes and kernel for this processor). So a call gives the same bits every time for the same
// shapes and thread count — which is all the stages' bitwise comparisons need, since every stage
// calls it with the same shapes on as many threads. (With OpenBLAS's kernels for Intel's AVX-512
// processors the bits are the same at any thread count too; with its Haswell kernels, which 0.3.21
// also picks for processors it does not know, such as AMD's Zen 5, they are not:
// tests/kernels/test_kernels.cpp checks what holds everywhere.) The order differs from nz::ref's plain
// k = 0, 1, ... loop, so fast and reference agree within a rounding bound, not bit for bit:
// tests/kernels/test_kernels_ref.cpp derives and checks it.
//
// Threads. OpenBLAS is linked in its OpenMP build (Makefile), so it runs on the same pool of
// threads as the loops here (sized per rank by the trainer: cores / ranks on the machine). Called
// from inside a parallel region — attention's heads — it runs on the calling thread alone.
inline void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* a, int lda,
                      const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, a, lda, b, ldb, 0.0f, c, ldc);
}
inline void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* a, int lda,
                      const double* b, int ldb, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, a, lda, b, ldb, 0.0, c, ldc);
}

}  // namespace

// A matrix of A values as the BLAS reads it: first element and distance between rows. Outside the
// anonymous namespace because matmul_backward's lambda holds one: GCC warns (-Wsubobject-linkage)
// when a kernel instantiated from an included file (kernel_instantiate.inc) holds a private type.
template <class A>
struct View {
  const A* p;
  int ld;
};

namespace {

// rows x cols of src (rows ld apart) as A values. fp32 and fp64 are used where they are, with no
// copy; bf16 is widened into buf (rows contiguous), which is exact: every bf16 is an fp32.
template <class A, class T>
View<A> as_acc(const T* src, int rows, int cols, int ld, A* buf) {
  if constexpr (std::is_same_v<T, A>) {
    return {src, ld};
  } else {
#pragma omp parallel for schedule(static) if (size_t(rows) * cols >= (1u << 16) && !omp_in_parallel())
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) buf[size_t(r) * cols + c] = load(src[size_t(r) * ld + c]);
    return {buf, cols};
  }
}

// Where a product of A values lands before it is stored as T: the destination itself when T = A
// (the BLAS writes it, row stride ld), else buf (rows contiguous), stored by store_rows() below.
template <class A, class T>
A* acc_dest(T* dst, A* buf) {
  if constexpr (std::is_same_v<T, A>) return dst;
  else return buf;
}
template <class A, class T>
int acc_ld(int ld, int cols) {
  return std::is_same_v<T, A> ? ld : cols;
}
// dst (rows,cols, rows ld apart) = buf rounded to T; nothing to do when the BLAS wrote dst itself.
template <class A, class T>
void store_rows(T* dst, int ld, const A* buf, int rows, int cols) {
  if constexpr (!std::is_same_v<T, A>)
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) dst[size_t(r) * ld + c] = store<T>(buf[size_t(r) * cols + c]);
}

// A product in the storage type itself, where the hardware has one: bf16 operands on the CPU's bf16
// dot-product instructions (gemm_bf16.h), with nothing widened. Returns false for fp32 and fp64
// (sgemm/dgemm read them as they are) and where this CPU has no bf16 instructions: the caller then
// widens the operands and calls blas_gemm().
template <class T>
bool gemm_native(bool ta, bool tb, int M, int N, int K, const T* a, int lda, const T* b, int ldb,
                 float* c, int ldc) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_gemm(ta, tb, M, N, K, a, lda, b, ldb, c, ldc);
  else return false;
}
template <class T>
bool gemm_native(bool, bool, int, int, int, const T*, int, const T*, int, double*, int) {
  return false;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// embedding

// out (B,T,C) = wte[tokens[b,t]] + wpe[t];   tokens (B,T), wte (V,C), wpe (maxT,C)
template <class T>
void embedding_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < Tn; t++) {
      size_t bt = size_t(b) * Tn + t;
      const T* tok_row = wte + size_t(tokens[bt]) * C;
      const T* pos_row = wpe + size_t(t) * C;
      T* out_bt = out + bt * C;
      for (int c = 0; c < C; c++) out_bt[c] = store<T>(load(tok_row[c]) + load(pos_row[c]));
    }
  }
}

// dwte[tokens[b,t]] += dout[b,t];   dwpe[t] += sum_b dout[b,t];   dout (B,T,C)
// A token may occur many times, so rows of dwte are shared between (b,t): parallelizing over
// (b,t) would race. Instead each thread owns a block of channels and walks all (b,t) in order.
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kChannelBlock) {
    const int c1 = std::min(c0 + kChannelBlock, C);
    // token embedding: one += per occurrence, in (b,t) order (in bf16, one rounding per occurrence)
    for (size_t bt = 0; dwte && bt < size_t(B) * Tn; bt++) {
      T* dw = dwte + size_t(tokens[bt]) * C;
      const T* d = dout + bt * C;
      for (int c = c0; c < c1; c++) dw[c] = store<T>(load(dw[c]) + load(d[c]));
    }
    // position embedding: sum the B contributions first, then add to the gradient once
    for (int t = 0; dwpe && t < Tn; t++) {
      A sum[kChannelBlock] = {};
      for (int b = 0; b < B; b++) {
        const T* d = dout + (size_t(b) * Tn + t) * C;
        for (int c = c0; c < c1; c++) sum[c - c0] += load(d[c]);
      }
      T* dw = dwpe + size_t(t) * C;
      for (int c = c0; c < c1; c++) dw[c] = store<T>(load(dw[c]) + sum[c - c0]);
    }
  }
}

// The tensor rung's vocabulary pieces and bias: one pass over the data each, the reference's loops
// (kernels_ref.cpp) are fast enough
template <class T>
void vocab_embedding_forward(T* out, const int* tokens, const T* wte, int lo, int V, int N, int C) {
  ref::vocab_embedding_forward(out, tokens, wte, lo, V, N, C);
}
template <class T>
void vocab_embedding_backward(T* dwte, const T* dout, const int* tokens, int lo, int V, int N, int C) {
  ref::vocab_embedding_backward(dwte, dout, tokens, lo, V, N, C);
}
template <class T>
void add_bias(T* y, const T* b, int N, int C) {
  ref::add_bias(y, b, N, C);
}

// ---------------------------------------------------------------------------------------------
// layer norm

namespace {
// One row of layer norm: y (C) = (x - mean) * rstd * w + b (b may be null); *mean, *rstd saved.
template <class T>
inline void layernorm_row(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* w, const T* b, int C) {
  using A = acc_t<T>;
  const A eps = A(1e-5);
  A m = A(0);
  for (int c = 0; c < C; c++) m += load(x[c]);
  m /= A(C);
  // two passes (sum of squared deviations) rather than E[x^2] - E[x]^2, which cancels badly
  A var = A(0);
  for (int c = 0; c < C; c++) {
    A d = load(x[c]) - m;
    var += d * d;
  }
  var /= A(C);
  const A s = A(1) / std::sqrt(var + eps);
  for (int c = 0; c < C; c++) {
    A v = (load(x[c]) - m) * s * load(w[c]);
    y[c] = store<T>(b ? v + load(b[c]) : v);
  }
  *mean = m;
  *rstd = s;
}
}  // namespace

// out (N,C) = (inp - mean) * rstd * w + b, per row;   w, b (C);   mean, rstd (N) saved
template <class T>
void layernorm_forward(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* inp, const T* w, const T* b,
                       int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++)
    layernorm_row(out + size_t(n) * C, mean + n, rstd + n, inp + size_t(n) * C, w, b, C);
}

// res (N,C) = a + b rounded to T (res may alias a or b), then out = layernorm(res), row by row: the
// row of res is normalized while it is still in cache, instead of in a second pass over memory.
// The same bits as residual_forward then layernorm_forward (the same expressions, in the same order).
template <class T>
void residual_layernorm_forward(T* res, T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* a, const T* b,
                                const T* w, const T* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const size_t row = size_t(n) * C;
    for (int c = 0; c < C; c++) res[row + c] = store<T>(load(a[row + c]) + load(b[row + c]));
    layernorm_row(out + row, mean + n, rstd + n, res + row, w, bias, C);
  }
}

// With norm = (x - mean) * rstd and dnorm = w * dout, per row:
//   dinp = dskip + rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))   (overwrite)
//   dw += sum_n dout * norm;   db += sum_n dout                                     (accumulate)
// dskip: the gradient of the skip connection beside the layer norm, added while the row is at hand
// (null: none). The layer norm's part is rounded to T before the add, as when it was stored and
// added by residual_forward: the same bits as the two ops.
template <class T>
void layernorm_backward_residual(T* dinp, T* dw, T* db, const T* dskip, const T* dout, const T* inp,
                                 const T* w, const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  using A = acc_t<T>;
  // dinp: rows are independent
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* x = inp + size_t(n) * C;
    const T* d = dout + size_t(n) * C;
    const A m = mean[n], s = rstd[n];
    A dnorm_mean = A(0), dnorm_norm_mean = A(0);
    for (int c = 0; c < C; c++) {
      A norm = (load(x[c]) - m) * s;
      A dnorm = load(w[c]) * load(d[c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= A(C);
    dnorm_norm_mean /= A(C);
    T* di = dinp + size_t(n) * C;
    const T* skip = dskip ? dskip + size_t(n) * C : nullptr;
    for (int c = 0; c < C; c++) {
      A norm = (load(x[c]) - m) * s;
      A dnorm = load(w[c]) * load(d[c]);
      const T g = store<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
      di[c] = skip ? store<T>(load(skip[c]) + load(g)) : g;
    }
  }
  // dw, db: sums over rows, so each thread owns a block of channels and walks the rows in order.
  // The row sum is formed first and added to the gradient once (one rounding per call in bf16).
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kChannelBlock) {
    const int c1 = std::min(c0 + kChannelBlock, C);
    A dw_sum[kChannelBlock] = {}, db_sum[kChannelBlock] = {};
    for (int n = 0; n < N; n++) {
      const T* x = inp + size_t(n) * C;
      const T* d = dout + size_t(n) * C;
      const A m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; c++) {
        A norm = (load(x[c]) - m) * s;
        dw_sum[c - c0] += load(d[c]) * norm;
        db_sum[c - c0] += load(d[c]);
      }
    }
    for (int c = c0; c < c1; c++) {
      if (dw) dw[c] = store<T>(load(dw[c]) + dw_sum[c - c0]);
      if (db) db[c] = store<T>(load(db[c]) + db_sum[c - c0]);
    }
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  layernorm_backward_residual(dinp, dw, db, static_cast<const T*>(nullptr), dout, inp, w, mean, rstd, N, C);
}

// ---------------------------------------------------------------------------------------------
// matmul (a linear layer): three products, one BLAS call each (blas_gemm above)

namespace {
// The product y (N,OC) = inp (N,C) @ w^T in A, before any bias and before the rounding to T: in out
// itself where T = A (the BLAS writes it there), else in this thread's scratch. In bf16 the product
// runs on the CPU's bf16 instructions where it has them (gemm_native), else the operands are widened
// to fp32 (exactly) for sgemm; either way the sum is an fp32 sum. matmul_forward and
// matmul_bias_gelu_forward finish it, rounding once when they store.
template <class T>
acc_t<T>* linear_product(T* out, const T* inp, const T* w, int N, int C, int OC) {
  using A = acc_t<T>;
  const bool widen = !std::is_same_v<T, A>;
  A* buf = scratch<A>(widen ? (size_t(N) * C + size_t(OC) * C + size_t(N) * OC) : 0);
  A* y = acc_dest<A>(out, buf + size_t(N) * C + size_t(OC) * C);
  if (!gemm_native(false, true, N, OC, C, inp, C, w, C, y, OC)) {
    const View<A> x = as_acc(inp, N, C, C, buf);
    const View<A> wa = as_acc(w, OC, C, C, buf + size_t(N) * C);
    blas_gemm(false, true, N, OC, C, A(1), x.p, x.ld, wa.p, wa.ld, y, OC);
  }
  return y;
}
}  // namespace

// out (N,OC) = inp (N,C) @ w^T + bias;   w (OC,C) (PyTorch's layout: one row per output), bias (OC)
// The sum is formed first (linear_product) and the bias added to it, as in nz::ref.
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  using A = acc_t<T>;
  if (N == 0 || OC == 0) return;
  const A* y = linear_product(out, inp, w, N, C, OC);
  if (!bias && std::is_same_v<T, A>) return;  // the BLAS wrote out, and there is nothing to add
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const A* yr = y + size_t(n) * OC;
    T* out_n = out + size_t(n) * OC;
    if (bias) {
#pragma omp simd  // in fp32 yr is out_n itself: each element is read before it is written
      for (int o = 0; o < OC; o++) out_n[o] = store<T>(yr[o] + load(bias[o]));
    } else {
#pragma omp simd
      for (int o = 0; o < OC; o++) out_n[o] = store<T>(yr[o]);
    }
  }
}

// fc (N,OC) = inp @ w^T + bias;   fcg (N,OC) = gelu(fc)   (the MLP's first layer and its GELU)
// The bias, the rounding to T and the GELU of the rounded value in one pass over the product, where
// matmul_forward then gelu_forward make two: the same bits (the same expressions), fewer passes.
template <class T>
void matmul_bias_gelu_forward(T* fc, T* fcg, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  using A = acc_t<T>;
  if (N == 0 || OC == 0) return;
  const A* y = linear_product(fc, inp, w, N, C, OC);
  // In fp32 y is fc itself (each element read before it is written): `omp simd` says the lanes may
  // run together anyway, and the bias test is outside the loop, so the GELU's exp runs 8 or 16
  // elements at a time. Each lane computes exactly what the scalar loop does: the same bits.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const A* yr = y + size_t(n) * OC;
    T* f = fc + size_t(n) * OC;
    T* g = fcg + size_t(n) * OC;
    if (bias) {
#pragma omp simd
      for (int o = 0; o < OC; o++) {
        const T v = store<T>(yr[o] + load(bias[o]));
        f[o] = v;
        g[o] = store<T>(gelu_of(load(v)));
      }
    } else {
#pragma omp simd
      for (int o = 0; o < OC; o++) {
        const T v = store<T>(yr[o]);
        f[o] = v;
        g[o] = store<T>(gelu_of(load(v)));
      }
    }
  }
}

// dinp (N,C) = dout (N,OC) @ w (OC,C)        (overwrite; skipped if dinp is null)
// dw (OC,C)  += dout^T (OC,N) @ inp (N,C)    (accumulate; skipped if null)
// dbias (OC) += sum_n dout[n,:]              (accumulate; skipped if null)
// Each finished sum is added to the gradient once (the product goes to scratch first, not into dw
// with the BLAS's beta = 1, which would add it block by block of N): a second call adds exactly
// the same amount again, as in nz::ref.
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C,
                     int OC) {
  using A = acc_t<T>;
  if (N == 0) return;  // nothing flows back; weight gradients are unchanged
  const bool widen = !std::is_same_v<T, A>;
  // scratch: dout, inp, w widened (bf16 only), then the product (dw's always; dinp's in bf16)
  const size_t n_dout = size_t(N) * OC, n_inp = size_t(N) * C, n_w = size_t(OC) * C;
  A* buf = scratch<A>((widen ? n_dout + n_inp + n_w + n_inp : 0) + n_w);
  A* prod = buf + (widen ? n_dout + n_inp + n_w + n_inp : 0);
  // dout widened at most once, for whichever product needs it (none where gemm_native runs both)
  View<A> d{nullptr, 0};
  auto widened_dout = [&] {
    if (!d.p) d = as_acc(dout, N, OC, OC, buf);
    return d;
  };
  if (dinp) {
    A* y = acc_dest<A>(dinp, buf + n_dout + n_inp + n_w);
    if (!gemm_native(false, false, N, C, OC, dout, OC, w, C, y, C)) {
      const View<A> wa = as_acc(w, OC, C, C, buf + n_dout + n_inp);
      blas_gemm(false, false, N, C, OC, A(1), widened_dout().p, widened_dout().ld, wa.p, wa.ld, y, C);
    }
    if (widen) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n_inp; i++) dinp[i] = store<T>(y[i]);
    }
  }
  if (dw) {
    if (!gemm_native(true, false, OC, C, N, dout, OC, inp, C, prod, C)) {
      const View<A> x = as_acc(inp, N, C, C, buf + n_dout);
      blas_gemm(true, false, OC, C, N, A(1), widened_dout().p, widened_dout().ld, x.p, x.ld, prod, C);
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n_w; i++) dw[i] = store<T>(load(dw[i]) + prod[i]);
  }
  if (dbias) {  // each thread owns a block of outputs and walks the rows in order
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += kChannelBlock) {
      const int o1 = std::min(o0 + kChannelBlock, OC);
      A sum[kChannelBlock] = {};
      for (int n = 0; n < N; n++)
        for (int o = o0; o < o1; o++) sum[o - o0] += load(dout[size_t(n) * OC + o]);
      for (int o = o0; o < o1; o++) dbias[o] = store<T>(load(dbias[o]) + sum[o - o0]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// causal multi-head self-attention, as batched products over all heads
//
// qkv (B,T,3C) = [q | k | v], head h is columns h*hs .. h*hs+hs-1 of each, hs = C/NH. Per (b, h),
// with Q, K, V the (T,hs) slices of this head (rows 3C apart in qkv):
//   S = Q K^T * scale (T,T),  scale = 1/sqrt(hs)
//   P = softmax of each row t of S over t2 <= t, 0 above the diagonal (causal)
//   out = P V (T,hs)
// The B*NH heads are one batch of independent tasks shared out among the threads; each task's
// products are BLAS calls on the head's slices in place (a slice of qkv is a matrix with rows 3C
// apart), run on that task's thread. Nothing is shared between tasks, so the threads never wait.
//
// The causal half: rows are taken in blocks of kAttRows. Block [t0, t1) of S needs only columns
// 0 .. t1-1 (the rest is masked), and block [t0, t1) of P V only rows 0 .. t1-1 of V (P is 0
// beyond): at T = 256 that is 56% of the full products. (The masked entries a block does compute,
// above the diagonal inside it, are never read; P's are set to 0, and 0 * v adds nothing.)
constexpr int kAttRows = 32;

// att (B,NH,T,T): the probabilities P, saved for the backward; out (B,T,C): this head's columns.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  using A = acc_t<T>;
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int hs = C / NH, C3 = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
  const size_t head = size_t(Tn) * hs;
#pragma omp parallel
  {
    // per thread: S then P (T,T) in A (P is used before it is rounded to T); in bf16 also the
    // head's Q, K, V widened and its output before rounding (T,hs) each
    const bool widen = !std::is_same_v<T, A>;
    A* p = scratch<A>(size_t(Tn) * Tn + (widen ? 4 * head : 0));
    A* wbuf = p + size_t(Tn) * Tn;
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const T* qkv_bh = qkv + size_t(b) * Tn * C3 + size_t(h) * hs;  // row t of Q at + t * 3C
        const View<A> q = as_acc(qkv_bh, Tn, hs, C3, wbuf);
        const View<A> k = as_acc(qkv_bh + C, Tn, hs, C3, wbuf + head);
        const View<A> v = as_acc(qkv_bh + 2 * C, Tn, hs, C3, wbuf + 2 * head);
        T* o = out + size_t(b) * Tn * C + size_t(h) * hs;  // rows C apart
        A* y = acc_dest<A>(o, wbuf + 3 * head);
        const int ldy = acc_ld<A, T>(C, hs);
        for (int t0 = 0; t0 < Tn; t0 += kAttRows) {
          const int t1 = std::min(t0 + kAttRows, Tn);
          // S rows t0 .. t1-1, columns 0 .. t1-1
          blas_gemm(false, true, t1 - t0, t1, hs, scale, q.p + size_t(t0) * q.ld, q.ld, k.p, k.ld,
                    p + size_t(t0) * Tn, Tn);
          for (int t = t0; t < t1; t++) {  // P, row by row
            A* row = p + size_t(t) * Tn;
            A maxval = A(-INFINITY);  // subtracted before exp so that exp cannot overflow
            for (int t2 = 0; t2 <= t; t2++) maxval = std::max(maxval, row[t2]);
            for (int t2 = 0; t2 <= t; t2++) row[t2] = exp_vec(row[t2] - maxval);  // (vectorized)
            A sum = A(0);
            for (int t2 = 0; t2 <= t; t2++) sum += row[t2];  // (in order)
            const A inv_sum = A(1) / sum;
            for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv_sum;
            for (int t2 = t + 1; t2 < Tn; t2++) row[t2] = A(0);  // masked (causal)
            T* att_row = att + ((size_t(b) * NH + h) * Tn + t) * Tn;
            for (int t2 = 0; t2 < Tn; t2++) att_row[t2] = store<T>(row[t2]);
          }
          // out rows t0 .. t1-1 = P[t0:t1, 0:t1] V[0:t1]
          blas_gemm(false, false, t1 - t0, hs, t1, A(1), p + size_t(t0) * Tn, Tn, v.p, v.ld,
                    y + size_t(t0) * ldy, ldy);
        }
        store_rows(o, C, y, Tn, hs);
      }
    }
  }
}

// dqkv (B,T,3C) (overwrite), from dout (B,T,C) and the saved att. Per (b, h), with P = att and
// dO = this head's columns of dout (T,hs), backwards through out = P V, the softmax, and S:
//   dV = P^T dO
//   dP = dO V^T
//   dS[t,t2] = P[t,t2] * (dP[t,t2] - sum_t3 P[t,t3] dP[t,t3]) * scale      (0 above the diagonal)
//   dQ = dS K,   dK = dS^T Q
// The same batch of heads, the same causal blocks: dP and dQ by blocks of rows as in the forward;
// dK and dV by blocks of their rows t2, whose columns of dS and P are 0 above row t2, so block
// [t0, t1) sums over t = t0 .. T-1 only.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const T* /*out*/, int B, int Tn, int C,
                        int NH) {
  using A = acc_t<T>;
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int hs = C / NH, C3 = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
  const size_t head = size_t(Tn) * hs;
#pragma omp parallel
  {
    // per thread: dP then dS (T,T) in A; in bf16 also P (T,T), the head's Q, K, V, dO widened and
    // its dQ, dK, dV before rounding
    const bool widen = !std::is_same_v<T, A>;
    A* ds = scratch<A>(size_t(Tn) * Tn + (widen ? size_t(Tn) * Tn + 7 * head : 0));
    A* wbuf = ds + size_t(Tn) * Tn;
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const T* qkv_bh = qkv + size_t(b) * Tn * C3 + size_t(h) * hs;
        const View<A> q = as_acc(qkv_bh, Tn, hs, C3, wbuf);
        const View<A> k = as_acc(qkv_bh + C, Tn, hs, C3, wbuf + head);
        const View<A> v = as_acc(qkv_bh + 2 * C, Tn, hs, C3, wbuf + 2 * head);
        const View<A> d = as_acc(dout + size_t(b) * Tn * C + size_t(h) * hs, Tn, hs, C, wbuf + 3 * head);
        const View<A> p = as_acc(att + (size_t(b) * NH + h) * Tn * Tn, Tn, Tn, Tn, wbuf + 7 * head);
        T* dq = dqkv + size_t(b) * Tn * C3 + size_t(h) * hs;
        T* dk = dq + C;
        T* dv = dq + 2 * size_t(C);
        A* yq = acc_dest<A>(dq, wbuf + 4 * head);
        A* yk = acc_dest<A>(dk, wbuf + 5 * head);
        A* yv = acc_dest<A>(dv, wbuf + 6 * head);
        const int ldy = acc_ld<A, T>(C3, hs);
        for (int t0 = 0; t0 < Tn; t0 += kAttRows) {
          const int t1 = std::min(t0 + kAttRows, Tn);
          // dP rows t0 .. t1-1, columns 0 .. t1-1
          blas_gemm(false, true, t1 - t0, t1, hs, A(1), d.p + size_t(t0) * d.ld, d.ld, v.p, v.ld,
                    ds + size_t(t0) * Tn, Tn);
          for (int t = t0; t < t1; t++) {  // dS, row by row (the softmax backward)
            const A* p_row = p.p + size_t(t) * p.ld;
            A* row = ds + size_t(t) * Tn;
            A p_dot_dp = A(0);
            for (int t2 = 0; t2 <= t; t2++) p_dot_dp += p_row[t2] * row[t2];
            for (int t2 = 0; t2 <= t; t2++) row[t2] = p_row[t2] * (row[t2] - p_dot_dp) * scale;
            for (int t2 = t + 1; t2 < Tn; t2++) row[t2] = A(0);  // masked (causal)
          }
          // dQ rows t0 .. t1-1 = dS[t0:t1, 0:t1] K[0:t1]
          blas_gemm(false, false, t1 - t0, hs, t1, A(1), ds + size_t(t0) * Tn, Tn, k.p, k.ld,
                    yq + size_t(t0) * ldy, ldy);
        }
        for (int t0 = 0; t0 < Tn; t0 += kAttRows) {
          const int t1 = std::min(t0 + kAttRows, Tn);
          // dK rows t0 .. t1-1 = dS[t0:T, t0:t1]^T Q[t0:T];  dV rows t0 .. t1-1 = P[t0:T, t0:t1]^T dO[t0:T]
          blas_gemm(true, false, t1 - t0, hs, Tn - t0, A(1), ds + size_t(t0) * Tn + t0, Tn,
                    q.p + size_t(t0) * q.ld, q.ld, yk + size_t(t0) * ldy, ldy);
          blas_gemm(true, false, t1 - t0, hs, Tn - t0, A(1), p.p + size_t(t0) * p.ld + t0, p.ld,
                    d.p + size_t(t0) * d.ld, d.ld, yv + size_t(t0) * ldy, ldy);
        }
        store_rows(dq, C3, yq, Tn, hs);
        store_rows(dk, C3, yk, Tn, hs);
        store_rows(dv, C3, yv, Tn, hs);
      }
    }
  }
}
// ---------------------------------------------------------------------------------------------
// GELU (GPT-2's tanh approximation) and the residual connection

// out = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// computed as x * sigmoid(2u), since 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) exactly: the same
// function with one exp instead of a tanh (a library tanh costs several times an exp).
// For very negative x, exp(-2u) overflows to inf and the sigmoid is 0, as it should be.
template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = store<T>(gelu_of(load(inp[i])));  // (gelu_of: at the top)
}

// dinp = dout * d/dx [x sig],  sig = sigmoid(2u)
//      = dout * (sig + x * 2 sig (1 - sig) * du/dx),  du/dx = s (1 + 3 k x^2)      (overwrite)
// (the same as 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, with tanh u = 2 sig - 1)
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = store<T>(gelu_grad_of(load(inp[i])) * load(dout[i]));
}

// dinp (N,OC) = gelu'(inp) * dout (overwrite; may alias dout);  dbias (OC) += sum_n dinp[n,:]
// GELU's backward and the bias gradient of the layer before it, in one pass: the bias gradient is
// the column sum of the very gradient being written, so it is summed as it is made instead of read
// back from memory by matmul_backward. As there, each thread owns a block of columns and walks the
// rows in order, summing the values as stored (rounded to T): the same bits as the two ops.
template <class T>
void gelu_backward_bias(T* dinp, T* dbias, const T* inp, const T* dout, int N, int OC) {
  using A = acc_t<T>;
  if (!dbias) return gelu_backward(dinp, inp, dout, size_t(N) * OC);
#pragma omp parallel for schedule(static)
  for (int o0 = 0; o0 < OC; o0 += kChannelBlock) {
    const int o1 = std::min(o0 + kChannelBlock, OC);
    A sum[kChannelBlock] = {};
    for (int n = 0; n < N; n++) {
      const size_t row = size_t(n) * OC;
#pragma omp simd  // dinp may be dout: each element is read before it is written
      for (int o = o0; o < o1; o++) {
        const T d = store<T>(gelu_grad_of(load(inp[row + o])) * load(dout[row + o]));
        dinp[row + o] = d;
        sum[o - o0] += load(d);
      }
    }
    for (int o = o0; o < o1; o++) dbias[o] = store<T>(load(dbias[o]) + sum[o - o0]);
  }
}

// out = a + b (out may alias a or b: each element is read before it is written).
// Its backward is the identity (the gradient flows unchanged to both branches), so it has none.
template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = store<T>(load(a[i]) + load(b[i]));
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy, fused

// logits, probs (BT,V); losses, targets (BT). probs may alias logits.
// losses[i] = -log probs[i][target] is computed as log(sum) - (logit[target] - max), which is the
// same number without the log of a (possibly rounded, possibly underflowed) probability.
template <class T>
void softmax_xent_forward(acc_t<T>* losses, T* probs, const T* logits, const int* targets, int BT,
                          int V) {
  using A = acc_t<T>;
#pragma omp parallel
  {
    A* e = scratch<A>(V);  // exp(logit - max), kept in A so bf16 is rounded only once
#pragma omp for schedule(static)
    for (int i = 0; i < BT; i++) {
      const T* x = logits + size_t(i) * V;
      const int target = targets[i];
      NZ_CHECK(target >= 0 && target < V, "softmax_xent: target %d out of range [0, %d)", target, V);
      // subtract the row max so that exp cannot overflow
      A maxval = A(-INFINITY);
      for (int j = 0; j < V; j++) maxval = std::max(maxval, load(x[j]));
      for (int j = 0; j < V; j++) e[j] = exp_vec(load(x[j]) - maxval);  // (vectorized)
      A sum = A(0);
      for (int j = 0; j < V; j++) sum += e[j];  // (in order)
      // read the target logit before probs (which may be the same memory) is written
      losses[i] = std::log(sum) - (load(x[target]) - maxval);
      const A inv_sum = A(1) / sum;
      T* p = probs + size_t(i) * V;
      for (int j = 0; j < V; j++) p[j] = store<T>(e[j] * inv_sum);
    }
  }
}

// dlogits (BT,V) = (probs - onehot(target)) * dloss   (overwrite; dlogits may alias probs).
// dloss is d(total loss)/d(losses[i]), e.g. 1/(B*T) for the mean loss.
template <class T>
void softmax_xent_backward(T* dlogits, const T* probs, const int* targets, float dloss, int BT, int V) {
  using A = acc_t<T>;
  const A dl = A(dloss);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < BT; i++) {
    const T* p = probs + size_t(i) * V;
    T* d = dlogits + size_t(i) * V;
    const int target = targets[i];
    NZ_CHECK(target >= 0 && target < V, "softmax_xent: target %d out of range [0, %d)", target, V);
    for (int j = 0; j < V; j++) {
      const A indicator = (j == target) ? A(1) : A(0);
      d[j] = store<T>((load(p[j]) - indicator) * dl);
    }
  }
}

// The vocabulary-parallel cross-entropy (tensor/tp_model.cpp): the reference's row loops
template <class T>
void vocab_xent_max(float* row_max, const T* logits, int N, int V, int ld) {
  ref::vocab_xent_max(row_max, logits, N, V, ld);
}
template <class T>
void vocab_xent_sums(float* row_max, float* sums, float* target, const float* maxes, int T_, int R, const T* logits,
                     const int* targets, int lo, int N, int V, int ld) {
  ref::vocab_xent_sums(row_max, sums, target, maxes, T_, R, logits, targets, lo, N, V, ld);
}
template <class T>
void vocab_xent_finish(float* losses, T* logits, const float* row_max, const float* sums, const float* target, int N,
                       int V, int ld) {
  ref::vocab_xent_finish(losses, logits, row_max, sums, target, N, V, ld);
}
template <class T>
void vocab_xent_backward(T* d, const int* targets, int lo, float dloss, int N, int ld) {
  ref::vocab_xent_backward(d, targets, lo, dloss, N, ld);
}

// ---------------------------------------------------------------------------------------------
// optimizer and gradient utilities

// AdamW (Loshchilov & Hutter), step t >= 1. p, m, v fp32; g in the storage type.
//   g  = g * grad_scale                      (gradient clipping folds in here)
//   m  = beta1 m + (1 - beta1) g             v = beta2 v + (1 - beta2) g^2
//   p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p),  mhat = m / (1 - beta1^t), same for v
// The decay acts on p directly ("decoupled"), not through g, so Adam's scaling does not touch it.
// A plain fused loop without branches: the compiler vectorizes it.
template <class T>
void adamw_update(float* p, float* m, float* v, const T* g, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t) {
  using A = acc_t<T>;
  // m and v start at 0, so their early averages are biased towards 0: dividing by 1 - beta^t
  // undoes that. Computed once per call, in float, as the CUDA kernel does.
  const A bc1 = A(1.0f - powf(beta1, float(t)));
  const A bc2 = A(1.0f - powf(beta2, float(t)));
  const A b1 = A(beta1), b2 = A(beta2), one_b1 = A(1) - b1, one_b2 = A(1) - b2;
  const A lr_ = A(lr), eps_ = A(eps), wd = A(weight_decay), gs = A(grad_scale);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const A gi = load(g[i]) * gs;
    const A mi = b1 * A(m[i]) + one_b1 * gi;
    const A vi = b2 * A(v[i]) + one_b2 * gi * gi;
    const A mhat = mi / bc1;
    const A vhat = vi / bc2;
    const A pi = A(p[i]);
    p[i] = float(pi - lr_ * (mhat / (std::sqrt(vhat) + eps_) + wd * pi));
    m[i] = float(mi);
    v[i] = float(vi);
  }
}

// sum of x[i]^2 in double, in the order the CUDA kernel adds it (kernels_loss.cu), so that a norm
// summed here (offload's and infinity's gradients live on the host) has the bits stage2's and
// stage3's norm has on the GPU. That order depends only on n:
//   1. 65,536 running sums (256 blocks x 256 threads): sum j adds x[j], x[j + 65536], ... in order;
//   2. each block's 256 sums: a tree in each warp of 32 (s[l] += s[l + w] for w = 16, 8, 4, 2, 1, the
//      xor butterfly's additions for lane 0), then the same tree over its 8 warps' totals (w = 4, 2, 1);
//   3. the 256 block totals: the same two trees.
// Running sums and blocks past the first n elements hold exactly 0, and x + 0 == x exactly, so only
// the first min(n, 65536) sums are computed. Step 1 is contiguous rows added into one array: vectorized.
constexpr size_t kSumWarp = 32, kSumThreads = 256, kSumBlocks = 256, kSumGrid = kSumThreads * kSumBlocks;

static double tree_sum(double* s, size_t len) {  // s[l] += s[l + w], w = len/2 ... 1 (len a power of 2)
  for (size_t w = len / 2; w > 0; w /= 2)
    for (size_t l = 0; l < w; l++) s[l] += s[l + w];
  return s[0];
}

static double block_sum_of(double* s) {  // 256 values: per warp, then over the 8 warps' totals
  double warps[kSumThreads / kSumWarp];
  for (size_t w = 0; w < kSumThreads / kSumWarp; w++) warps[w] = tree_sum(s + w * kSumWarp, kSumWarp);
  return tree_sum(warps, kSumThreads / kSumWarp);
}

template <class T>
double sum_squares(const T* x, size_t n) {
  const size_t used = std::min(n, kSumGrid);
  thread_local std::vector<double> sums;  // one per thread, kept: the norm calls this per piece
  sums.assign((used + kSumThreads - 1) / kSumThreads * kSumThreads, 0.0);
  for (size_t row = 0; row < n; row += kSumGrid) {
    const size_t len = std::min(kSumGrid, n - row);
    const T* xr = x + row;
#pragma omp simd
    for (size_t j = 0; j < len; j++) {
      const double v = double(load(xr[j]));
      sums[j] += v * v;
    }
  }
  double blocks[kSumBlocks] = {};
  for (size_t b = 0; b < sums.size() / kSumThreads; b++) blocks[b] = block_sum_of(sums.data() + b * kSumThreads);
  return block_sum_of(blocks);
}

template <class T>
void sum_squares_to(double* result, const T* x, size_t n) {
  *result = sum_squares(x, n);
}

// total = (first ? 0 : total) + sum of x in double, one running sum in index order: the same bits as
// adding the batch's token losses on the host (a few thousand adds, not worth lanes).
template <class A>
void add_sum_to(double* total, const A* x, size_t n, bool first) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += double(x[i]);
  *total = first ? sum : *total + sum;
}

// dst = src converted: fp32 <-> bf16 rounds to nearest even; a same-type cast is a plain copy.
template <class D, class S>
void cast(D* dst, const S* src, size_t n) {
  if constexpr (std::is_same_v<D, S>) {
    if (dst != src) std::memmove(dst, src, n * sizeof(D));
  } else {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = store<D>(load(src[i]));
  }
}

// dst = (first ? src * scale : dst + src * scale): gradient accumulation over micro-steps.
// On the first micro-step dst is not read at all (it may hold anything, even NaN).
template <class T>
void accumulate(T* dst, const T* src, size_t n, float scale, bool first) {
  using A = acc_t<T>;
  const A sc = A(scale);
  if (first) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = store<T>(load(src[i]) * sc);
  } else {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = store<T>(load(dst[i]) + load(src[i]) * sc);
  }
}

// ---------------------------------------------------------------------------------------------
// explicit instantiations of every kernel in kernel_table.inc: float, bf16 and fp16 for training,
// double for the finite-difference tests

#define NZ_INSTANTIATE_CPU
#include "kernels/kernel_instantiate.inc"

}  // namespace cpu
}  // namespace nz
