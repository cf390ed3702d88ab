// tp_model.cpp — one tensor rank's GPT: its pieces' products, the all-reduces between.
#include "tensor/tp_model.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"  // flash_attention_in_force
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/heartbeat.h"
#include "tensor/tensor.h"  // padded_vocab

namespace nz {

namespace {

// Tensor order inside a block unit (make_layout's, and tensor_layout's).
enum BlockTensor { LN1W, LN1B, QKVW, QKVB, ATTPW, ATTPB, LN2W, LN2B, FCW, FCB, FCPW, FCPB };

// Byte offsets of one rank's activations: model.cpp's ActLayout (common/) with the split widths,
// q|k|v of my H/T heads (3C/T), their output (C/T), my MLP columns (4C/T) and my logits (V'/T).
// Sequence parallelism: the residual stream and the layer norms' rows are mine only (bs/T rows),
// lnf's output is kept gathered for the LM head, and two (b,s,C) buffers hold what is gathered or
// about to be scattered.
struct Acts {
  struct Layer {
    size_t ln1, ln1_mean, ln1_rstd, qkv, att, atty, res_att, ln2, ln2_mean, ln2_rstd, fch, fchg, res_out;
  };
  std::vector<Layer> layer;
  size_t x0, lnf, lnf_mean, lnf_rstd, logits, losses, total = 0;
  size_t lnf_mine, gath, full;  // SP: lnf's rows of mine; the gathered (b,s,C); the partial (b,s,C)
  size_t dx, dres, dtmp, dln, d4c, dqkv, grad_total = 0;
  size_t R, row_max, maxes, sums, target, rows_total = 0;  // the loss's per-row scalars, R rows (fp32)
  // u0, u1: the units this model runs (3D: a pipeline segment's, tensor/pipe3d.cpp; default all):
  // a block's activations only for its own blocks, x0 only if it holds the embedding or takes x0 as
  // its input, the input it receives (the previous block's res_out), the head's ends only on the
  // segment that holds lnf. With every unit, the layout of a tensor rank without a pipeline.
  Acts(const GPTConfig& c, int T, DType dt, int B, int S, bool sp, int u0 = 0, int u1 = -1) {
    const size_t BT = size_t(B) * S, C = c.dim, Cq = C / T, F = 4 * C / T, e = dtype_bytes(dt), a = 4;
    const size_t Rl = sp ? BT / T : BT;  // the residual stream's rows on this rank
    const size_t Vl = padded_vocab(c.vocab, T) / T, NHl = c.heads / T;
    if (u1 < 0) u1 = c.layers + 2;
    const bool head = u1 == c.layers + 2;  // the segment holds lnf, and so the LM head and the loss
    auto take = [](size_t& total, size_t bytes) {
      size_t off = total;
      total += (bytes + 63) / 64 * 64;
      return off;
    };
    x0 = u0 <= 1 ? take(total, Rl * C * e) : 0;
    layer.assign(c.layers, Layer{});
    for (int i = 0; i < c.layers; i++) {
      Layer& l = layer[i];
      const int u = i + 1;
      if (u + 1 == u0) l.res_out = take(total, Rl * C * e);  // my segment's input, received
      if (u < u0 || u >= u1) continue;
      l.ln1 = take(total, Rl * C * e);
      l.ln1_mean = take(total, Rl * a);
      l.ln1_rstd = take(total, Rl * a);
      l.qkv = take(total, BT * 3 * Cq * e);
      l.att = take(total, size_t(B) * NHl * S * S * e);  // my heads' (B, H/T, S, S) probabilities
      l.atty = take(total, BT * Cq * e);
      l.res_att = take(total, Rl * C * e);
      l.ln2 = take(total, Rl * C * e);
      l.ln2_mean = take(total, Rl * a);
      l.ln2_rstd = take(total, Rl * a);
      l.fch = take(total, BT * F * e);
      l.fchg = take(total, BT * F * e);
      l.res_out = take(total, Rl * C * e);
    }
    lnf = lnf_mine = lnf_mean = lnf_rstd = logits = losses = 0;
    if (head) {
      lnf = take(total, BT * C * e);
      lnf_mine = sp ? take(total, Rl * C * e) : lnf;
      lnf_mean = take(total, Rl * a);
      lnf_rstd = take(total, Rl * a);
      logits = take(total, BT * Vl * e);
      losses = take(total, BT * a);
    }
    dx = take(grad_total, Rl * C * e);
    dres = take(grad_total, Rl * C * e);
    dtmp = take(grad_total, Rl * C * e);
    dln = take(grad_total, Rl * C * e);  // (also my heads' d atty, (b,s,C/T): SP's Rl C is as large)
    d4c = take(grad_total, BT * F * e);
    dqkv = take(grad_total, BT * 3 * Cq * e);
    gath = sp ? take(grad_total, BT * C * e) : 0;
    full = sp ? take(grad_total, BT * C * e) : 0;
    R = (BT + T - 1) / T * T;  // a collective's elements are a multiple of the ranks (comm.h)
    row_max = maxes = sums = target = 0;
    if (!head) return;  // the loss's scalars: on the segment with the head only
    row_max = take(rows_total, R * a);
    maxes = take(rows_total, T * R * a);
    sums = take(rows_total, R * a);
    target = take(rows_total, R * a);
  }
};

}  // namespace

uint64_t TensorGPT::activation_bytes(const GPTConfig& cfg, int T, DType dt, int B, int S, bool sp,
                                     const TensorSegment& seg) {
  const Acts a(cfg, T, dt, B, S, sp, seg.u0, seg.u1);
  const uint64_t tokens = 2 * ((uint64_t(B) * S * sizeof(int) + 63) / 64 * 64);
  return seg.slots * (a.total + tokens) + a.grad_total + a.rows_total;
}

TensorGPT::TensorGPT(const Layout& L, int T, int t, Comm& tp, DType dt, int B, int S, bool sp,
                     const TensorSegment& seg)
    : L_(L), T_(T), t_(t), tp_(tp), dt_(dt), B_(B), S_(S), sp_(sp), u0_(seg.u0),
      u1_(seg.u1 < 0 ? L.num_units() : seg.u1), slots_(seg.slots) {
  NZ_CHECK(!sp || (size_t(S) % T == 0 && T > 1), "sequence parallelism: %d positions over %d ranks", S, T);
  NZ_CHECK(!flash_attention_in_force(L.cfg.dim, L.cfg.heads), "tensor: the CPU's attention keeps the probabilities");
  const Acts a(L.cfg, T, dt, B, S, sp, u0_, u1_);
  slot_bytes_ = a.total;
  acts_ = Buffer(Category::Activations, Location::Device, slots_ * a.total,
                 "activations (my heads, my MLP columns)");
  grads_ = Buffer(Category::Activations, Location::Device, a.grad_total, "activation grads");
  rows_ = Buffer(Category::Activations, Location::Device, a.rows_total, "the loss's per-row max, sum, target");
  tok_bytes_ = (size_t(B) * S * sizeof(int) + 63) / 64 * 64;
  tok_ = Buffer(Category::Activations, Location::Device, slots_ * 2 * tok_bytes_, "tokens, targets");
  // the loss's scalars past the batch's rows travel in the collectives too: defined, never used
  fill_zero(rows_.data(), a.rows_total, Location::Device);
  use_slot(0);
}

void TensorGPT::use_slot(int s) {
  NZ_CHECK(s >= 0 && s < slots_, "activation slot %d of %d", s, slots_);
  slot_ = s;
  tokens_ = reinterpret_cast<int*>(static_cast<char*>(tok_.data()) + 2 * s * tok_bytes_);
  targets_ = reinterpret_cast<int*>(static_cast<char*>(tok_.data()) + (2 * s + 1) * tok_bytes_);
}

size_t TensorGPT::boundary_elems() const {
  const size_t rows = size_t(b_) * S_ / (sp_ ? T_ : 1);  // SP: my rows of the residual stream only
  return rows * L_.cfg.dim;
}
void* TensorGPT::segment_input() {
  const Acts a(L_.cfg, T_, dt_, B_, S_, sp_, u0_, u1_);
  NZ_CHECK(u0_ >= 1, "the first segment takes the tokens, not an activation");
  return static_cast<char*>(acts_.data()) + slot_ * slot_bytes_ + (u0_ == 1 ? a.x0 : a.layer[u0_ - 2].res_out);
}
void* TensorGPT::segment_output() {
  const Acts a(L_.cfg, T_, dt_, B_, S_, sp_, u0_, u1_);
  NZ_CHECK(u1_ < L_.num_units(), "the last segment ends in the loss, not an activation");
  return static_cast<char*>(acts_.data()) + slot_ * slot_bytes_ + (u1_ == 1 ? a.x0 : a.layer[u1_ - 2].res_out);
}
void* TensorGPT::activation_grad() {
  const Acts a(L_.cfg, T_, dt_, B_, S_, sp_, u0_, u1_);
  return static_cast<char*>(grads_.data()) + a.dx;
}

void TensorGPT::set_batch(const int* tokens, const int* targets, int b) {
  NZ_CHECK(b >= 1 && b <= B_, "batch of %d rows, model allocated for %d", b, B_);
  b_ = b;
  copy_bytes(tokens_, Location::Device, tokens, Location::Host, size_t(b) * S_ * sizeof(int));
  copy_bytes(targets_, Location::Device, targets, Location::Host, size_t(b) * S_ * sizeof(int));
}

// ---- the two conjugate operators (Megatron-LM, section 3) ----
// g: after a row-parallel product each rank holds a partial sum over its heads / its columns;
// the layer's output is the sum of the T partials (all-reduce, rank order). Backward: identity,
// d output is the same on every rank already.
void TensorGPT::g_forward(void* partial_sum, size_t n) { tp_.all_reduce(partial_sum, n, dt_); }
// f: before a column-parallel product the input is the same on every rank (forward: identity).
// Each rank's piece gives only its part of d input: the T parts are summed (all-reduce, rank order).
void TensorGPT::f_backward(void* grad_sum, size_t n) { tp_.all_reduce(grad_sum, n, dt_); }
// ---- sequence parallelism (Korthikanti et al. 2022): the all-reduce is a reduce-scatter followed
// by an all-gather; between the two, in the layer norms' region, each rank keeps only its rows.
// g's forward: the partial products reduce-scattered (my rows of the sum); its backward: d output
// all-gathered. Its partner before a column-parallel product (ḡ): the layer norm's rows
// all-gathered forward, the input's gradient reduce-scattered backward.
void TensorGPT::gather_rows(const void* mine, void* all, size_t n) { tp_.all_gather(mine, all, n, dt_); }
void TensorGPT::scatter_sum_rows(void* all, void* mine, size_t n) { tp_.reduce_scatter(all, mine, n, dt_); }
// end sequence parallelism
// end conjugate operators

void TensorGPT::forward(int u, const void* p) {
  NZ_DISPATCH_TRAIN_DTYPE(dt_, forward_t<T>(u, (const T*)p));
  heartbeat();
}
void TensorGPT::head_forward(const void* p) { NZ_DISPATCH_TRAIN_DTYPE(dt_, head_forward_t<T>((const T*)p)); }
void TensorGPT::head_backward(const void* p) { NZ_DISPATCH_TRAIN_DTYPE(dt_, head_backward_t<T>((const T*)p)); }
// 3D, the last segment: the LM head's part of the tied wte's gradient, my rows (zeros first, as
// backward(embed) starts it when it holds the head itself), for the first segment's backward(embed)
void TensorGPT::head_weight_backward(void* g_wte) {
  const Acts a(L_.cfg, T_, dt_, B_, S_, sp_, u0_, u1_);
  const int C = L_.cfg.dim, Vl = padded_vocab(L_.cfg.vocab, T_) / T_;
  fill_zero(g_wte, size_t(Vl) * C * dtype_bytes(dt_), Location::Device);
  const char* slot = static_cast<const char*>(acts_.data()) + slot_ * slot_bytes_;
  NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::matmul_backward<T>(nullptr, (T*)g_wte, nullptr, (const T*)(slot + a.logits),
                                                       (const T*)(slot + a.lnf), nullptr, b_ * S_, C, Vl));
}
void TensorGPT::backward(int u, const void* p, void* g) {
  NZ_DISPATCH_TRAIN_DTYPE(dt_, backward_t<T>(u, (const T*)p, (T*)g));
  heartbeat();
}
double TensorGPT::take_loss_sum() {
  double s = 0.0;  // (no head_forward since the last call: 0)
  if (!loss_fresh_) copy_bytes(&s, Location::Host, loss_total_.data(), Location::Device, sizeof(double));
  loss_fresh_ = true;
  return s;
}

#define ACT(X, off) reinterpret_cast<X*>(static_cast<char*>(acts_.data()) + slot_ * slot_bytes_ + (off))
#define GACT(X, off) reinterpret_cast<X*>(static_cast<char*>(grads_.data()) + (off))
#define ROWS(off) reinterpret_cast<float*>(static_cast<char*>(rows_.data()) + (off))

template <class X>
void TensorGPT::forward_t(int u, const X* p) {
  using A = acc_t<X>;
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, Cq = C / T_, F = 4 * C / T_, NHl = c.heads / T_, BT = b_ * S_;
  const int rows = sp_ ? BT / T_ : BT;  // the residual stream's rows here (SP: mine, from row0)
  const size_t n = size_t(rows) * C;
  const Acts a(c, T_, dt_, B_, S_, sp_, u0_, u1_);
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  X* full = sp_ ? GACT(X, a.full) : nullptr;  // SP: a partial product of every row, before its scatter
  X* gath = sp_ ? GACT(X, a.gath) : nullptr;  // SP: a layer norm's rows, gathered from every rank
  if (u == L_.embed_unit()) {
    // the vocabulary-parallel lookup: my rows of wte give the tokens I hold, zeros the others';
    // g sums the T ranks' rows (exactly one is not zero), then every rank adds the position
    const X* wte = p;
    const X* wpe = p + t[1].offset;
    const int Vl = int(t[0].numel / C), lo = t_ * Vl;
    X* x0 = ACT(X, a.x0);
    X* part = sp_ ? full : x0;
    ops::vocab_embedding_forward<X>(part, tokens_, wte, lo, Vl, BT, C);
    if (sp_) scatter_sum_rows(part, x0, n);  // SP: g, my rows of the sum
    else g_forward(x0, n);
    // my rows are positions row0, row0 + 1, ... of consecutive sequences: wpe's rows added as a bias
    // over each run of them
    const int row0 = sp_ ? t_ * rows : 0;
    for (int i = 0; i < rows;) {
      const int pos = (row0 + i) % S_, run = std::min(rows - i, S_ - pos);
      ops::add_bias<X>(x0 + size_t(i) * C, wpe + size_t(pos) * C, 1, run * C);
      i += run;
    }
    return;
  }
  const X* x = ACT(X, u == 1 ? a.x0 : a.layer[u - 2].res_out);  // my input: the previous unit's output
  if (u == L_.lnf_unit()) {  // replicated: every rank the same (SP: its rows, then gathered for the head)
    ops::layernorm_forward<X>(ACT(X, a.lnf_mine), ACT(A, a.lnf_mean), ACT(A, a.lnf_rstd), x, p, p + C, rows, C);
    if (sp_) gather_rows(ACT(X, a.lnf_mine), ACT(X, a.lnf), n);
    return;
  }
  const Acts::Layer& s = a.layer[u - 1];
  auto W = [&](int i) { return p + t[i].offset; };
  X* res_att = ACT(X, s.res_att);
  X* res_out = ACT(X, s.res_out);
  // attention: ln1 replicated; f (identity); qkv of my heads (column-parallel); my heads' attention
  ops::layernorm_forward<X>(ACT(X, s.ln1), ACT(A, s.ln1_mean), ACT(A, s.ln1_rstd), x, W(LN1W), W(LN1B), rows, C);
  const X* ln1 = ACT(X, s.ln1);
  if (sp_) gather_rows(ln1, gath, n), ln1 = gath;  // SP: ḡ, every row of ln1
  ops::matmul_forward<X>(ACT(X, s.qkv), ln1, W(QKVW), W(QKVB), BT, C, 3 * Cq);
  ops::attention_forward<X>(ACT(X, s.atty), ACT(X, s.att), ACT(X, s.qkv), b_, S_, Cq, NHl);
  // the output projection, row-parallel: my heads' partial product, g sums the T of them; the
  // replicated bias is added once, after the sum
  ops::matmul_forward<X>(sp_ ? full : res_att, ACT(X, s.atty), W(ATTPW), nullptr, BT, Cq, C);
  if (sp_) scatter_sum_rows(full, res_att, n);  // SP: g, my rows of the sum
  else g_forward(res_att, n);
  ops::add_bias<X>(res_att, W(ATTPB), rows, C);
  ops::residual_layernorm_forward<X>(res_att, ACT(X, s.ln2), ACT(A, s.ln2_mean), ACT(A, s.ln2_rstd), x, res_att,
                                     W(LN2W), W(LN2B), rows, C);
  // the MLP: f (identity); fc column-parallel (my 4C/T columns, GELU on them alone); fcproj
  // row-parallel, g, its bias once
  const X* ln2 = ACT(X, s.ln2);
  if (sp_) gather_rows(ln2, gath, n), ln2 = gath;  // SP: ḡ, every row of ln2
  ops::matmul_bias_gelu_forward<X>(ACT(X, s.fch), ACT(X, s.fchg), ln2, W(FCW), W(FCB), BT, C, F);
  ops::matmul_forward<X>(sp_ ? full : res_out, ACT(X, s.fchg), W(FCPW), nullptr, BT, F, C);
  if (sp_) scatter_sum_rows(full, res_out, n);  // SP: g, my rows of the sum
  else g_forward(res_out, n);
  ops::add_bias<X>(res_out, W(FCPB), rows, C);
  ops::residual_forward<X>(res_out, res_att, res_out, n);
}

// The vocabulary-parallel cross-entropy. Row i's loss is log Σ_j exp(z_j - M) + M - z_target over
// all V logits, which lie on T ranks. Each rank needs three numbers per row from the others:
//   M    the global max (for exp's range): each rank's max over its columns, all-gathered, maxed
//   S    Σ exp(z_j - M): each rank's sum over its columns, all-reduced
//   z_t  the target's logit: the rank that holds the target column contributes it, the others 0
// Padding columns (past V) are not logits: they take part in none of the three.
template <class X>
void TensorGPT::head_forward_t(const X* wte) {
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, BT = b_ * S_;
  const Acts a(c, T_, dt_, B_, S_, sp_, u0_, u1_);
  const int Vl = padded_vocab(c.vocab, T_) / T_, lo = t_ * Vl, mine = std::max(0, std::min(Vl, c.vocab - lo));
  X* logits = ACT(X, a.logits);
  // f (identity: lnf is the same on every rank); my columns of the logits
  ops::matmul_forward<X>(logits, ACT(X, a.lnf), wte, nullptr, BT, C, Vl);
  float *row_max = ROWS(a.row_max), *maxes = ROWS(a.maxes), *sums = ROWS(a.sums), *target = ROWS(a.target);
  if (current_device() == Device::CUDA) {  // the region's three numbers per row, by device kernels
    ops::vocab_xent_max<X>(row_max, logits, BT, mine, Vl);
    tp_.all_gather(row_max, maxes, a.R, DType::F32);
    ops::vocab_xent_sums<X>(row_max, sums, target, maxes, T_, int(a.R), logits, targets_, lo, BT, mine, Vl);
    tp_.all_reduce(sums, a.R, DType::F32);
    tp_.all_reduce(target, a.R, DType::F32);
    return loss_from_sums<X>(logits, row_max, sums, target, BT, mine, Vl, a.losses);
  }
  // begin exercise: tensor_vocab_loss
  std::fill(row_max, row_max + a.R, -INFINITY);
  for (int i = 0; i < BT; i++)
    for (int j = 0; j < mine; j++) row_max[i] = std::max(row_max[i], load(logits[size_t(i) * Vl + j]));
  tp_.all_gather(row_max, maxes, a.R, DType::F32);  // every rank's maxima
  for (int i = 0; i < BT; i++) {
    float m = -INFINITY;
    for (int r = 0; r < T_; r++) m = std::max(m, maxes[size_t(r) * a.R + i]);  // the global max M
    row_max[i] = m;
  }
  std::fill(sums, sums + a.R, 0.0f);
  std::fill(target, target + a.R, 0.0f);
  for (int i = 0; i < BT; i++) {
    const X* z = logits + size_t(i) * Vl;
    for (int j = 0; j < mine; j++) sums[i] += std::exp(load(z[j]) - row_max[i]);
    const int tj = targets_[i] - lo;
    if (tj >= 0 && tj < mine) target[i] = load(z[tj]);
  }
  tp_.all_reduce(sums, a.R, DType::F32);    // S
  tp_.all_reduce(target, a.R, DType::F32);  // z_target
  // end exercise: tensor_vocab_loss
  loss_from_sums<X>(logits, row_max, sums, target, BT, mine, Vl, a.losses);
}

// Each row's loss, log S + M - z_target, and the probabilities of my columns over the logits (the
// backward's dlogits, in place); the batch's losses added to the step's total
template <class X>
void TensorGPT::loss_from_sums(X* logits, const float* row_max, const float* sums, const float* target, int BT,
                               int mine, int Vl, size_t losses_at) {
  float* losses = ACT(float, losses_at);
  ops::vocab_xent_finish<X>(losses, logits, row_max, sums, target, BT, mine, Vl);
  ops::add_sum_to<float>(static_cast<double*>(loss_total_.data()), losses, size_t(BT), loss_fresh_);
  loss_fresh_ = false;
}

template <class X>
void TensorGPT::head_backward_t(const X* wte) {
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, BT = b_ * S_;
  const Acts a(c, T_, dt_, B_, S_, sp_, u0_, u1_);
  const int Vl = padded_vocab(c.vocab, T_) / T_, lo = t_ * Vl;
  X* d = ACT(X, a.logits);  // in place over the probabilities
  ops::vocab_xent_backward<X>(d, targets_, lo, loss_scale_ / BT, BT, Vl);  // (p - onehot) dloss
  // d lnf: my columns' part, then f sums the T parts (SP: my rows of the sum)
  X* dx = GACT(X, a.dx);
  ops::matmul_backward<X>(sp_ ? GACT(X, a.full) : dx, nullptr, nullptr, d, ACT(X, a.lnf), wte, BT, C, Vl);
  if (sp_) scatter_sum_rows(GACT(X, a.full), dx, size_t(BT / T_) * C);
  else f_backward(dx, size_t(BT) * C);
}

template <class X>
void TensorGPT::backward_t(int u, const X* p, X* g) {
  using A = acc_t<X>;
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, Cq = C / T_, F = 4 * C / T_, NHl = c.heads / T_, BT = b_ * S_;
  const int rows = sp_ ? BT / T_ : BT;  // the residual stream's rows here (SP: mine)
  const size_t n = size_t(rows) * C;
  const Acts a(c, T_, dt_, B_, S_, sp_, u0_, u1_);
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  // 3D with the head on another segment: g's wte rows hold the head's part already (received)
  const bool head_part_in_g = u == L_.embed_unit() && u1_ < L_.num_units();
  const size_t keep = head_part_in_g ? t[0].numel : 0;
  fill_zero(g + keep, (L_.units[u].padded - keep) * sizeof(X), Location::Device);
  X* dx = GACT(X, a.dx);  // in: d loss / d (this unit's output), the same on every rank; out: d (its input)
  X* dtmp = GACT(X, a.dtmp);
  X* full = sp_ ? GACT(X, a.full) : nullptr;  // SP: every row's gradient (gathered, or to scatter)
  X* gath = sp_ ? GACT(X, a.gath) : nullptr;  // SP: a layer norm's rows gathered again
  // SP: every rank's rows of d (output), gathered (g's backward); otherwise d is whole here already
  auto all_rows = [&](const X* mine) -> const X* { return sp_ ? (gather_rows(mine, full, n), full) : mine; };
  if (u == L_.embed_unit()) {
    // the tied wte's two parts, my rows only: the LM head's (dlogits^T lnf), then the lookup's
    // (g's backward is the identity: dx0 is the same on every rank; my rows take my tokens')
    const int Vl = int(t[0].numel / C), lo = t_ * Vl;
    const X* dx0 = all_rows(dx);
    if (!head_part_in_g)
      ops::matmul_backward<X>(nullptr, g, nullptr, ACT(X, a.logits), ACT(X, a.lnf), nullptr, BT, C, Vl);
    ops::vocab_embedding_backward<X>(g, dx0, tokens_, lo, Vl, BT, C);
    // wpe is replicated: every rank adds the same dx0, and its gradient is complete here (the
    // ladder's embedding backward, its position part alone)
    ops::embedding_backward<X>(nullptr, g + t[1].offset, dx0, tokens_, b_, S_, C);
    return;
  }
  const X* x = ACT(X, u == 1 ? a.x0 : a.layer[u - 2].res_out);
  if (u == L_.lnf_unit()) {
    ops::layernorm_backward<X>(dtmp, g, g + C, dx, x, p, ACT(A, a.lnf_mean), ACT(A, a.lnf_rstd), rows, C);
    ops::cast<X, X>(dx, dtmp, n);
    // SP: lnf's gradient sums over my rows only: the T ranks' parts are summed
    if (sp_) tp_.all_reduce(g, 2 * size_t(C), dt_);
    return;
  }
  const Acts::Layer& s = a.layer[u - 1];
  auto W = [&](int i) { return p + t[i].offset; };
  auto G = [&](int i) { return g + t[i].offset; };
  X* dres = GACT(X, a.dres);
  X* dln = GACT(X, a.dln);
  X* d4c = GACT(X, a.d4c);
  X* dqkv = GACT(X, a.dqkv);
  // MLP. g's backward: dx is the same on every rank. fcproj_b is replicated: its gradient, the
  // column sums of dx, is computed alike on every rank and complete here (never summed over T)
  ops::matmul_backward<X>(d4c, G(FCPW), G(FCPB), all_rows(dx), ACT(X, s.fchg), W(FCPW), BT, F, C);
  ops::gelu_backward_bias<X>(d4c, G(FCB), ACT(X, s.fch), d4c, BT, F);
  const X* ln2 = ACT(X, s.ln2);
  if (sp_) gather_rows(ln2, gath, n), ln2 = gath;  // SP: the forward's gathered ln2, gathered again
  ops::matmul_backward<X>(sp_ ? full : dln, G(FCW), nullptr, d4c, ln2, W(FCW), BT, C, F);
  if (sp_) scatter_sum_rows(full, dln, n);  // SP: ḡ's backward, my rows of the sum
  else f_backward(dln, n);  // d ln2: the sum of my columns' part and the others'
  // ln2 replicated: the same dln and the same saved input on every rank, the same gradient
  ops::layernorm_backward_residual<X>(dres, G(LN2W), G(LN2B), dx, dln, ACT(X, s.res_att), W(LN2W),
                                      ACT(A, s.ln2_mean), ACT(A, s.ln2_rstd), rows, C);
  // attention: attproj_b replicated as fcproj_b; my heads' d atty, d qkv
  ops::matmul_backward<X>(dln, G(ATTPW), G(ATTPB), all_rows(dres), ACT(X, s.atty), W(ATTPW), BT, Cq, C);
  ops::attention_backward<X>(dqkv, dln, ACT(X, s.qkv), ACT(X, s.att), ACT(X, s.atty), b_, S_, Cq, NHl);
  const X* ln1 = ACT(X, s.ln1);
  if (sp_) gather_rows(ln1, gath, n), ln1 = gath;  // SP: ln1 gathered again
  ops::matmul_backward<X>(sp_ ? full : dln, G(QKVW), G(QKVB), dqkv, ln1, W(QKVW), BT, C, 3 * Cq);
  if (sp_) scatter_sum_rows(full, dln, n);  // SP: ḡ's backward
  else f_backward(dln, n);  // d ln1: summed over my heads' part and the others'
  ops::layernorm_backward_residual<X>(dx, G(LN1W), G(LN1B), dres, dln, x, W(LN1W), ACT(A, s.ln1_mean),
                                      ACT(A, s.ln1_rstd), rows, C);
  // SP: the replicated layer norms saw my rows only: their gradients are the sum of the T ranks'
  // parts (ln1's w, b and ln2's w, b: two runs of 2C). Without SP each rank's is already whole.
  if (sp_) tp_.all_reduce(G(LN1W), 2 * size_t(C), dt_), tp_.all_reduce(G(LN2W), 2 * size_t(C), dt_);
}

}  // namespace nz
