// tp_reference.h — tensor parallelism in one process, from the whole model: the truth that
// tensor/train.cpp on N = D x T ranks must equal bit for bit (tests/tensor/test_tensor.cpp).
//
// It holds the whole model (make_layout on one rank) and, for every matrix product, cuts each of
// the T "ranks'" pieces out of the whole matrix when it needs them: the q|k|v rows of heads
// [t H/T, (t+1) H/T), the matching columns of attproj, rows [t 4C/T, ..) of fc and the matching
// columns of fcproj, rows [t V'/T, ..) of wte (V' = V rounded up to a multiple of T, the rows past
// V zeros). A row-parallel product is the sum of the T partial products, added in rank order
// 0, 1, ..., T-1 in the accumulator type and rounded once (what comm.h's all-reduce does); the
// cross-entropy takes the max over the T pieces' maxima, sums the T pieces' Σ exp(z - M) and the
// target's logit, as the ranks do. Every gradient is computed once per piece and put back in place;
// a replicated parameter's gradient is the one any rank computes (rank 0's here), never a sum over
// ranks. D replicas: the data of replica d, their gradients summed in replica order, averaged.
//
// 3D (--tensor T --pipeline P, tensor/pipe3d.cpp) computes the same numbers: the segments run the
// same pieces' products in the same order, the micro-batches' gradients are summed in ascending
// order (pipeline.h), and the tied wte's gradient adds the LM head's part, then the lookup's, as
// here. Only the norm's order differs: each rank adds over its segment's units (squared_norm).
//
// Shares with the rung only what is not the idea under test: the kernels (ops.h), the data loader,
// the initialisation, the learning-rate schedule and AdamW (elementwise: a piece's update is the
// whole parameter's update of those elements). The slicing, the sums over ranks, the loss over
// the vocabulary pieces, the norm's partials and their order are written here again.
#pragma once
#include <omp.h>  // omp_set_num_threads

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "input/cli.h"       // parse_args
#include "input/data.h"      // DataLoader
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "layout.h"
#include "lr_schedule.h"
#include "runtime/check.h"  // NZ_CHECK
#include "model.h"  // init_unit
#include "optim.h"  // AdamW, accumulate_grads, average_grads, clip_scale

namespace tpref {

using namespace nz;

struct Result {
  std::vector<double> losses, norms;  // every step's, as the trainer's report writes them
  std::vector<float> params;          // the final model, layout order (the model file's floats)
};

// The rung's command line (the flags after the program name) for T tensor ranks and D replicas.
Result run(const std::string& flags, int tensor, int D);

namespace detail {

// Rank t's pieces of a whole (rows x cols) row-major matrix: rows [r0, r0 + n) of each range, or
// columns [c0, c0 + n) of every row. Out of range rows (the vocabulary's padding) are zeros.
template <class X>
std::vector<X> rows_of(const X* m, size_t rows, size_t cols, const std::vector<size_t>& starts, size_t n) {
  std::vector<X> out(starts.size() * n * cols, store<X>(0.0f));
  for (size_t s = 0; s < starts.size(); s++)
    for (size_t r = 0; r < n && starts[s] + r < rows; r++)
      std::copy(m + (starts[s] + r) * cols, m + (starts[s] + r + 1) * cols, out.begin() + (s * n + r) * cols);
  return out;
}
template <class X>
std::vector<X> cols_of(const X* m, size_t rows, size_t cols, size_t c0, size_t n) {
  std::vector<X> out(rows * n);
  for (size_t r = 0; r < rows; r++) std::copy(m + r * cols + c0, m + r * cols + c0 + n, out.begin() + r * n);
  return out;
}
// ... and back: a piece's values into their places in the whole
template <class X>
void put_rows(X* m, size_t rows, size_t cols, const std::vector<size_t>& starts, size_t n, const std::vector<X>& p) {
  for (size_t s = 0; s < starts.size(); s++)
    for (size_t r = 0; r < n && starts[s] + r < rows; r++)
      std::copy(p.begin() + (s * n + r) * cols, p.begin() + (s * n + r + 1) * cols, m + (starts[s] + r) * cols);
}
template <class X>
void put_cols(X* m, size_t rows, size_t cols, size_t c0, size_t n, const std::vector<X>& p) {
  for (size_t r = 0; r < rows; r++) std::copy(p.begin() + r * n, p.begin() + (r + 1) * n, m + r * cols + c0);
}
// The T partials summed in rank order, in the accumulator type, rounded once.
template <class X>
std::vector<X> rank_sum(const std::vector<std::vector<X>>& parts) {
  std::vector<X> out(parts[0].size());
  for (size_t i = 0; i < out.size(); i++) {
    acc_t<X> acc = load(parts[0][i]);
    for (size_t t = 1; t < parts.size(); t++) acc += load(parts[t][i]);
    out[i] = store<X>(acc);
  }
  return out;
}

// One micro-batch's forward and backward of the whole model split T ways; the gradient (whole
// layout, zeros first) into g; returns nothing: the batch's summed loss is added to *loss_total.
template <class X>
void micro_step(const Layout& L, int T, const std::vector<X>& W, const int* tokens, const int* targets, int B, int S,
                std::vector<X>& g, double* loss_total, bool first_loss, float loss_scale, bool sp) {
  using A = acc_t<X>;
  const GPTConfig& c = L.cfg;
  const size_t C = c.dim, Cq = C / T, F = 4 * C / T, NHl = c.heads / T, BT = size_t(B) * S, V = c.vocab;
  const size_t Vl = (V + T - 1) / T, nl = c.layers;  // V' / T rows of wte per rank
  auto P = [&](int u, int i) { return W.data() + L.units[u].offset + L.units[u].tensors[i].offset; };
  auto Gp = [&](int u, int i) { return g.data() + L.units[u].offset + L.units[u].tensors[i].offset; };
  std::fill(g.begin(), g.end(), store<X>(0.0f));
  auto vec = [](size_t n) { return std::vector<X>(n, store<X>(0.0f)); };
  auto accv = [](size_t n) { return std::vector<A>(n, A(0)); };
  auto qkv_rows = [&](int t) { return std::vector<size_t>{t * Cq, C + t * Cq, 2 * C + t * Cq}; };
  // ---- forward ----
  std::vector<std::vector<X>> parts(T, vec(BT * C));
  for (int t = 0; t < T; t++)  // each rank's rows of wte: the tokens it holds, zeros for the others'
    for (size_t i = 0; i < BT; i++)
      if (size_t(tokens[i]) >= t * Vl && size_t(tokens[i]) < (t + 1) * Vl)
        std::copy(P(0, 0) + tokens[i] * C, P(0, 0) + (tokens[i] + 1) * C, parts[t].begin() + i * C);
  std::vector<X> x0 = rank_sum(parts);
  for (size_t i = 0; i < BT; i++)
    for (size_t k = 0; k < C; k++) x0[i * C + k] = store<X>(load(x0[i * C + k]) + load(P(0, 1)[(i % S) * C + k]));
  struct Block {
    std::vector<X> x, ln1, res_att, ln2, res_out;
    std::vector<A> m1, r1, m2, r2;
    std::vector<std::vector<X>> qkv, att, atty, fch, fchg;
  };
  std::vector<Block> blk(nl);
  const std::vector<X>* x = &x0;
  auto add_bias = [&](std::vector<X>& y, const X* b) {
    for (size_t i = 0; i < BT; i++)
      for (size_t k = 0; k < C; k++) y[i * C + k] = store<X>(load(y[i * C + k]) + load(b[k]));
  };
  for (size_t l = 0; l < nl; l++) {
    Block& b = blk[l];
    const int u = int(l) + 1;
    b.x = *x;
    b.ln1 = vec(BT * C), b.res_att = vec(BT * C), b.ln2 = vec(BT * C), b.res_out = vec(BT * C);
    b.m1 = accv(BT), b.r1 = accv(BT), b.m2 = accv(BT), b.r2 = accv(BT);
    ops::layernorm_forward<X>(b.ln1.data(), b.m1.data(), b.r1.data(), b.x.data(), P(u, 0), P(u, 1), BT, C);
    b.qkv.assign(T, vec(BT * 3 * Cq)), b.att.assign(T, vec(B * NHl * S * S)), b.atty.assign(T, vec(BT * Cq));
    for (int t = 0; t < T; t++) {
      const std::vector<X> w = rows_of(P(u, 2), 3 * C, C, qkv_rows(t), Cq);
      const std::vector<X> bias = rows_of(P(u, 3), 3 * C, 1, qkv_rows(t), Cq);
      ops::matmul_forward<X>(b.qkv[t].data(), b.ln1.data(), w.data(), bias.data(), BT, C, 3 * Cq);
      ops::attention_forward<X>(b.atty[t].data(), b.att[t].data(), b.qkv[t].data(), B, S, Cq, NHl);
      const std::vector<X> wp = cols_of(P(u, 4), C, C, t * Cq, Cq);
      ops::matmul_forward<X>(parts[t].data(), b.atty[t].data(), wp.data(), nullptr, BT, Cq, C);
    }
    b.res_att = rank_sum(parts);
    add_bias(b.res_att, P(u, 5));
    ops::residual_layernorm_forward<X>(b.res_att.data(), b.ln2.data(), b.m2.data(), b.r2.data(), b.x.data(),
                                       b.res_att.data(), P(u, 6), P(u, 7), BT, C);
    b.fch.assign(T, vec(BT * F)), b.fchg.assign(T, vec(BT * F));
    for (int t = 0; t < T; t++) {
      const std::vector<X> w = rows_of(P(u, 8), 4 * C, C, {t * F}, F), bias = rows_of(P(u, 9), 4 * C, 1, {t * F}, F);
      ops::matmul_bias_gelu_forward<X>(b.fch[t].data(), b.fchg[t].data(), b.ln2.data(), w.data(), bias.data(), BT, C, F);
      const std::vector<X> wp = cols_of(P(u, 10), C, 4 * C, t * F, F);
      ops::matmul_forward<X>(parts[t].data(), b.fchg[t].data(), wp.data(), nullptr, BT, F, C);
    }
    b.res_out = rank_sum(parts);
    add_bias(b.res_out, P(u, 11));
    ops::residual_forward<X>(b.res_out.data(), b.res_att.data(), b.res_out.data(), BT * C);
    x = &b.res_out;
  }
  const int lnf_u = L.lnf_unit();
  std::vector<X> lnf = vec(BT * C);
  std::vector<A> mf = accv(BT), rf = accv(BT);
  ops::layernorm_forward<X>(lnf.data(), mf.data(), rf.data(), x->data(), P(lnf_u, 0), P(lnf_u, 1), BT, C);
  // the LM head over the T vocabulary pieces, and the cross-entropy across them
  std::vector<std::vector<X>> wte(T), logits(T, vec(BT * Vl));
  std::vector<std::vector<float>> maxes(T, std::vector<float>(BT, -INFINITY)), sums(T, std::vector<float>(BT, 0.0f)),
      tgt(T, std::vector<float>(BT, 0.0f));
  auto valid = [&](int t) { return std::min(Vl, V > t * Vl ? V - t * Vl : 0); };  // my columns that are logits
  for (int t = 0; t < T; t++) {
    wte[t] = rows_of(P(0, 0), V, C, {t * Vl}, Vl);
    ops::matmul_forward<X>(logits[t].data(), lnf.data(), wte[t].data(), nullptr, BT, C, Vl);
    for (size_t i = 0; i < BT; i++)
      for (size_t j = 0; j < valid(t); j++) maxes[t][i] = std::max(maxes[t][i], load(logits[t][i * Vl + j]));
  }
  std::vector<float> M(BT, -INFINITY);
  for (size_t i = 0; i < BT; i++)
    for (int t = 0; t < T; t++) M[i] = std::max(M[i], maxes[t][i]);
  for (int t = 0; t < T; t++)
    for (size_t i = 0; i < BT; i++) {
      for (size_t j = 0; j < valid(t); j++) sums[t][i] += std::exp(load(logits[t][i * Vl + j]) - M[i]);
      const size_t tj = size_t(targets[i]) - t * Vl;
      if (size_t(targets[i]) >= t * Vl && tj < valid(t)) tgt[t][i] = load(logits[t][i * Vl + tj]);
    }
  const std::vector<float> Ssum = rank_sum(sums), Z = rank_sum(tgt);
  std::vector<float> losses(BT);
  for (size_t i = 0; i < BT; i++) {
    losses[i] = std::log(Ssum[i]) + M[i] - Z[i];
    for (int t = 0; t < T; t++)
      for (size_t j = 0; j < Vl; j++) {
        X& z = logits[t][i * Vl + j];
        z = store<X>(j < valid(t) ? std::exp(load(z) - M[i]) / Ssum[i] : 0.0f);
      }
  }
  ops::add_sum_to<float>(loss_total, losses.data(), BT, first_loss);
  // ---- backward ----
  const float dl = loss_scale / float(BT);  // fp16: the loss scale (1 in fp32, bf16)
  for (int t = 0; t < T; t++) {
    for (size_t i = 0; i < BT; i++)
      for (size_t j = 0; j < Vl; j++) {
        const float ind = size_t(targets[i]) == t * Vl + j ? 1.0f : 0.0f;
        logits[t][i * Vl + j] = store<X>((load(logits[t][i * Vl + j]) - ind) * dl);
      }
    ops::matmul_backward<X>(parts[t].data(), nullptr, nullptr, logits[t].data(), lnf.data(), wte[t].data(), BT, C, Vl);
  }
  // --sequence-parallel: rank t's layer norms see rows [t BT/T, (t+1) BT/T) only, so the weight
  // gradient of a layer norm is the T ranks' parts, each over its rows, summed in rank order; the
  // rest is row by row (the same numbers wherever a row is computed). Without it: one call, all rows.
  auto ln_backward = [&](X* gw, X* gb, const auto& call) {  // call(first row, rows, gw, gb)
    if (!sp) return call(size_t(0), BT, gw, gb);
    std::vector<std::vector<X>> pw(T, vec(C)), pb(T, vec(C));
    for (int t = 0; t < T; t++) call(t * (BT / T), BT / T, pw[t].data(), pb[t].data());
    const std::vector<X> w = rank_sum(pw), bb = rank_sum(pb);
    std::copy(w.begin(), w.end(), gw);
    std::copy(bb.begin(), bb.end(), gb);
  };
  std::vector<X> dx = rank_sum(parts), dtmp = vec(BT * C);
  ln_backward(Gp(lnf_u, 0), Gp(lnf_u, 1), [&](size_t r0, size_t n, X* gw, X* gb) {
    ops::layernorm_backward<X>(dtmp.data() + r0 * C, gw, gb, dx.data() + r0 * C, x->data() + r0 * C, P(lnf_u, 0),
                               mf.data() + r0, rf.data() + r0, n, C);
  });
  dx = dtmp;
  std::vector<X> dres = vec(BT * C);
  for (int l = int(nl) - 1; l >= 0; l--) {
    Block& b = blk[l];
    const int u = l + 1;
    std::vector<X> bias_grad0 = vec(C);  // a replicated bias: rank 0's gradient (every rank's is the same)
    for (int t = 0; t < T; t++) {
      std::vector<X> wp = cols_of(P(u, 10), C, 4 * C, t * F, F), w = rows_of(P(u, 8), 4 * C, C, {t * F}, F);
      std::vector<X> d4c = vec(BT * F), gwp = vec(C * F), gbp = vec(C), gw = vec(F * C), gb = vec(F);
      ops::matmul_backward<X>(d4c.data(), gwp.data(), gbp.data(), dx.data(), b.fchg[t].data(), wp.data(), BT, F, C);
      ops::gelu_backward_bias<X>(d4c.data(), gb.data(), b.fch[t].data(), d4c.data(), BT, F);
      ops::matmul_backward<X>(parts[t].data(), gw.data(), nullptr, d4c.data(), b.ln2.data(), w.data(), BT, C, F);
      put_cols(Gp(u, 10), C, 4 * C, t * F, F, gwp);
      put_rows(Gp(u, 8), 4 * C, C, {t * F}, F, gw);
      put_rows(Gp(u, 9), 4 * C, 1, {t * F}, F, gb);
      if (t == 0) bias_grad0 = gbp;
    }
    std::copy(bias_grad0.begin(), bias_grad0.end(), Gp(u, 11));
    std::vector<X> dln = rank_sum(parts);
    ln_backward(Gp(u, 6), Gp(u, 7), [&](size_t r0, size_t n, X* gw, X* gb) {
      const size_t o = r0 * C;
      ops::layernorm_backward_residual<X>(dres.data() + o, gw, gb, dx.data() + o, dln.data() + o, b.res_att.data() + o,
                                          P(u, 6), b.m2.data() + r0, b.r2.data() + r0, n, C);
    });
    for (int t = 0; t < T; t++) {
      std::vector<X> wp = cols_of(P(u, 4), C, C, t * Cq, Cq), w = rows_of(P(u, 2), 3 * C, C, qkv_rows(t), Cq);
      std::vector<X> datty = vec(BT * Cq), dqkv = vec(BT * 3 * Cq), gwp = vec(C * Cq), gbp = vec(C),
                     gw = vec(3 * Cq * C), gb = vec(3 * Cq);
      ops::matmul_backward<X>(datty.data(), gwp.data(), gbp.data(), dres.data(), b.atty[t].data(), wp.data(), BT, Cq, C);
      ops::attention_backward<X>(dqkv.data(), datty.data(), b.qkv[t].data(), b.att[t].data(), b.atty[t].data(), B, S,
                                 Cq, NHl);
      ops::matmul_backward<X>(parts[t].data(), gw.data(), gb.data(), dqkv.data(), b.ln1.data(), w.data(), BT, C, 3 * Cq);
      put_cols(Gp(u, 4), C, C, t * Cq, Cq, gwp);
      put_rows(Gp(u, 2), 3 * C, C, qkv_rows(t), Cq, gw);
      put_rows(Gp(u, 3), 3 * C, 1, qkv_rows(t), Cq, gb);
      if (t == 0) bias_grad0 = gbp;
    }
    std::copy(bias_grad0.begin(), bias_grad0.end(), Gp(u, 5));
    dln = rank_sum(parts);
    ln_backward(Gp(u, 0), Gp(u, 1), [&](size_t r0, size_t n, X* gw, X* gb) {
      const size_t o = r0 * C;
      ops::layernorm_backward_residual<X>(dx.data() + o, gw, gb, dres.data() + o, dln.data() + o, b.x.data() + o,
                                          P(u, 0), b.m1.data() + r0, b.r1.data() + r0, n, C);
    });
  }
  // the tied wte: each piece's LM-head part, then its tokens' lookup part; wpe from every position
  for (int t = 0; t < T; t++) {
    std::vector<X> gw = vec(Vl * C);
    ops::matmul_backward<X>(nullptr, gw.data(), nullptr, logits[t].data(), lnf.data(), nullptr, BT, C, Vl);
    for (size_t i = 0; i < BT; i++) {
      if (size_t(tokens[i]) < t * Vl || size_t(tokens[i]) >= (t + 1) * Vl) continue;
      X* row = gw.data() + (tokens[i] - t * Vl) * C;
      for (size_t k = 0; k < C; k++) row[k] = store<X>(load(row[k]) + load(dx[i * C + k]));
    }
    put_rows(Gp(0, 0), V, C, {t * Vl}, Vl, gw);
  }
  X* dwpe = Gp(0, 1);
  for (int s = 0; s < S; s++)
    for (size_t k = 0; k < C; k++) {
      A sum = 0;
      for (int b = 0; b < B; b++) sum += load(dx[(size_t(b) * S + s) * C + k]);
      dwpe[s * C + k] = store<X>(load(dwpe[s * C + k]) + sum);
    }
}

// The global squared norm as the ranks add it. Rank t holds its pieces of every unit laid end to
// end in tensor order, padded to a multiple of D (tensor.h); it adds, in unit and tensor order, a
// sum_squares of each split tensor's piece, and rank 0 of each replicated tensor too. Without
// --zero the replicas hold the same gradient and replica 0's ranks alone add theirs; with --zero 1
// replica d adds the part of each tensor inside slice d of the unit. Then one sum over the ranks in
// rank order: replica 0's tensor ranks 0..T-1, then replica 1's, ...
// 3D (--pipeline P, first_unit: segment p holds units [first_unit[p], first_unit[p + 1])): each rank
// adds over its segment's units only, and the rank order is segment 0's ranks (its replicas' tensor
// ranks, as above), then segment 1's, ...
template <class X>
double squared_norm(const Layout& L, int T, int D, bool zero1, const std::vector<X>& g,
                    const std::vector<int>& first_unit) {
  const GPTConfig& c = L.cfg;
  const size_t C = c.dim, Cq = C / T, F = 4 * C / T, V = c.vocab, Vl = (V + T - 1) / T;
  const int P = int(first_unit.size()) - 1;
  std::vector<std::vector<std::vector<double>>> v(P, std::vector<std::vector<double>>(D, std::vector<double>(T, 0.0)));
  for (int t = 0; t < T; t++)
    for (int u = 0; u < L.num_units(); u++) {
      int p = 0;  // the segment that holds unit u
      while (u >= first_unit[p + 1]) p++;
      std::vector<X> unit;                         // rank t's pieces of unit u, end to end
      std::vector<std::pair<size_t, size_t>> at;  // each tensor's [begin, end) in it
      std::vector<bool> counts;                   // split, or replicated and t = 0
      for (const TensorSpec& ts : L.units[u].tensors) {
        const X* p = g.data() + L.units[u].offset + ts.offset;
        std::vector<X> piece;
        const std::string& n = ts.name;
        bool split = true;
        if (n == "wte") piece = rows_of(p, V, C, {t * Vl}, Vl);
        else if (n == "qkv_w") piece = rows_of(p, 3 * C, C, {t * Cq, C + t * Cq, 2 * C + t * Cq}, Cq);
        else if (n == "qkv_b") piece = rows_of(p, 3 * C, 1, {t * Cq, C + t * Cq, 2 * C + t * Cq}, Cq);
        else if (n == "attproj_w") piece = cols_of(p, C, C, t * Cq, Cq);
        else if (n == "fc_w") piece = rows_of(p, 4 * C, C, {t * F}, F);
        else if (n == "fc_b") piece = rows_of(p, 4 * C, 1, {t * F}, F);
        else if (n == "fcproj_w") piece = cols_of(p, C, 4 * C, t * F, F);
        else piece.assign(p, p + ts.numel), split = false;  // replicated: counted once, by rank 0
        at.push_back({unit.size(), unit.size() + piece.size()});
        counts.push_back(split || t == 0);
        unit.insert(unit.end(), piece.begin(), piece.end());
      }
      const size_t slice = (unit.size() + D - 1) / D;  // the unit padded to a multiple of D, over D
      for (int d = 0; d < (zero1 ? D : 1); d++) {
        const size_t b = zero1 ? d * slice : 0, e = zero1 ? (d + 1) * slice : unit.size();
        for (size_t i = 0; i < at.size(); i++) {
          const size_t lo = std::max(at[i].first, b), hi = std::min(at[i].second, e);
          if (lo < hi && counts[i]) v[p][d][t] += ops::sum_squares<X>(unit.data() + lo, hi - lo);
        }
      }
    }
  double total = v[0][0][0];
  for (int p = 0; p < P; p++)
    for (int d = 0; d < D; d++)
      for (int t = 0; t < T; t++)
        if (p || d || t) total += v[p][d][t];
  return total;
}

// The segments' first units from --pipeline and --partition (3D); one segment without --pipeline.
inline std::vector<int> segments_of(const Args& a, int units) {
  std::vector<int> first{0};
  if (a.pipeline > 1) {
    NZ_CHECK(!a.partition.empty(), "the reference needs --partition with --pipeline (the segments' first units)");
    size_t at = 0;
    while (at < a.partition.size()) {
      const size_t comma = std::min(a.partition.find(',', at), a.partition.size());
      first.push_back(std::stoi(a.partition.substr(at, comma - at)));
      at = comma + 1;
    }
  }
  first.push_back(units);
  return first;
}

template <class X>
Result run_t(const Args& a, int T, int D) {
  const Layout L = make_layout(a.cfg, 1);
  const DType dt = a.dtype;
  const size_t n = L.padded_total, B = a.batch, S = a.seq, K = a.accum;
  std::vector<X> W(n);
  for (int u = 0; u < L.num_units(); u++) {
    std::vector<float> unit(L.units[u].padded);
    init_unit(L, u, a.seed, unit.data());
    for (size_t i = 0; i < unit.size(); i++) W[L.units[u].offset + i] = store<X>(unit[i]);
  }
  AdamWConfig cfg;
  cfg.weight_decay = a.weight_decay;
  const LrScheduleConfig sched{a.lr, a.warmup, a.steps, a.lr_schedule, a.warmup_min_lr, a.warmup_type, a.lr_total_steps};
  AdamW adam(L, whole_units(L), dt, cfg);
  for (int u = 0; u < L.num_units(); u++) adam.init_master(u, W.data() + L.units[u].offset);
  DataLoader data(a.data, a.batch, a.seq, a.seed);
  std::vector<int> tok(B * S), tgt(B * S);
  std::vector<X> g(n);
  std::vector<std::vector<X>> Gd(D, std::vector<X>(n));
  Result r;
  // fp16: the initial loss scale throughout (the test requires a run without a skipped step or a
  // changed scale: the reference does not model the dynamic scaler)
  const float scale_S = dt == DType::F16 ? a.loss_scale : 1.0f;
  for (int step = 0; step < a.steps; step++) {
    std::vector<double> loss_d(D, 0.0);
    for (int d = 0; d < D; d++)
      for (size_t k = 0; k < K; k++) {
        data.train_batch(step, int(k), int(K), D, d, tok.data(), tgt.data());
        micro_step<X>(L, T, W, tok.data(), tgt.data(), int(B), int(S), g, &loss_d[d], k == 0, scale_S,
                      a.sequence_parallel);
        accumulate_grads(dt, Gd[d].data(), g.data(), n, 1.0f, k == 0);
      }
    std::vector<X> G = rank_sum(Gd);  // the replicas, in replica order
    average_grads(dt, G.data(), n, 1.0f / float(D * K));
    const double norm = std::sqrt(squared_norm(L, T, D, a.zero == 1, G, segments_of(a, L.num_units()))) / scale_S;
    double loss = loss_d[0];
    for (int d = 1; d < D; d++) loss += loss_d[d];
    r.losses.push_back(loss / (double(D) * K * B * S));
    r.norms.push_back(norm);
    const float scale = clip_scale(norm, a.clip) / scale_S;
    for (int u = 0; u < L.num_units(); u++)
      adam.step(u, W.data() + L.units[u].offset, G.data() + L.units[u].offset, lr_at(sched, step), scale, step + 1);
  }
  for (const Unit& u : L.units)
    for (size_t i = 0; i < u.numel; i++) r.params.push_back(float(load(W[u.offset + i])));
  return r;
}

}  // namespace detail

inline Result run(const std::string& flags, int tensor, int D) {
  std::vector<std::string> words{"tensor"};
  std::string w;
  for (char ch : flags + " ") {
    if (ch != ' ') w += ch;
    else if (!w.empty()) words.push_back(w), w.clear();
  }
  std::vector<char*> argv;
  for (std::string& s : words) argv.push_back(s.data());
  const Args a = parse_args(int(argv.size()), argv.data(), "tensor");
  // One thread, as every rank of the runs it is compared with (OMP_NUM_THREADS=1 in their
  // environment). The test's own setenv comes too late for this process: OpenMP read the variable
  // when it was loaded. With OpenBLAS's Haswell kernels a product's bits depend on the thread count
  // (kernels_cpu.cpp, blas_gemm), so a reference on 2 threads differed from the 1-thread ranks.
  omp_set_num_threads(1);
  select_device("cpu", 0, false);
  set_kernels(a.kernels == "reference" ? Kernels::Reference : Kernels::Fast);
  Result r;
  NZ_DISPATCH_TRAIN_DTYPE(a.dtype, r = detail::run_t<T>(a, tensor, D));
  return r;
}

}  // namespace tpref
