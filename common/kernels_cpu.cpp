// kernels_cpu.cpp — the CPU reference backend: every op of the GPT model, forward beside backward.
//
// One plain function per op over raw row-major arrays, shapes in the comments. T is the storage
// type (float, bf16, or double for the finite-difference tests); all arithmetic is done in
// A = acc_t<T> through nz::load() / nz::store<T>(), so a bf16 tensor is read into fp32, computed on
// in fp32 and rounded (to nearest even) once, when it is stored.
//
// Determinism. The trainers are compared bit for bit, so every kernel here gives the same bits
// whatever the number of OpenMP threads: each output element is computed by exactly one thread,
// and every sum runs in a fixed order. No reduction is ever split across threads, no atomics.
// Reductions over rows (weight and bias gradients) are therefore parallelized over the OUTPUT
// (channels), each thread walking all rows in order.
//
// Conventions (kernels.h): weight/bias gradients accumulate (+=), input gradients are overwritten
// (=), a null bias / dbias / dinp pointer means "none".
#include <algorithm>    // std::min, std::fill
#include <cmath>        // std::exp, std::log, std::sqrt, std::tanh, powf
#include <cstring>      // std::memmove
#include <type_traits>  // std::is_same_v
#include <vector>       // per-thread scratch rows

#include "check.h"    // NZ_CHECK
#include "kernels.h"  // the declarations (kernel_decls.inc inside nz::cpu)

namespace nz {
namespace cpu {

namespace {

// Channels handled together by one thread when a gradient is summed over rows: long enough for
// contiguous (vectorizable) inner loops, short enough to keep the partial sums on the stack.
constexpr int kChannelBlock = 64;

// Dot product of n elements in a fixed order that the compiler can still vectorize. With
// -ffp-contract=off and strict IEEE semantics a single running sum is one long chain of dependent
// scalar adds; instead lane l sums elements l, l+16, l+32, ... and the lanes are added together in
// a fixed order at the end. Same bits on every call, whichever thread makes it.
template <class T>
inline acc_t<T> dot(const T* a, const T* b, int n) {
  using A = acc_t<T>;
  constexpr int L = 16;
  A lane[L] = {};
  int i = 0;
  for (; i + L <= n; i += L)
    for (int l = 0; l < L; l++) lane[l] += load(a[i + l]) * load(b[i + l]);
  A s = A(0);
  for (; i < n; i++) s += load(a[i]) * load(b[i]);  // the tail that does not fill the lanes
  for (int l = 0; l < L; l++) s += lane[l];
  return s;
}

// acc[0..n) += alpha * x[0..n): the inner loop of every "weighted sum of rows" below.
template <class T>
inline void axpy(acc_t<T>* acc, acc_t<T> alpha, const T* x, int n) {
  for (int i = 0; i < n; i++) acc[i] += alpha * load(x[i]);
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
    for (size_t bt = 0; bt < size_t(B) * Tn; bt++) {
      T* dw = dwte + size_t(tokens[bt]) * C;
      const T* d = dout + bt * C;
      for (int c = c0; c < c1; c++) dw[c] = store<T>(load(dw[c]) + load(d[c]));
    }
    // position embedding: sum the B contributions first, then add to the gradient once
    for (int t = 0; t < Tn; t++) {
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

// ---------------------------------------------------------------------------------------------
// layer norm

// out (N,C) = (inp - mean) * rstd * w + b, per row;   w, b (C);   mean, rstd (N) saved
template <class T>
void layernorm_forward(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* inp, const T* w, const T* b,
                       int N, int C) {
  using A = acc_t<T>;
  const A eps = A(1e-5);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* x = inp + size_t(n) * C;
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
    T* o = out + size_t(n) * C;
    for (int c = 0; c < C; c++) {
      A y = (load(x[c]) - m) * s * load(w[c]);
      o[c] = store<T>(b ? y + load(b[c]) : y);
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

// With norm = (x - mean) * rstd and dnorm = w * dout, per row:
//   dinp = rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))       (overwrite)
//   dw += sum_n dout * norm;   db += sum_n dout                                 (accumulate)
template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
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
    for (int c = 0; c < C; c++) {
      A norm = (load(x[c]) - m) * s;
      A dnorm = load(w[c]) * load(d[c]);
      di[c] = store<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
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
      dw[c] = store<T>(load(dw[c]) + dw_sum[c - c0]);
      if (db) db[c] = store<T>(load(db[c]) + db_sum[c - c0]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// matmul (a linear layer)

// out (N,OC) = inp (N,C) @ w^T + bias;   w (OC,C) (PyTorch's layout: one row per output), bias (OC)
// For each row n and output o: a dot product of two contiguous rows of length C.
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* x = inp + size_t(n) * C;
    T* o = out + size_t(n) * OC;
    for (int oc = 0; oc < OC; oc++) {
      A y = dot(x, w + size_t(oc) * C, C);
      o[oc] = store<T>(bias ? y + load(bias[oc]) : y);
    }
  }
}

// dinp (N,C) = dout (N,OC) @ w (OC,C)        (overwrite; skipped if dinp is null)
// dw (OC,C)  += dout^T (OC,N) @ inp (N,C)    (accumulate)
// dbias (OC) += sum_n dout[n,:]              (accumulate; skipped if null)
// Both are written as "weighted sums of contiguous rows" (axpy), so the inner loops vectorize
// and every element's sum runs in a fixed order (over o for dinp, over n for dw).
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C,
                     int OC) {
  using A = acc_t<T>;
  if (dinp) {
    // row n of dinp = sum_o dout[n,o] * w[o,:]; rows are independent
#pragma omp parallel
    {
      std::vector<A> acc(C);  // the row being summed, in A (bf16 must not accumulate in bf16)
#pragma omp for schedule(static)
      for (int n = 0; n < N; n++) {
        std::fill(acc.begin(), acc.end(), A(0));
        const T* d = dout + size_t(n) * OC;
        for (int o = 0; o < OC; o++) axpy(acc.data(), load(d[o]), w + size_t(o) * C, C);
        T* di = dinp + size_t(n) * C;
        for (int c = 0; c < C; c++) di[c] = store<T>(acc[c]);
      }
    }
  }
  if (!dw) return;  // the LM head's backward wants only dinp (its weight gradient comes later)
  // row o of dw = sum_n dout[n,o] * inp[n,:]; each thread owns whole rows o, and walks n in order
#pragma omp parallel
  {
    std::vector<A> acc(C);
#pragma omp for schedule(static)
    for (int o = 0; o < OC; o++) {
      std::fill(acc.begin(), acc.end(), A(0));
      A dbias_sum = A(0);
      for (int n = 0; n < N; n++) {
        const A d = load(dout[size_t(n) * OC + o]);
        dbias_sum += d;
        axpy(acc.data(), d, inp + size_t(n) * C, C);
      }
      // add the finished sum once: a second call adds exactly the same amount again
      T* dwo = dw + size_t(o) * C;
      for (int c = 0; c < C; c++) dwo[c] = store<T>(load(dwo[c]) + acc[c]);
      if (dbias) dbias[o] = store<T>(load(dbias[o]) + dbias_sum);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// causal multi-head self-attention

// qkv (B,T,3C) = [q | k | v], head h is columns h*hs .. h*hs+hs-1 of each, hs = C/NH.
// att (B,NH,T,T): att[b,h,t,t2] = softmax_t2(q_t . k_t2 / sqrt(hs)) for t2 <= t, 0 above the diagonal.
// out (B,T,C): out[b,t,h] = sum_t2 att[b,h,t,t2] * v_t2.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  using A = acc_t<T>;
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
  const size_t C3 = size_t(3) * C;
#pragma omp parallel
  {
    // probabilities in A (not rounded to T before they are used) and one output row
    std::vector<A> p(Tn), y(hs);
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < Tn; t++) {
        for (int h = 0; h < NH; h++) {
          const T* q = qkv + (size_t(b) * Tn + t) * C3 + size_t(h) * hs;
          // scores, and their max (subtracted before exp so that exp cannot overflow)
          A maxval = A(-INFINITY);
          for (int t2 = 0; t2 <= t; t2++) {
            const T* k = qkv + (size_t(b) * Tn + t2) * C3 + C + size_t(h) * hs;
            p[t2] = dot(q, k, hs) * scale;
            maxval = std::max(maxval, p[t2]);
          }
          A sum = A(0);
          for (int t2 = 0; t2 <= t; t2++) {
            p[t2] = std::exp(p[t2] - maxval);
            sum += p[t2];
          }
          const A inv_sum = A(1) / sum;
          T* att_row = att + ((size_t(b) * NH + h) * Tn + t) * Tn;
          for (int t2 = 0; t2 <= t; t2++) {
            p[t2] *= inv_sum;
            att_row[t2] = store<T>(p[t2]);
          }
          for (int t2 = t + 1; t2 < Tn; t2++) att_row[t2] = store<T>(A(0));  // masked (causal)
          // out = weighted sum of the value rows
          std::fill(y.begin(), y.end(), A(0));
          for (int t2 = 0; t2 <= t; t2++) {
            const T* v = qkv + (size_t(b) * Tn + t2) * C3 + 2 * size_t(C) + size_t(h) * hs;
            axpy(y.data(), p[t2], v, hs);
          }
          T* o = out + (size_t(b) * Tn + t) * C + size_t(h) * hs;
          for (int i = 0; i < hs; i++) o[i] = store<T>(y[i]);
        }
      }
    }
  }
}

// dqkv (B,T,3C) (overwrite), from dout (B,T,C) and the saved att. Per (b, h, t), with a = att row:
//   datt[t2] = dout_t . v_t2                      dv_t2 += a[t2] * dout_t
//   dpre[t2] = a[t2] * (datt[t2] - sum_t3 a[t3] * datt[t3])      (softmax backward)
//   dq_t += sum_t2 dpre[t2] * scale * k_t2        dk_t2 += dpre[t2] * scale * q_t
// dk and dv of position t2 collect contributions from every later t, so the work is split by
// (b, h): each thread owns whole heads, sums over t in order, and writes each element once.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C,
                        int NH) {
  using A = acc_t<T>;
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
  const size_t C3 = size_t(3) * C;
#pragma omp parallel
  {
    // this head's gradients (T,hs) each, summed in A and stored at the end; plus one datt row
    std::vector<A> dq(size_t(Tn) * hs), dk(size_t(Tn) * hs), dv(size_t(Tn) * hs), datt(Tn);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        std::fill(dq.begin(), dq.end(), A(0));
        std::fill(dk.begin(), dk.end(), A(0));
        std::fill(dv.begin(), dv.end(), A(0));
        auto q_of = [&](int t) { return qkv + (size_t(b) * Tn + t) * C3 + size_t(h) * hs; };
        auto k_of = [&](int t) { return q_of(t) + C; };
        auto v_of = [&](int t) { return q_of(t) + 2 * size_t(C); };
        for (int t = 0; t < Tn; t++) {
          const T* a = att + ((size_t(b) * NH + h) * Tn + t) * Tn;
          const T* d = dout + (size_t(b) * Tn + t) * C + size_t(h) * hs;
          // through out = sum_t2 a[t2] * v_t2
          for (int t2 = 0; t2 <= t; t2++) {
            datt[t2] = dot(d, v_of(t2), hs);
            axpy(&dv[size_t(t2) * hs], load(a[t2]), d, hs);
          }
          // through the softmax
          A a_dot_datt = A(0);
          for (int t2 = 0; t2 <= t; t2++) a_dot_datt += load(a[t2]) * datt[t2];
          // through the scores q_t . k_t2 * scale
          for (int t2 = 0; t2 <= t; t2++) {
            const A dpre = load(a[t2]) * (datt[t2] - a_dot_datt) * scale;
            axpy(&dq[size_t(t) * hs], dpre, k_of(t2), hs);
            axpy(&dk[size_t(t2) * hs], dpre, q_of(t), hs);
          }
        }
        for (int t = 0; t < Tn; t++) {
          T* dq_t = dqkv + (size_t(b) * Tn + t) * C3 + size_t(h) * hs;
          T* dk_t = dq_t + C;
          T* dv_t = dq_t + 2 * size_t(C);
          for (int i = 0; i < hs; i++) {
            dq_t[i] = store<T>(dq[size_t(t) * hs + i]);
            dk_t[i] = store<T>(dk[size_t(t) * hs + i]);
            dv_t[i] = store<T>(dv[size_t(t) * hs + i]);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GELU (GPT-2's tanh approximation) and the residual connection

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  using A = acc_t<T>;
  const A s = A(0.7978845608028654);  // sqrt(2/pi)
  const A k = A(0.044715);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const A x = load(inp[i]);
    const A u = s * (x + k * x * x * x);
    out[i] = store<T>(A(0.5) * x * (A(1) + std::tanh(u)));
  }
}

// dinp = dout * d/dx [0.5 x (1 + tanh u)],  u = s (x + k x^3)
//      = dout * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 k x^2))      (overwrite)
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  using A = acc_t<T>;
  const A s = A(0.7978845608028654);
  const A k = A(0.044715);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const A x = load(inp[i]);
    const A th = std::tanh(s * (x + k * x * x * x));
    const A sech2 = A(1) - th * th;
    const A grad = A(0.5) * (A(1) + th) + A(0.5) * x * sech2 * s * (A(1) + A(3) * k * x * x);
    dinp[i] = store<T>(grad * load(dout[i]));
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
    std::vector<A> e(V);  // exp(logit - max), kept in A so bf16 is rounded only once
#pragma omp for schedule(static)
    for (int i = 0; i < BT; i++) {
      const T* x = logits + size_t(i) * V;
      const int target = targets[i];
      NZ_CHECK(target >= 0 && target < V, "softmax_xent: target %d out of range [0, %d)", target, V);
      // subtract the row max so that exp cannot overflow
      A maxval = A(-INFINITY);
      for (int j = 0; j < V; j++) maxval = std::max(maxval, load(x[j]));
      A sum = A(0);
      for (int j = 0; j < V; j++) {
        e[j] = std::exp(load(x[j]) - maxval);
        sum += e[j];
      }
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

// sum of x[i]^2 in double, one thread, index order: the gradient norm must not depend on threads.
template <class T>
double sum_squares(const T* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double xi = double(load(x[i]));
    s += xi * xi;
  }
  return s;
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
// explicit instantiations: float and bf16 for training, double for the finite-difference tests

#define NZ_INSTANTIATE_KERNELS(T)                                                                   \
  template void embedding_forward<T>(T*, const int*, const T*, const T*, int, int, int);          \
  template void embedding_backward<T>(T*, T*, const T*, const int*, int, int, int);               \
  template void layernorm_forward<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, int, \
                                     int);                                                        \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const acc_t<T>*,  \
                                      const acc_t<T>*, int, int);                                 \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int);               \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);      \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int);                       \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int, int, int, int);      \
  template void gelu_forward<T>(T*, const T*, size_t);                                            \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                                 \
  template void residual_forward<T>(T*, const T*, const T*, size_t);                              \
  template void softmax_xent_forward<T>(acc_t<T>*, T*, const T*, const int*, int, int);           \
  template void softmax_xent_backward<T>(T*, const T*, const int*, float, int, int);              \
  template void adamw_update<T>(float*, float*, float*, const T*, size_t, float, float, float,    \
                                float, float, float, int);                                        \
  template double sum_squares<T>(const T*, size_t);                                               \
  template void accumulate<T>(T*, const T*, size_t, float, bool);

NZ_INSTANTIATE_KERNELS(float)
NZ_INSTANTIATE_KERNELS(bf16)
NZ_INSTANTIATE_KERNELS(double)
#undef NZ_INSTANTIATE_KERNELS

template void cast<float, bf16>(float*, const bf16*, size_t);
template void cast<bf16, float>(bf16*, const float*, size_t);
template void cast<float, float>(float*, const float*, size_t);
template void cast<bf16, bf16>(bf16*, const bf16*, size_t);
template void cast<double, double>(double*, const double*, size_t);

}  // namespace cpu
}  // namespace nz
