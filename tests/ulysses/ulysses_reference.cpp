// ulysses_reference.cpp — the single-process truth ulysses is held to, bit for bit: one process plays
// the N = D x S ranks of `ulysses --sp S` (--ranks N), with no communication, no all-to-all and no
// ZeRO. What it shares with ulysses/train.cpp is common/: the model's per-token pieces
// (GPT::attention_input, attention_output and their backwards, on S models of one slice each).
// What it does its own way is what ulysses is about:
//   - attention runs on the whole sequence, every head at once (the kernel's B x T x C with NH heads),
//     from q, k, v put together by token order alone: no head index mapping, the causal mask over
//     the sequence's own positions;
//   - each slice model's positions are those of its tokens, s T/S on, set here;
//   - each (replica d, slice s) "rank" r = d S + s keeps its own weight-gradient partial, and the N
//     partials of a unit are summed in rank order (as the reduce-scatter sums them) before the
//     micro-step's average is added; the norm's partials are each rank's owned slices, summed in
//     rank order; the loss likewise;
//   - AdamW updates whole units (its update is elementwise: the same bits as on slices).
// Validation is not computed (the hook returns NaN): only the steps and the model file are the truth.
// Built by tests/ulysses/ulysses.mk into $(BUILD)/mutants/bin/ulysses_reference (a test-only trainer).
//
//   mpirun -np 1 ulysses_reference --ranks N --sp S [the flags of the ulysses run]
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "trainer.h"

using namespace nz;

namespace {

int g_ranks = 1;  // N, the ranks played (--ranks)

// One process, one replica in the Trainer's eyes (its data for replica 0 is not used: the loop below
// loads every replica's), but the layout and the gradient average of N = D x S ranks.
Topology reference_topology(const Args& a, int, int) {
  const bool ring = a.sp_mode == "ring";
  if (a.sp < 1 || g_ranks % a.sp != 0 || (!ring && a.cfg.heads % a.sp != 0) || a.seq % (ring ? 2 * a.sp : a.sp) != 0)
    user_error("ulysses_reference: --ranks %d --sp %d with %d heads and --seq %d do not split", g_ranks, a.sp,
               a.cfg.heads, a.seq);
  Topology t;
  t.dp_world = g_ranks / a.sp, t.dp_rank = 0;
  t.seq.slices = a.sp;  // the Trainer's model: slice 0 (positions from 0)
  if (ring) {           // slice 0 holds chunks 0 and 2S-1 of the sequence cut into 2S
    t.seq.ring = true;
    t.seq.second_position = (2 * a.sp - 1) * (a.seq / (2 * a.sp));
  }
  return t;
}

// ---- ring mode: the ring played in one process, on whole sequences in their own order ----
// q | k | v of every slice are put back at their places in the sequence (B, T, 3C), so a key is
// visible to a query when its index in the sequence is not after the query's: no position
// bookkeeping. The ring's schedule is kept: in hop h rank s's query chunks {s, 2S-1-s} meet rank
// (s-h)'s key chunks, tile by tile in the same order, with the same online-softmax update (running
// max, running sum, the accumulated output rescaled when the max rises), so the same roundings.
struct Whole {
  int S, B, T, C, NH;
  int chunk() const { return T / (2 * S); }
  int chunk_of(int s, int half) const { return half == 0 ? s : 2 * S - 1 - s; }
};

// rank s's query chunks against rank src's key chunks (forward), on the whole sequence
template <class T>
void whole_ring_tiles(const Whole& w, int s, int src, const T* qkv, acc_t<T>* m, acc_t<T>* l, acc_t<T>* acc) {
  using A = acc_t<T>;
  const int c = w.chunk(), hd = w.C / w.NH;
  const A scale = A(1) / std::sqrt(A(hd));
  std::vector<A> sc(c);
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++) {
      const int q0 = w.chunk_of(s, qh) * c, k0 = w.chunk_of(src, kh) * c;  // indices in the sequence
      if (k0 > q0 + c - 1) continue;
      for (int b = 0; b < w.B; b++)
        for (int h = 0; h < w.NH; h++)
          for (int i = q0; i < q0 + c; i++) {
            const int n = std::min(c, i - k0 + 1);  // keys k0 .. i of this tile
            if (n <= 0) continue;
            const T* q = qkv + (size_t(b) * w.T + i) * 3 * w.C + h * hd;
            A mx = -INFINITY;
            for (int j = 0; j < n; j++) {
              const T* k = qkv + (size_t(b) * w.T + k0 + j) * 3 * w.C + w.C + h * hd;
              A dot = 0;
              for (int x = 0; x < hd; x++) dot += load(q[x]) * load(k[x]);
              sc[j] = dot * scale;
              mx = std::max(mx, sc[j]);
            }
            const size_t row = (size_t(b) * w.NH + h) * w.T + i;
            const A m_new = std::max(m[row], mx);
            const A r = std::exp(m[row] - m_new);
            A* o = acc + (size_t(b) * w.T + i) * w.C + h * hd;
            for (int x = 0; x < hd; x++) o[x] *= r;
            A sum = 0;
            for (int j = 0; j < n; j++) {
              const A p = std::exp(sc[j] - m_new);
              const T* v = qkv + (size_t(b) * w.T + k0 + j) * 3 * w.C + 2 * w.C + h * hd;
              sum += p;
              for (int x = 0; x < hd; x++) o[x] += p * load(v[x]);
            }
            l[row] = l[row] * r + sum;
            m[row] = m_new;
          }
    }
}

// The ring's output against attention computed exactly (long double, from the same q, k, v), every
// element (NZ_RING_BOUND=1: the first micro-step of the first step). With u = 2^-24 (fp32; 2^-53 in
// fp64) and a row's scores s_j = q.k_j / sqrt(hd), n visible keys, h = hd:
//   each score is computed with |ŝ_j - s_j| <= d_j = γ_{h+3} Σ_x |q_x k_xj| / sqrt(hd) (the dot's h
//   roundings, the scale's sqrt and division, the product: Higham ch. 3);
//   exp(ŝ_j - m) carries the subtraction's rounding u |ŝ_j - m| and exp's own (< 2u), and every
//   rescale since (at most 2S tiles: a product and an exp, 3u each); l and acc are sums of at most n
//   terms (γ_n) of products (u) and one division ends it (u).
// So each weight w_j = p_j / l is within a factor exp(±η) of the exact, η = 2 max_j (d_j + u |ŝ_j - m|)
// + γ_{n + 6S + 6} (numerator and denominator each off by half of it), and, to first order,
//   |ô - o| <= 2 η Σ_j w_j |v_j|     (the 2: the perturbed weights no longer sum to exactly 1).
// Returns the largest |ô - o| / bound over every element (<= 1: within the bound), and the largest error.
template <class T>
std::pair<double, double> ring_error_over_bound(const Whole& w, const T* qkv, const T* out) {
  using A = acc_t<T>;
  const long double u = std::is_same<A, double>::value ? std::ldexp(1.0L, -53) : std::ldexp(1.0L, -24);
  auto gamma = [&](int k) { return k * u / (1 - k * u); };
  const int hd = w.C / w.NH;
  const long double scale = 1.0L / std::sqrt((long double)hd);
  double worst = 0, worst_err = 0;
  std::vector<long double> sc(w.T), ab(w.T);
  for (int b = 0; b < w.B; b++)
    for (int h = 0; h < w.NH; h++)
      for (int i = 0; i < w.T; i++) {
        const T* q = qkv + (size_t(b) * w.T + i) * 3 * w.C + h * hd;
        long double m = -INFINITY, d = 0;
        for (int j = 0; j <= i; j++) {
          const T* k = qkv + (size_t(b) * w.T + j) * 3 * w.C + w.C + h * hd;
          long double dot = 0, mag = 0;
          for (int x = 0; x < hd; x++) dot += (long double)load(q[x]) * load(k[x]), mag += fabsl((long double)load(q[x]) * load(k[x]));
          sc[j] = dot * scale;
          ab[j] = gamma(hd + 3) * mag * scale;
          m = std::max(m, sc[j]);
        }
        long double l = 0;
        for (int j = 0; j <= i; j++) {
          l += expl(sc[j] - m);
          d = std::max(d, ab[j] + u * (fabsl(sc[j] - m) + ab[j]));
        }
        const long double eta = 2 * d + gamma(i + 1 + 6 * w.S + 6);
        for (int x = 0; x < hd; x++) {
          long double o = 0, mag = 0;
          for (int j = 0; j <= i; j++) {
            const long double v = load(qkv[(size_t(b) * w.T + j) * 3 * w.C + 2 * w.C + h * hd + x]);
            o += expl(sc[j] - m) / l * v;
            mag += expl(sc[j] - m) / l * fabsl(v);
          }
          const long double err = fabsl((long double)load(out[(size_t(b) * w.T + i) * w.C + h * hd + x]) - o);
          const long double bound = 2 * eta * mag;
          worst = std::max(worst, double(err / bound));
          worst_err = std::max(worst_err, double(err));
        }
      }
  return {worst, worst_err};
}

// the backward of the same tiles: dq (whole, running), dkv (src's chunks' part of this hop)
template <class T>
void whole_ring_tiles_backward(const Whole& w, int s, int src, const T* qkv, const T* dout, const acc_t<T>* lse,
                               const acc_t<T>* D, acc_t<T>* dq, acc_t<T>* dkv) {
  using A = acc_t<T>;
  const int c = w.chunk(), hd = w.C / w.NH;
  const A scale = A(1) / std::sqrt(A(hd));
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++) {
      const int q0 = w.chunk_of(s, qh) * c, k0 = w.chunk_of(src, kh) * c;
      if (k0 > q0 + c - 1) continue;
      for (int b = 0; b < w.B; b++)
        for (int h = 0; h < w.NH; h++)
          for (int i = q0; i < q0 + c; i++) {
            const int n = std::min(c, i - k0 + 1);
            const size_t row = (size_t(b) * w.NH + h) * w.T + i;
            const T* q = qkv + (size_t(b) * w.T + i) * 3 * w.C + h * hd;
            const T* g = dout + (size_t(b) * w.T + i) * w.C + h * hd;
            A* gq = dq + (size_t(b) * w.T + i) * w.C + h * hd;
            for (int j = 0; j < n; j++) {
              const size_t kt = size_t(b) * w.T + k0 + j;
              const T* k = qkv + kt * 3 * w.C + w.C + h * hd;
              const T* v = k + w.C;
              A dot = 0, dp = 0;
              for (int x = 0; x < hd; x++) dot += load(q[x]) * load(k[x]);
              for (int x = 0; x < hd; x++) dp += load(g[x]) * load(v[x]);
              const A p = std::exp(dot * scale - lse[row]);
              const A ds = p * (dp - D[row]) * scale;
              A* gk = dkv + kt * 2 * w.C + h * hd;
              A* gv = gk + w.C;
              for (int x = 0; x < hd; x++) {
                gv[x] += p * load(g[x]);
                gq[x] += ds * load(k[x]);
                gk[x] += ds * load(q[x]);
              }
            }
          }
    }
}

// The argument list without --ranks N (the Trainer does not know it).
std::vector<char*> take_ranks(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; i++) {
    if (std::string(argv[i]) == "--ranks" && i + 1 < argc) g_ranks = atoi(argv[++i]);
    else rest.push_back(argv[i]);
  }
  return rest;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = take_ranks(argc, argv);
  int n_args = int(args.size());
  char** arg_v = args.data();
  Trainer run(n_args, arg_v, Stage::Ulysses, reference_topology);
  const Layout& L = run.layout;  // padded for N, as ulysses pads it
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit(), LNF = L.lnf_unit();
  const int N = g_ranks, S = run.args.sp, D = N / S, K = run.args.accum;
  const int B = run.args.batch, Tn = run.args.seq /* (T is the dispatch's type) */, Tl = Tn / S, C = run.args.cfg.dim, NH = run.args.cfg.heads;

  const bool ring = run.args.sp_mode == "ring";
  const Whole w{S, B, Tn, C, NH};
  // the S slice models: slice s holds tokens [s T/S, (s + 1) T/S) and uses their positions
  std::vector<std::unique_ptr<GPT>> own;
  std::vector<GPT*> slice{run.model.get()};
  for (int s = 1; s < S; s++) {
    const int c = Tn / (2 * S);  // ring: chunks s and 2S-1-s of 2S, at their own positions
    own.push_back(std::make_unique<GPT>(L, dt, B, Tn, false, 0, -1, 1,
                                        ring ? SeqSlices{S, s, s * c, true, (2 * S - 1 - s) * c} : SeqSlices{S, s, s * Tl}));
    slice.push_back(own.back().get());
  }

  // whole units: parameters, the step's gradient, the optimizer
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params (whole)");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e, "grads (whole)");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };
  auto G = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };
  AdamW adam(L, whole_units(L), dt, run.adamw);
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, P(u));
  }
  run.unit_access = UnitAccess{[&](int u) -> const void* { return P(u); }};
  run.hooks.forward_loss = [] { return double(NAN); };  // validation: not the truth here

  // each rank's gradient partial of every unit (a micro-step's), and the sum over ranks of one unit
  Buffer partial(Category::Scratch, Location::Device, size_t(N) * L.padded_total * e, "each rank's partial");
  Buffer summed(Category::Scratch, Location::Device, L.max_unit_padded * e, "a unit's sum over ranks");
  auto partial_of = [&](int r, int u) { return elem_ptr(partial, size_t(r) * L.padded_total + L.units[u].offset, e); };
  // attention on the whole sequence, all heads, per block: q|k|v, the probabilities, the output
  const size_t BT = size_t(B) * Tn;
  std::vector<Buffer> qkv, att, out;
  for (int l = 0; l < run.args.cfg.layers; l++) {
    qkv.emplace_back(Category::Scratch, Location::Device, BT * 3 * C * e, "whole qkv");
    if (!ring) att.emplace_back(Category::Scratch, Location::Device, size_t(B) * NH * Tn * Tn * e, "whole att");
    out.emplace_back(Category::Scratch, Location::Device, BT * C * e, "whole out");
  }
  Buffer dqkv(Category::Scratch, Location::Device, BT * 3 * C * e, "whole d qkv");
  Buffer dout(Category::Scratch, Location::Device, BT * C * e, "whole d out");
  // token rows of slice s, `width` elements each, between its (B, T/S) buffer and the whole (B, T):
  // its T/S contiguous tokens, or (ring) its two chunks s and 2S-1-s of T/(2S)
  auto rows_of = [&](int s, auto&& copy) {  // copy(row in the whole, row in the slice, rows)
    for (int b = 0; b < B; b++) {
      if (!ring) {
        copy(size_t(b) * Tn + size_t(s) * Tl, size_t(b) * Tl, Tl);
        continue;
      }
      for (int half = 0; half < 2; half++)
        copy(size_t(b) * Tn + size_t(w.chunk_of(s, half)) * w.chunk(), size_t(b) * Tl + half * w.chunk(), w.chunk());
    }
  };
  auto put = [&](void* whole, const void* part, int s, int width) {
    rows_of(s, [&](size_t at, size_t from, int n) {
      memcpy(static_cast<char*>(whole) + at * width * e, static_cast<const char*>(part) + from * width * e,
             size_t(n) * width * e);
    });
  };
  auto take = [&](void* part, const void* whole, int s, int width) {
    rows_of(s, [&](size_t at, size_t to, int n) {
      memcpy(static_cast<char*>(part) + to * width * e, static_cast<const char*>(whole) + at * width * e,
             size_t(n) * width * e);
    });
  };
  // ring: each block's log-sum-exp (B, NH, T); the running values (fp32, fp64 in tests)
  const size_t f = dt == DType::F64 ? 8 : 4, rows = size_t(B) * NH * Tn;
  std::vector<Buffer> lse;
  for (int l = 0; ring && l < run.args.cfg.layers; l++)
    lse.emplace_back(Category::Scratch, Location::Device, rows * f, "whole lse");
  Buffer run_m(Category::Scratch, Location::Device, rows * f, "whole m (D)");
  Buffer run_l(Category::Scratch, Location::Device, rows * f, "whole l");
  Buffer run_acc(Category::Scratch, Location::Device, BT * C * f, "whole acc (dq)");
  Buffer dkv_f(Category::Scratch, Location::Device, BT * 2 * C * f, "a hop's dk | dv");
  Buffer dkv(Category::Scratch, Location::Device, BT * 2 * C * e, "dk | dv, summed hop by hop");
  bool check_bound = false;  // NZ_RING_BOUND=1: the first micro-step's attention against exact
  // ring: the forward of block l's attention, the whole sequence, the ring's schedule
  auto ring_forward = [&](int l) {
    NZ_DISPATCH_DTYPE(dt, {
      using A = acc_t<T>;
      A *m = (A*)run_m.data(), *sum = (A*)run_l.data(), *acc = (A*)run_acc.data();
      for (size_t r = 0; r < rows; r++) m[r] = -INFINITY, sum[r] = 0;
      for (size_t i = 0; i < BT * C; i++) acc[i] = 0;
      for (int hop = 0; hop < S; hop++)
        for (int s = 0; s < S; s++) whole_ring_tiles<T>(w, s, (s - hop + S) % S, (const T*)qkv[l].data(), m, sum, acc);
      const int hd = C / NH;
      for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
          for (int t = 0; t < Tn; t++) {
            const size_t row = (size_t(b) * NH + h) * Tn + t, at = (size_t(b) * Tn + t) * C + h * hd;
            for (int x = 0; x < hd; x++) ((T*)out[l].data())[at + x] = store<T>(acc[at + x] / sum[row]);
            ((A*)lse[l].data())[row] = m[row] + std::log(sum[row]);
          }
      if (check_bound) {  // NZ_RING_BOUND: every element within the derived bound of exact attention
        const std::pair<double, double> r = ring_error_over_bound<T>(w, (const T*)qkv[l].data(), (const T*)out[l].data());
        printf("ring-bound: block %d: max |error| / bound %.3g, max |error| %.3g\n", l, r.first, r.second);
      }
    });
  };
  // ring: its backward; dk | dv of rank src's chunks gets query rank src's part, then src+1's, ...
  auto ring_backward = [&](int l) {
    NZ_DISPATCH_DTYPE(dt, {
      using A = acc_t<T>;
      A *D = (A*)run_m.data(), *dq = (A*)run_acc.data(), *gf = (A*)dkv_f.data();
      T* g = (T*)dkv.data();
      const T* o = (const T*)out[l].data();
      const T* dO = (const T*)dout.data();
      const int hd = C / NH;
      for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
          for (int t = 0; t < Tn; t++) {
            const size_t at = (size_t(b) * Tn + t) * C + h * hd;
            A sum = 0;
            for (int x = 0; x < hd; x++) sum += load(dO[at + x]) * load(o[at + x]);
            D[(size_t(b) * NH + h) * Tn + t] = sum;
          }
      for (size_t i = 0; i < BT * C; i++) dq[i] = 0;
      for (size_t i = 0; i < BT * 2 * C; i++) g[i] = store<T>(A(0));
      for (int hop = 0; hop < S; hop++)
        for (int s = 0; s < S; s++) {
          const int src = (s - hop + S) % S;
          for (size_t i = 0; i < BT * 2 * C; i++) gf[i] = 0;
          whole_ring_tiles_backward<T>(w, s, src, (const T*)qkv[l].data(), dO, (const A*)lse[l].data(), D, dq, gf);
          rows_of(src, [&](size_t at, size_t, int n) {  // src's chunks: this hop's part added, one rounding
            for (size_t i = at * 2 * C; i < (at + n) * 2 * C; i++) g[i] = store<T>(load(g[i]) + gf[i]);
          });
        }
      T* dx = (T*)dqkv.data();
      for (size_t t = 0; t < BT; t++) {
        for (int x = 0; x < C; x++) dx[t * 3 * C + x] = store<T>(dq[t * C + x]);
        memcpy(dx + t * 3 * C + C, g + t * 2 * C, 2 * C * e);
      }
    });
  };

  std::vector<int> tokens(BT), targets(BT);
  std::vector<double> rank_loss(N);
  std::vector<char> shard(L.shard_total * e);
  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (GPT* m : slice) m->set_loss_scale(run.loss_scale());
    for (int k = 0; k < K; k++) {
      run.phase("forward");
      check_bound = ring && getenv("NZ_RING_BOUND") && step == run.first_step() && k == 0;
      for (int d = 0; d < D; d++) {  // replica d's micro-batch, its S slices side by side
        run.data->train_batch(step, k, K, D, d, tokens.data(), targets.data());
        for (GPT* m : slice) m->set_batch(tokens.data(), targets.data(), B);
        for (int u = 0; u < L.num_units(); u++) {
          if (u == EMBED || u == LNF) {
            for (GPT* m : slice) m->forward(u, P(u));
            continue;
          }
          const int l = u - 1;
          for (int s = 0; s < S; s++) {
            slice[s]->attention_input(u, P(u));
            put(qkv[l].data(), slice[s]->attention_buffers(u).qkv, s, 3 * C);
          }
          if (ring) ring_forward(l);
          else
            NZ_DISPATCH_DTYPE(dt, ops::attention_forward<T>((T*)out[l].data(), (T*)att[l].data(),
                                                            (const T*)qkv[l].data(), B, Tn, C, NH));
          for (int s = 0; s < S; s++) {
            take(slice[s]->attention_buffers(u).out, out[l].data(), s, C);
            slice[s]->attention_output(u, P(u));
          }
        }
        for (int s = 0; s < S; s++) {
          slice[s]->head_forward(P(EMBED));
          const double batch = slice[s]->take_loss_sum();  // this rank's micro-batch, summed in token order
          const int r = d * S + s;
          rank_loss[r] = k == 0 ? batch : rank_loss[r] + batch;  // as its loss total adds them up
        }
        run.phase("backward");
        for (GPT* m : slice) m->head_backward(P(EMBED));
        for (int u = L.num_units() - 1; u >= 0; u--) {
          const void* p = u == EMBED ? nullptr : P(u);
          if (u == EMBED || u == LNF) {
            for (int s = 0; s < S; s++) slice[s]->backward(u, p, partial_of(d * S + s, u));
            continue;
          }
          const int l = u - 1;
          for (int s = 0; s < S; s++) {
            slice[s]->attention_output_backward(u, p, partial_of(d * S + s, u));
            put(dout.data(), slice[s]->attention_buffers(u).grad_out, s, C);
          }
          if (ring) ring_backward(l);
          else
            NZ_DISPATCH_DTYPE(dt, ops::attention_backward<T>((T*)dqkv.data(), (const T*)dout.data(),
                                                             (const T*)qkv[l].data(), (const T*)att[l].data(),
                                                             (const T*)out[l].data(), B, Tn, C, NH));
          for (int s = 0; s < S; s++) {
            take(slice[s]->attention_buffers(u).grad_qkv, dqkv.data(), s, 3 * C);
            slice[s]->attention_input_backward(u, p, partial_of(d * S + s, u));
          }
        }
      }
      // each unit: the N partials summed in rank order, then the average added (ZeRO-3's way)
      for (int u = 0; u < L.num_units(); u++) {
        const size_t n = L.units[u].padded;
        NZ_DISPATCH_TRAIN_DTYPE(dt, {
          T* sum = (T*)summed.data();
          for (size_t i = 0; i < n; i++) {
            acc_t<T> acc = load(((const T*)partial_of(0, u))[i]);
            for (int r = 1; r < N; r++) acc += load(((const T*)partial_of(r, u))[i]);
            sum[i] = store<T>(acc);
          }
        });
        accumulate_grads(dt, G(u), summed.data(), n, run.grad_average_scale(), k == 0);
      }
    }
    run.phase("optimizer");
    // the norm: rank r's owned slices summed as it sums them, the N partials in rank order
    double sq = 0;
    for (int r = 0; r < N; r++) {
      for (int u = 0; u < L.num_units(); u++) {
        const Slice own_slice = L.shard(u, r);
        memcpy(shard.data() + L.units[u].shard_offset * e, static_cast<char*>(G(u)) + own_slice.begin * e,
               own_slice.size() * e);
      }
      const double mine = sq_sum_of_shard(L, dt, shard.data(), Location::Host);
      sq = r == 0 ? mine : sq + mine;
    }
    const double norm = std::sqrt(sq) / run.loss_scale();
    double loss_sum = rank_loss[0];
    for (int r = 1; r < N; r++) loss_sum += rank_loss[r];
    if (run.skip_step(step, loss_sum, norm)) continue;
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) adam.step(u, P(u), G(u), run.lr(), scale, run.adam_step());
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
