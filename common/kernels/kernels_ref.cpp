// kernels_ref.cpp — every op of the GPT model as the textbook loops. Read this file first.
//
// One plain function per op over raw row-major arrays, forward beside backward, the shapes in a
// comment. Each output element is computed on its own, by one loop over the terms of its formula
// in their natural order (k = 0, 1, 2, ...). No threads, no tiling, no vector tricks: the loops are
// the math. nz::cpu (kernels_cpu.cpp) computes the same functions fast, and
// tests/kernels/test_kernels_ref.cpp checks it against these loops.
//
// T is the storage type (float, bf16, or double for the finite-difference tests); all arithmetic
// is done in A = acc_t<T> through nz::load() / nz::store<T>(): a bf16 tensor is read into fp32,
// computed on in fp32 and rounded once, when it is stored. Conventions (kernels.h): weight and bias
// gradients accumulate (+=), input gradients are overwritten (=), a null bias / dbias / dinp
// pointer means "none".
//
// Same bits, or not. Where nz::cpu forms each sum from the same terms in the same order (its tiles
// change which element is computed when, never how), the two agree bit for bit. They differ in:
//   - exp: here the library's std::exp; nz::cpu has its own vectorizable exp for float, within
//     2 ulp, so the softmaxes and GELU differ in the last bits in float and bf16. (In double
//     nz::cpu calls std::exp too, and they agree bit for bit.)
//   - sum_squares: here one running sum; nz::cpu adds in the CUDA kernel's order (65,536 running
//     sums, then fixed trees).
#include <algorithm>    // std::max
#include <cmath>        // std::exp, std::log, std::sqrt, powf
#include <type_traits>  // std::is_same_v
#include <vector>       // attention's per-head scratch

#include "runtime/check.h"    // NZ_CHECK
#include "kernels/kernels.h"  // the declarations (kernel_table.inc in nz::ref)

namespace nz {
namespace ref {

// ---------------------------------------------------------------------------------------------
// embedding

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]: a token's vector plus its position's vector.
// tokens (B,T), wte (V,C), wpe (maxT,C)
template <class T>
void embedding_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tn; t++)
      for (int c = 0; c < C; c++) {
        const int tok = tokens[b * Tn + t];
        out[(size_t(b) * Tn + t) * C + c] =
            store<T>(load(wte[size_t(tok) * C + c]) + load(wpe[size_t(t) * C + c]));
      }
}

// The lookup copies a row, so its gradient goes back to the row it came from:
//   dwte[tokens[b,t]] += dout[b,t]   one += per occurrence, in (b,t) order (a token may repeat)
//   dwpe[t] += sum_b dout[b,t]       the B terms summed first, then added once
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C) {
  using A = acc_t<T>;
  for (int b = 0; b < B && dwte; b++)
    for (int t = 0; t < Tn; t++)
      for (int c = 0; c < C; c++) {
        T& g = dwte[size_t(tokens[b * Tn + t]) * C + c];
        g = store<T>(load(g) + load(dout[(size_t(b) * Tn + t) * C + c]));
      }
  for (int t = 0; t < Tn && dwpe; t++)
    for (int c = 0; c < C; c++) {
      A sum = A(0);
      for (int b = 0; b < B; b++) sum += load(dout[(size_t(b) * Tn + t) * C + c]);
      dwpe[size_t(t) * C + c] = store<T>(load(dwpe[size_t(t) * C + c]) + sum);
    }
}

// The tensor rung's vocabulary pieces: this rank holds rows [lo, lo + V) of wte. The lookup gives
// the tokens it holds and zeros for the others (the ranks' rows are then summed: exactly one is not
// zero); the gradient goes back only to the rows it holds.
template <class T>
void vocab_embedding_forward(T* out, const int* tokens, const T* wte, int lo, int V, int N, int C) {
  for (int i = 0; i < N; i++) {
    const int tok = tokens[i] - lo;
    for (int k = 0; k < C; k++)
      out[size_t(i) * C + k] = tok >= 0 && tok < V ? wte[size_t(tok) * C + k] : store<T>(acc_t<T>(0));
  }
}

template <class T>
void vocab_embedding_backward(T* dwte, const T* dout, const int* tokens, int lo, int V, int N, int C) {
  for (int i = 0; i < N; i++) {
    const int tok = tokens[i] - lo;
    if (tok < 0 || tok >= V) continue;
    T* row = dwte + size_t(tok) * C;
    for (int k = 0; k < C; k++) row[k] = store<T>(load(row[k]) + load(dout[size_t(i) * C + k]));
  }
}

// y (N,C) += b (C), one rounding per element
template <class T>
void add_bias(T* y, const T* b, int N, int C) {
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) y[size_t(i) * C + c] = store<T>(load(y[size_t(i) * C + c]) + load(b[c]));
}

// ---------------------------------------------------------------------------------------------
// layer norm

// Per row n of inp (N,C):
//   mean = sum_c x[c] / C,   var = sum_c (x[c] - mean)^2 / C   (two passes: E[x^2] - mean^2 cancels)
//   rstd = 1 / sqrt(var + eps),   norm[c] = (x[c] - mean) * rstd
//   out[c] = norm[c] * w[c] + b[c]                               w, b (C); mean, rstd (N) saved
template <class T>
void layernorm_forward(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* inp, const T* w, const T* b, int N,
                       int C) {
  using A = acc_t<T>;
  const A eps = A(1e-5);
  for (int n = 0; n < N; n++) {
    const T* x = inp + size_t(n) * C;
    A m = A(0);
    for (int c = 0; c < C; c++) m += load(x[c]);
    m /= A(C);
    A var = A(0);
    for (int c = 0; c < C; c++) var += (load(x[c]) - m) * (load(x[c]) - m);
    var /= A(C);
    const A s = A(1) / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) {
      const A y = (load(x[c]) - m) * s * load(w[c]);
      out[size_t(n) * C + c] = store<T>(b ? y + load(b[c]) : y);
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

// Fused with the residual connection that feeds it: res = a + b, rounded to T as residual_forward
// stores it, then the layer norm of the stored res. Nothing more than the two ops in a row; nz::cpu
// and the GPU do them row by row, so that a and b are read once and res is still in cache.
template <class T>
void residual_layernorm_forward(T* res, T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* a, const T* b,
                                const T* w, const T* bias, int N, int C) {
  residual_forward(res, a, b, size_t(N) * C);
  layernorm_forward(out, mean, rstd, res, w, bias, N, C);
}

// With dnorm = w * dout, per row (the mean and rstd depend on every x of the row, hence the two
// means over c):
//   dinp[c] = (dnorm[c] - mean_c(dnorm) - norm[c] * mean_c(dnorm * norm)) * rstd   (overwrite)
//   dw[c] += sum_n dout[n,c] * norm[n,c];   db[c] += sum_n dout[n,c]            (accumulate)
// The sums over rows are formed first and added to the gradient once.
//
// In a transformer block the layer norm sits on a branch beside a skip connection, so the gradient
// of its input is the sum of the two paths: dinp = dskip + (the above). With dskip, that sum is
// formed here; the layer norm's part is rounded to T first, as if it had been stored and then added
// by residual_forward, so the fused op gives the same bits as the two. dskip null: no skip path.
template <class T>
void layernorm_backward_residual(T* dinp, T* dw, T* db, const T* dskip, const T* dout, const T* inp,
                                 const T* w, const acc_t<T>* mean, const acc_t<T>* rstd, int N, int C) {
  using A = acc_t<T>;
  if (dinp) {  // (skipped if null)
    for (int n = 0; n < N; n++) {
      const T* x = inp + size_t(n) * C;
      const T* d = dout + size_t(n) * C;
      A dnorm_mean = A(0), dnorm_norm_mean = A(0);
      for (int c = 0; c < C; c++) {
        const A norm = (load(x[c]) - mean[n]) * rstd[n];
        const A dnorm = load(w[c]) * load(d[c]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= A(C);
      dnorm_norm_mean /= A(C);
      for (int c = 0; c < C; c++) {
        const A norm = (load(x[c]) - mean[n]) * rstd[n];
        const A dnorm = load(w[c]) * load(d[c]);
        const T g = store<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n]);
        const size_t i = size_t(n) * C + c;
        dinp[i] = dskip ? store<T>(load(dskip[i]) + load(g)) : g;
      }
    }
  }
  for (int c = 0; c < C; c++) {
    A dw_sum = A(0), db_sum = A(0);
    for (int n = 0; n < N; n++) {
      const A norm = (load(inp[size_t(n) * C + c]) - mean[n]) * rstd[n];
      dw_sum += load(dout[size_t(n) * C + c]) * norm;
      db_sum += load(dout[size_t(n) * C + c]);
    }
    if (dw) dw[c] = store<T>(load(dw[c]) + dw_sum);
    if (db) db[c] = store<T>(load(db[c]) + db_sum);
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const acc_t<T>* mean,
                        const acc_t<T>* rstd, int N, int C) {
  layernorm_backward_residual(dinp, dw, db, static_cast<const T*>(nullptr), dout, inp, w, mean, rstd, N, C);
}

// ---------------------------------------------------------------------------------------------
// matmul (a linear layer)

// out (N,OC) = inp (N,C) @ w^T + bias:   out[n,o] = sum_c inp[n,c] * w[o,c] + bias[o]
// w (OC,C) holds one row per output (PyTorch's layout); bias (OC) or null
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  using A = acc_t<T>;
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      A sum = A(0);
      for (int c = 0; c < C; c++) sum += load(inp[size_t(n) * C + c]) * load(w[size_t(o) * C + c]);
      out[size_t(n) * OC + o] = store<T>(bias ? sum + load(bias[o]) : sum);
    }
}

// Each product inp[n,c] * w[o,c] sends dout[n,o] back to both factors:
//   dinp[n,c]  = sum_o dout[n,o] * w[o,c]      dinp (N,C) = dout @ w        (overwrite)
//   dw[o,c]   += sum_n dout[n,o] * inp[n,c]    dw (OC,C) += dout^T @ inp    (accumulate)
//   dbias[o]  += sum_n dout[n,o]                                            (accumulate)
// Each may be null (skipped).
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C,
                     int OC) {
  using A = acc_t<T>;
  if (dinp)
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) {
        A sum = A(0);
        for (int o = 0; o < OC; o++) sum += load(dout[size_t(n) * OC + o]) * load(w[size_t(o) * C + c]);
        dinp[size_t(n) * C + c] = store<T>(sum);
      }
  if (dw)
    for (int o = 0; o < OC; o++)
      for (int c = 0; c < C; c++) {
        A sum = A(0);
        for (int n = 0; n < N; n++) sum += load(dout[size_t(n) * OC + o]) * load(inp[size_t(n) * C + c]);
        dw[size_t(o) * C + c] = store<T>(load(dw[size_t(o) * C + c]) + sum);
      }
  if (dbias)
    for (int o = 0; o < OC; o++) {
      A sum = A(0);
      for (int n = 0; n < N; n++) sum += load(dout[size_t(n) * OC + o]);
      dbias[o] = store<T>(load(dbias[o]) + sum);
    }
}

// Fused with the GELU that follows the MLP's first layer: fc = inp @ w^T + bias (rounded to T),
// fcg = gelu(fc). The textbook is the two ops in a row (gelu_forward is below); nz::cpu applies the
// bias and the GELU in one pass over the product, and the GPU in one kernel after cuBLAS.
template <class T>
void matmul_bias_gelu_forward(T* fc, T* fcg, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  matmul_forward(fc, inp, w, bias, N, C, OC);
  gelu_forward(fcg, fc, size_t(N) * OC);
}

// ---------------------------------------------------------------------------------------------
// causal multi-head self-attention
//
// qkv (B,T,3C) = [q | k | v] along the last axis; head h owns columns h*hs .. h*hs+hs-1 of each,
// hs = C/NH. For one (b, h), with q[t], k[t], v[t] the head's vectors (hs) at position t:
//   score[t,t2] = (q[t] . k[t2]) * scale,  scale = 1/sqrt(hs)       for t2 <= t only (causal)
//   att[t,t2]   = softmax over t2 <= t of score[t,:]                 0 for t2 > t
//   out[t]      = sum_{t2<=t} att[t,t2] * v[t2]
// nz::cpu forms whole matrices instead (Q K^T, then P V) with its tiled product. Its sums have the
// same terms in the same order, plus terms that are exactly 0 (the masked entries), which change
// no bits; so the two differ only through their exp.

// The index of element i of the q (part 0), k (1) or v (2) vector of head h at position (b, t).
inline size_t qkv_at(int b, int t, int part, int h, int i, int Tn, int C, int hs) {
  return (size_t(b) * Tn + t) * 3 * C + size_t(part) * C + size_t(h) * hs + i;
}

// out (B,T,C), att (B,NH,T,T) saved for the backward. out is computed from the probabilities in A,
// before they are rounded to T for att (in bf16, the two roundings would otherwise compound).
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  using A = acc_t<T>;
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
  std::vector<A> p(Tn);  // one row of att, in A
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < Tn; t++) {
        // the scores of the visible positions, and their max (subtracted so exp cannot overflow)
        A maxval = A(-INFINITY);
        for (int t2 = 0; t2 <= t; t2++) {
          A dot = A(0);
          for (int i = 0; i < hs; i++)
            dot += load(qkv[qkv_at(b, t, 0, h, i, Tn, C, hs)]) * load(qkv[qkv_at(b, t2, 1, h, i, Tn, C, hs)]);
          p[t2] = dot * scale;
          maxval = std::max(maxval, p[t2]);
        }
        // softmax: exp(score - max) / sum, as a multiply by 1/sum (so does nz::cpu)
        A sum = A(0);
        for (int t2 = 0; t2 <= t; t2++) {
          p[t2] = std::exp(p[t2] - maxval);
          sum += p[t2];
        }
        const A inv_sum = A(1) / sum;
        T* att_row = att + ((size_t(b) * NH + h) * Tn + t) * Tn;
        for (int t2 = 0; t2 < Tn; t2++) {
          p[t2] = t2 <= t ? p[t2] * inv_sum : A(0);
          att_row[t2] = store<T>(p[t2]);
        }
        // out[t] = sum_{t2<=t} att[t,t2] * v[t2]
        for (int i = 0; i < hs; i++) {
          A y = A(0);
          for (int t2 = 0; t2 <= t; t2++) y += p[t2] * load(qkv[qkv_at(b, t2, 2, h, i, Tn, C, hs)]);
          out[(size_t(b) * Tn + t) * C + size_t(h) * hs + i] = store<T>(y);
        }
      }
}

// dqkv (B,T,3C) (overwrite), from dout (B,T,C) and the saved att. Backwards through the three
// steps of the forward, per (b, h):
//   dv[t2]       = sum_{t>=t2} att[t,t2] * dout[t]                   (out = att v)
//   datt[t,t2]   = dout[t] . v[t2]
//   dscore[t,t2] = att[t,t2] * (datt[t,t2] - sum_{t3<=t} att[t,t3] datt[t,t3]) * scale
//                                                                      (softmax, then the scale)
//   dq[t]        = sum_{t2<=t} dscore[t,t2] * k[t2]                  (score = q . k)
//   dk[t2]       = sum_{t>=t2} dscore[t,t2] * q[t]
// dscore is kept for the whole head (T,T, in A), since dk needs a column of it.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const T* /*out*/, int B, int Tn, int C,
                        int NH) {
  using A = acc_t<T>;
  NZ_CHECK(C % NH == 0, "attention: C=%d is not a multiple of NH=%d", C, NH);
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
  std::vector<A> datt(Tn), dscore(size_t(Tn) * Tn);
  auto dout_at = [&](int b, int t, int h, int i) {
    return load(dout[(size_t(b) * Tn + t) * C + size_t(h) * hs + i]);
  };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const T* a = att + (size_t(b) * NH + h) * Tn * Tn;  // a[t * Tn + t2] = att[t,t2]
      for (int t = 0; t < Tn; t++) {
        for (int t2 = 0; t2 <= t; t2++) {
          A dot = A(0);
          for (int i = 0; i < hs; i++)
            dot += dout_at(b, t, h, i) * load(qkv[qkv_at(b, t2, 2, h, i, Tn, C, hs)]);
          datt[t2] = dot;
        }
        A att_dot_datt = A(0);
        for (int t2 = 0; t2 <= t; t2++) att_dot_datt += load(a[size_t(t) * Tn + t2]) * datt[t2];
        for (int t2 = 0; t2 <= t; t2++)
          dscore[size_t(t) * Tn + t2] = load(a[size_t(t) * Tn + t2]) * (datt[t2] - att_dot_datt) * scale;
      }
      for (int t = 0; t < Tn; t++)
        for (int i = 0; i < hs; i++) {
          A dq = A(0), dk = A(0), dv = A(0);
          for (int t2 = 0; t2 <= t; t2++)
            dq += dscore[size_t(t) * Tn + t2] * load(qkv[qkv_at(b, t2, 1, h, i, Tn, C, hs)]);
          // here t is the key/value position: sum over the queries t3 >= t that see it
          for (int t3 = t; t3 < Tn; t3++) {
            dk += dscore[size_t(t3) * Tn + t] * load(qkv[qkv_at(b, t3, 0, h, i, Tn, C, hs)]);
            dv += load(a[size_t(t3) * Tn + t]) * dout_at(b, t3, h, i);
          }
          dqkv[qkv_at(b, t, 0, h, i, Tn, C, hs)] = store<T>(dq);
          dqkv[qkv_at(b, t, 1, h, i, Tn, C, hs)] = store<T>(dk);
          dqkv[qkv_at(b, t, 2, h, i, Tn, C, hs)] = store<T>(dv);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GELU (GPT-2's tanh approximation) and the residual connection

// gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3),  n elements.
// Written as x * sig with sig = 1 / (1 + exp(-2u)), since 0.5 (1 + tanh u) is exactly that
// sigmoid: one exp instead of a tanh, and the same formula as nz::cpu.
template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  using A = acc_t<T>;
  const A s = A(0.7978845608028654);  // sqrt(2/pi)
  const A k = A(0.044715);
  for (size_t i = 0; i < n; i++) {
    const A x = load(inp[i]);
    const A u = s * (x + k * x * x * x);
    const A sig = A(1) / (A(1) + std::exp(A(-2) * u));
    out[i] = store<T>(x * sig);
  }
}

// d/dx [x sig] = sig + x sig' = sig + x * 2 sig (1 - sig) * du/dx,  du/dx = s (1 + 3 k x^2)
// (sig' = 2 sig (1 - sig) du/dx: the sigmoid's derivative, of 2u).   dinp = that * dout (overwrite)
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  using A = acc_t<T>;
  const A s = A(0.7978845608028654);
  const A k = A(0.044715);
  for (size_t i = 0; i < n; i++) {
    const A x = load(inp[i]);
    const A u = s * (x + k * x * x * x);
    const A sig = A(1) / (A(1) + std::exp(A(-2) * u));
    const A grad = sig + x * A(2) * sig * (A(1) - sig) * s * (A(1) + A(3) * k * x * x);
    dinp[i] = store<T>(grad * load(dout[i]));
  }
}

// Fused with the bias gradient of the linear layer whose output went into the GELU:
//   dinp (N,OC) = gelu'(inp) * dout            (gelu_backward, overwrite; dinp may alias dout)
//   dbias[o] += sum_n dinp[n,o]                (matmul_backward's dbias, of the stored dinp)
// nz::cpu and the GPU form both in one pass over the (N,OC) gradient, instead of reading it again.
template <class T>
void gelu_backward_bias(T* dinp, T* dbias, const T* inp, const T* dout, int N, int OC) {
  using A = acc_t<T>;
  gelu_backward(dinp, inp, dout, size_t(N) * OC);
  if (dbias)
    for (int o = 0; o < OC; o++) {
      A sum = A(0);
      for (int n = 0; n < N; n++) sum += load(dinp[size_t(n) * OC + o]);
      dbias[o] = store<T>(load(dbias[o]) + sum);
    }
}

// out = a + b, n elements (out may alias a or b). Its backward is the identity: the gradient
// reaches both branches unchanged, so there is no kernel for it.
template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = store<T>(load(a[i]) + load(b[i]));
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy, fused

// Per row i of logits (BT,V):
//   probs[i,j] = exp(x[j] - max) / sum_j exp(x[j] - max)    (the max subtracted: no overflow)
//   losses[i]  = -log probs[i,target] = log(sum) - (x[target] - max)
// The loss is taken from the sum, not from the (rounded, maybe underflowed) probability. probs may
// alias logits: the target logit is read before the row is written.
template <class T>
void softmax_xent_forward(acc_t<T>* losses, T* probs, const T* logits, const int* targets, int BT, int V) {
  using A = acc_t<T>;
  std::vector<A> e(V);  // exp(x - max), kept in A so that bf16 is rounded once
  for (int i = 0; i < BT; i++) {
    const T* x = logits + size_t(i) * V;
    const int target = targets[i];
    NZ_CHECK(target >= 0 && target < V, "softmax_xent: target %d out of range [0, %d)", target, V);
    A maxval = A(-INFINITY);
    for (int j = 0; j < V; j++) maxval = std::max(maxval, load(x[j]));
    A sum = A(0);
    for (int j = 0; j < V; j++) {
      e[j] = std::exp(load(x[j]) - maxval);
      sum += e[j];
    }
    losses[i] = std::log(sum) - (load(x[target]) - maxval);
    const A inv_sum = A(1) / sum;  // a multiply by 1/sum, as nz::cpu does
    for (int j = 0; j < V; j++) probs[size_t(i) * V + j] = store<T>(e[j] * inv_sum);
  }
}

// d losses[i] / d logits[i,j] = probs[i,j] - (j == target):
//   dlogits (BT,V) = (probs - onehot(target)) * dloss      (overwrite; dlogits may alias probs)
// dloss is d(total loss)/d(losses[i]), e.g. 1/(B*T) for the mean loss.
template <class T>
void softmax_xent_backward(T* dlogits, const T* probs, const int* targets, float dloss, int BT, int V) {
  using A = acc_t<T>;
  for (int i = 0; i < BT; i++) {
    const int target = targets[i];
    NZ_CHECK(target >= 0 && target < V, "softmax_xent: target %d out of range [0, %d)", target, V);
    for (int j = 0; j < V; j++) {
      const A indicator = j == target ? A(1) : A(0);
      dlogits[size_t(i) * V + j] = store<T>((load(probs[size_t(i) * V + j]) - indicator) * A(dloss));
    }
  }
}

// The vocabulary-parallel cross-entropy (tensor/tp_model.cpp, head_forward_t): the three numbers of
// each row the T ranks combine (the global max, the sum of exponentials, the target's logit), then
// the loss and the probabilities of my columns. Only the V real columns of the ld count.
template <class T>
void vocab_xent_max(float* row_max, const T* logits, int N, int V, int ld) {
  for (int i = 0; i < N; i++) {
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = std::max(m, float(load(logits[size_t(i) * ld + j])));
    row_max[i] = m;
  }
}

template <class T>
void vocab_xent_sums(float* row_max, float* sums, float* target, const float* maxes, int T_, int R, const T* logits,
                     const int* targets, int lo, int N, int V, int ld) {
  for (int i = 0; i < N; i++) {
    float m = -INFINITY;
    for (int r = 0; r < T_; r++) m = std::max(m, maxes[size_t(r) * R + i]);  // the global max M
    row_max[i] = m;
    const T* z = logits + size_t(i) * ld;
    float s = 0.0f;
    for (int j = 0; j < V; j++) s += std::exp(load(z[j]) - m);
    sums[i] = s;
    const int tj = targets[i] - lo;
    target[i] = tj >= 0 && tj < V ? float(load(z[tj])) : 0.0f;
  }
}

template <class T>
void vocab_xent_finish(float* losses, T* logits, const float* row_max, const float* sums, const float* target, int N,
                       int V, int ld) {
  for (int i = 0; i < N; i++) {
    losses[i] = std::log(sums[i]) + row_max[i] - target[i];
    T* z = logits + size_t(i) * ld;
    for (int j = 0; j < ld; j++) z[j] = store<T>(j < V ? std::exp(load(z[j]) - row_max[i]) / sums[i] : 0.0f);
  }
}

template <class T>
void vocab_xent_backward(T* d, const int* targets, int lo, float dloss, int N, int ld) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < ld; j++) {
      const float indicator = targets[i] - lo == j ? 1.0f : 0.0f;
      d[size_t(i) * ld + j] = store<T>((load(d[size_t(i) * ld + j]) - indicator) * dloss);
    }
}

// ---------------------------------------------------------------------------------------------
// optimizer and gradient utilities

// AdamW (Loshchilov & Hutter), step t >= 1, n elements; p, m, v fp32, g in the storage type:
//   g  = g * grad_scale                      (gradient clipping folds in here)
//   m  = beta1 m + (1 - beta1) g             v = beta2 v + (1 - beta2) g^2
//   mhat = m / (1 - beta1^t)                 vhat = v / (1 - beta2^t)   (m, v start at 0: unbias)
//   p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
// The decay acts on p directly ("decoupled"), not through g. 1 - beta^t is computed in float, once.
template <class T>
void adamw_update(float* p, float* m, float* v, const T* g, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t) {
  using A = acc_t<T>;
  const A bc1 = A(1.0f - powf(beta1, float(t)));
  const A bc2 = A(1.0f - powf(beta2, float(t)));
  for (size_t i = 0; i < n; i++) {
    const A gi = load(g[i]) * A(grad_scale);
    const A mi = A(beta1) * A(m[i]) + (A(1) - A(beta1)) * gi;
    const A vi = A(beta2) * A(v[i]) + (A(1) - A(beta2)) * gi * gi;
    const A mhat = mi / bc1;
    const A vhat = vi / bc2;
    p[i] = float(A(p[i]) - A(lr) * (mhat / (std::sqrt(vhat) + A(eps)) + A(weight_decay) * A(p[i])));
    m[i] = float(mi);
    v[i] = float(vi);
  }
}

// sum_i x[i]^2 in double, one running sum in order i = 0, 1, ..., n-1.
template <class T>
double sum_squares(const T* x, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += double(load(x[i])) * double(load(x[i]));
  return sum;
}

template <class T>
void sum_squares_to(double* result, const T* x, size_t n) {
  *result = sum_squares(x, n);
}

// total = (first ? 0 : total) + sum of x in double, one running sum in order i = 0, 1, ..., n-1.
template <class A>
void add_sum_to(double* total, const A* x, size_t n, bool first) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += double(x[i]);
  *total = first ? sum : *total + sum;
}

// dst = src converted: fp32 <-> bf16 rounds to nearest even; a same-type cast copies.
template <class D, class S>
void cast(D* dst, const S* src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if constexpr (std::is_same_v<D, S>)
      dst[i] = src[i];
    else
      dst[i] = store<D>(load(src[i]));
  }
}

// dst = (first ? src * scale : dst + src * scale): gradient accumulation over micro-steps.
// On the first micro-step dst is not read (it may hold anything, even NaN).
template <class T>
void accumulate(T* dst, const T* src, size_t n, float scale, bool first) {
  using A = acc_t<T>;
  for (size_t i = 0; i < n; i++)
    dst[i] = store<T>(first ? load(src[i]) * A(scale) : load(dst[i]) + load(src[i]) * A(scale));
}

// ---------------------------------------------------------------------------------------------
// explicit instantiations of every kernel in kernel_table.inc: float, bf16 and fp16 for training,
// double for the finite-difference tests

#define NZ_INSTANTIATE_CPU
#include "kernels/kernel_instantiate.inc"

}  // namespace ref
}  // namespace nz
