// ring.cpp — ring attention for --sp-mode ring: the tiles, the online softmax, the hops (ring.h).
#include "ulysses/ring.h"

#include <algorithm>  // std::max
#include <cmath>      // std::exp, std::log, std::sqrt, INFINITY
#include <cstring>    // memcpy

#include "runtime/check.h"  // user_error

namespace nz {

namespace {

// The global position of token i of half h (0: chunk r, 1: chunk 2S-1-r) of rank r.
int ring_position(const RingDims& d, int r, int h, int i) {
  const int c = d.Tl / 2;
  return (h == 0 ? r : 2 * d.S - 1 - r) * c + i;
}

// How many keys of rank src's half kh a query at global position qp sees (causal: key position <=
// query position; a chunk's positions rise, so the visible keys are a prefix of the tile).
int ring_visible(const RingDims& d, int src, int kh, int qp) {
  int n = 0;
  while (n < d.Tl / 2 && ring_position(d, src, kh, n) <= qp) n++;
  return n;
}

// The forward of my queries (qkv: B x Tl x 3C) against rank src's keys and values (kv:
// B x Tl x 2C, k | v), tile by tile (my half, its half), in that order. Each query row and head
// keeps m (the running max of its scores), l (the running sum of exp(score - m)) and acc (the
// running sum of exp(score - m) v). A tile that raises the max rescales what was accumulated by
// exp(m_old - m_new), so at the end every term is relative to the final max: out = acc / l,
// exactly softmax(scores) v.
template <class T>
void ring_attend(const RingDims& d, int me, int src, const T* qkv, const T* kv, acc_t<T>* m,
                 acc_t<T>* l, acc_t<T>* acc) {
  using A = acc_t<T>;
  const int c = d.Tl / 2, hd = d.C / d.NH;
  const A scale = A(1) / std::sqrt(A(hd));
  std::vector<A> score(c);
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++) {
      // a key tile entirely after my query tile is causally invisible: skipped, no work
      if (ring_position(d, src, kh, 0) > ring_position(d, me, qh, c - 1)) continue;
      for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.NH; h++)
          for (int i = 0; i < c; i++) {
            const int n = ring_visible(d, src, kh, ring_position(d, me, qh, i));
            if (n == 0) continue;
            const size_t t = size_t(b) * d.Tl + qh * c + i;  // my token
            const T* q = qkv + t * 3 * d.C + h * hd;
            A tile_max = -INFINITY;
            for (int j = 0; j < n; j++) {
              const T* k = kv + (size_t(b) * d.Tl + kh * c + j) * 2 * d.C + h * hd;
              A dot = 0;
              for (int x = 0; x < hd; x++) dot += load(q[x]) * load(k[x]);
              score[j] = dot * scale;
              tile_max = std::max(tile_max, score[j]);
            }
            const size_t row = (size_t(b) * d.NH + h) * d.Tl + qh * c + i;
            const A m_new = std::max(m[row], tile_max);
            // the terms so far, made relative to the new max
            const A rescale = std::exp(m[row] - m_new);
            A* o = acc + t * d.C + h * hd;
            for (int x = 0; x < hd; x++) o[x] *= rescale;
            A sum = 0;
            for (int j = 0; j < n; j++) {
              const A p = std::exp(score[j] - m_new);
              const T* v = kv + (size_t(b) * d.Tl + kh * c + j) * 2 * d.C + d.C + h * hd;
              sum += p;
              for (int x = 0; x < hd; x++) o[x] += p * load(v[x]);
            }
            l[row] = l[row] * rescale + sum;
            m[row] = m_new;
          }
    }
}

// After the last hop: out = acc / l (B x Tl x C), and the log-sum-exp m + log l that the backward
// recomputes every probability from.
template <class T>
void ring_finish(const RingDims& d, const acc_t<T>* m, const acc_t<T>* l, const acc_t<T>* acc,
                 T* out, acc_t<T>* lse) {
  const int hd = d.C / d.NH;
  for (int b = 0; b < d.B; b++)
    for (int h = 0; h < d.NH; h++)
      for (int t = 0; t < d.Tl; t++) {
        const size_t row = (size_t(b) * d.NH + h) * d.Tl + t;
        const size_t at = (size_t(b) * d.Tl + t) * d.C + h * hd;
        for (int x = 0; x < hd; x++) out[at + x] = store<T>(acc[at + x] / l[row]);
        lse[row] = m[row] + std::log(l[row]);
      }
}

// The backward of one tile set (my queries, rank src's keys and values), recomputing each
// probability from the saved log-sum-exp: p = exp(score - lse), dv += p dout, dp = dout . v,
// ds = p (dp - D) with D = dout . out per row, dq += ds k scale, dk += ds q scale. dq (B x Tl x C)
// is mine; dkv (B x Tl x 2C, dk | dv) is rank src's, this hop's part.
template <class T>
void ring_attend_backward(const RingDims& d, int me, int src, const T* qkv, const T* kv,
                          const T* dout, const acc_t<T>* lse, const acc_t<T>* D, acc_t<T>* dq,
                          acc_t<T>* dkv) {
  using A = acc_t<T>;
  const int c = d.Tl / 2, hd = d.C / d.NH;
  const A scale = A(1) / std::sqrt(A(hd));
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++) {
      // as the forward: a key tile entirely after my query tile is skipped
      if (ring_position(d, src, kh, 0) > ring_position(d, me, qh, c - 1)) continue;
      for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.NH; h++)
          for (int i = 0; i < c; i++) {
            const int n = ring_visible(d, src, kh, ring_position(d, me, qh, i));
            const size_t t = size_t(b) * d.Tl + qh * c + i;
            const size_t row = (size_t(b) * d.NH + h) * d.Tl + qh * c + i;
            const T* q = qkv + t * 3 * d.C + h * hd;
            const T* g = dout + t * d.C + h * hd;
            A* gq = dq + t * d.C + h * hd;
            for (int j = 0; j < n; j++) {
              const size_t kt = size_t(b) * d.Tl + kh * c + j;
              const T* k = kv + kt * 2 * d.C + h * hd;
              const T* v = k + d.C;
              A dot = 0, dp = 0;
              for (int x = 0; x < hd; x++) dot += load(q[x]) * load(k[x]);
              for (int x = 0; x < hd; x++) dp += load(g[x]) * load(v[x]);
              const A p = std::exp(dot * scale - lse[row]);
              const A ds = p * (dp - D[row]) * scale;
              A* gk = dkv + kt * 2 * d.C + h * hd;
              A* gv = gk + d.C;
              for (int x = 0; x < hd; x++) {
                gv[x] += p * load(g[x]);
                gq[x] += ds * load(k[x]);
                gk[x] += ds * load(q[x]);
              }
            }
          }
    }
}

// D = dout . out, per row and head (B x NH x Tl).
template <class T>
void ring_row_dots(const RingDims& d, const T* dout, const T* out, acc_t<T>* D) {
  using A = acc_t<T>;
  const int hd = d.C / d.NH;
  for (int b = 0; b < d.B; b++)
    for (int h = 0; h < d.NH; h++)
      for (int t = 0; t < d.Tl; t++) {
        const size_t at = (size_t(b) * d.Tl + t) * d.C + h * hd;
        A sum = 0;
        for (int x = 0; x < hd; x++) sum += load(dout[at + x]) * load(out[at + x]);
        D[(size_t(b) * d.NH + h) * d.Tl + t] = sum;
      }
}
}  // namespace

void ring_zigzag(const Args& a, int s, Topology& t) {
  const int S = a.sp, T = a.seq;
  if (T % (2 * S) != 0)
    user_error("--sp %d --sp-mode ring: a sequence of %d tokens does not cut into %d equal chunks "
               "(the zig-zag order gives each rank two), expected --seq a multiple of %d; "
               "e.g. --seq %d",
               S, T, 2 * S, 2 * S, T / (2 * S) * 2 * S > 0 ? T / (2 * S) * 2 * S : 2 * S);
  t.seq.ring = true;
  t.seq.first_position = s * (T / (2 * S));
  t.seq.second_position = (2 * S - 1 - s) * (T / (2 * S));
}

RingAttention::RingAttention(Comm& group, const Args& a, int s, DType dt)
    : group_(group), s_(s), dt_(dt), e_(dtype_bytes(dt)),
      d_{a.sp, a.batch, a.seq / a.sp, a.cfg.dim, a.cfg.heads},
      rows_(size_t(d_.B) * d_.NH * d_.Tl), kv_elems_(size_t(d_.B) * d_.Tl * 2 * d_.C) {
  const RingDims& d = d_;
  // the online softmax's running values: fp32 (fp64 in tests)
  const size_t f = dt == DType::F64 ? 8 : 4;
  for (int l = 0; l < a.cfg.layers; l++)
    lse_.emplace_back(Category::Activations, Location::Device, rows_ * f, "ring: log-sum-exp");
  run_max_ = Buffer(Category::Activations, Location::Device, rows_ * f, "ring: running max (D)");
  run_sum_ = Buffer(Category::Activations, Location::Device, rows_ * f, "ring: running sum");
  run_acc_ = Buffer(Category::Activations, Location::Device, size_t(d.B) * d.Tl * d.C * f,
                    "ring: output (dq) sums");
  dkv_hop_ = Buffer(Category::Activations, Location::Device, kv_elems_ * f,
                    "ring: a hop's dk | dv");
  for (Buffer& b : travel_)
    b = Buffer(Category::Activations, Location::Device, 2 * kv_elems_ * e_,
               "ring: k | v, dk | dv");
}

// one hop: send what I hold (elems from `offset` on) to the next rank, receive the previous rank's
void RingAttention::pass(size_t offset, size_t elems) {
  const int S = d_.S;
  char* mine = static_cast<char*>(travel_[cur_].data()) + offset * e_;
  char* theirs = static_cast<char*>(travel_[1 - cur_].data()) + offset * e_;
  CommRequest sent = group_.send_start(mine, elems, dt_, (s_ + 1) % S, /*tag*/ 42);
  group_.recv(theirs, elems, dt_, (s_ + S - 1) % S, 42);
  group_.wait(sent);
  cur_ = 1 - cur_;
}

// forward: k | v of my tokens set off; in hop h I attend to those of rank s-h (S hops, S-1 sends)
void RingAttention::forward(int u, const void* qkv, void* out) {
  const int S = d_.S, Tl = d_.Tl, C = d_.C;
  const size_t BTl = size_t(d_.B) * Tl;
  NZ_DISPATCH_DTYPE(dt_, {
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(qkv);
    T* kv = static_cast<T*>(travel_[cur_].data());
    for (size_t t = 0; t < BTl; t++)  // k | v: columns C .. 3C of my q | k | v
      memcpy(kv + t * 2 * C, x + t * 3 * C + C, 2 * C * e_);
    A* m = static_cast<A*>(run_max_.data());
    A* l = static_cast<A*>(run_sum_.data());
    A* acc = static_cast<A*>(run_acc_.data());
    for (size_t r = 0; r < rows_; r++) m[r] = -INFINITY, l[r] = 0;
    for (size_t i = 0; i < BTl * C; i++) acc[i] = 0;
    for (int hop = 0; hop < S; hop++) {
      if (hop > 0) pass(0, kv_elems_);  // send: k | v I hold to s+1; receive: s-1's
      const T* held = static_cast<const T*>(travel_[cur_].data());
      ring_attend<T>(d_, s_, (s_ - hop + S) % S, x, held, m, l, acc);
    }
    ring_finish<T>(d_, m, l, acc, static_cast<T*>(out), static_cast<A*>(lse_[u - 1].data()));
  });
}

// backward: k | v travel again, now with the dk | dv of their rank. Hop h: I add my queries'
// part to rank s-h's dk | dv and pass both on; after the S-th hop one more send takes each
// rank's dk | dv home, summed over the query ranks in ring order (s, s+1, ..., s-1), one rounding
// per hop.
// Exact and simple: nothing is held for other ranks between hops.
void RingAttention::backward(int u, const void* qkv, const void* out, const void* dout,
                             void* dqkv) {
  const int S = d_.S, Tl = d_.Tl, C = d_.C;
  const size_t BTl = size_t(d_.B) * Tl, kv_elems = kv_elems_;
  NZ_DISPATCH_DTYPE(dt_, {
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(qkv);
    T* kv = static_cast<T*>(travel_[cur_].data());
    for (size_t t = 0; t < BTl; t++) memcpy(kv + t * 2 * C, x + t * 3 * C + C, 2 * C * e_);
    for (size_t i = 0; i < kv_elems; i++) kv[kv_elems + i] = store<T>(A(0));
    A* D = static_cast<A*>(run_max_.data());
    A* dq = static_cast<A*>(run_acc_.data());
    A* dkv = static_cast<A*>(dkv_hop_.data());
    ring_row_dots<T>(d_, static_cast<const T*>(dout), static_cast<const T*>(out), D);
    for (size_t i = 0; i < BTl * C; i++) dq[i] = 0;
    for (int hop = 0; hop < S; hop++) {
      if (hop > 0) pass(0, 2 * kv_elems);  // k | v and dk | dv so far, to s+1
      T* held = static_cast<T*>(travel_[cur_].data());
      for (size_t i = 0; i < kv_elems; i++) dkv[i] = 0;
      ring_attend_backward<T>(d_, s_, (s_ - hop + S) % S, x, held, static_cast<const T*>(dout),
                              static_cast<const A*>(lse_[u - 1].data()), D, dq, dkv);
      for (size_t i = 0; i < kv_elems; i++)
        held[kv_elems + i] = store<T>(load(held[kv_elems + i]) + dkv[i]);
    }
    if (S > 1) pass(kv_elems, kv_elems);  // dk | dv home: I now hold my own tokens'
    const T* home = static_cast<const T*>(travel_[cur_].data()) + kv_elems;
    T* g = static_cast<T*>(dqkv);
    for (size_t t = 0; t < BTl; t++) {
      for (int c = 0; c < C; c++) g[t * 3 * C + c] = store<T>(dq[t * C + c]);
      memcpy(g + t * 3 * C + C, home + t * 2 * C, 2 * C * e_);
    }
  });
}

}  // namespace nz
