// ulysses — sequence parallelism (DeepSpeed-Ulysses) with ZeRO-3: split each sequence too.
//
// Idea:  the N ranks are D replicas x S sequence slices (--sp S; rank = d S + s). Each of a
//        replica's S ranks holds T/S contiguous tokens of every sequence, with their positions
//        (wpe's rows from s T/S). Every op but attention works token by token, on my tokens.
//        Before attention an all-to-all turns (my tokens, all heads) of q, k, v into (all T
//        tokens, my NH/S heads); attention runs exactly, per head, causal in global positions;
//        a second all-to-all turns its output back into (my tokens, all heads). The backward
//        does the same in reverse. My weight gradients are my tokens' part of the batch's;
//        ZeRO-3's reduce-scatter over all N ranks sums them, in rank order, with the replicas'.
// Holds: stage3's model states, the layout padded for N; activations of T/S tokens, attention's
//        probabilities B (NH/S) T^2 per block: 1/S of stage3's (ulysses/formulas.h).
// Sends: stage3's 3K(N-1)S; per block and micro-step four all-to-alls in my replica's group
//        of S ranks, 8 B (T/S) C (S-1)/S elements per rank.
// Ring:  --sp-mode ring (the comparison): no all-to-all; my tokens are two zig-zag chunks, k | v of
//        every rank's tokens travel around the S ranks and attention runs per tile with an online
//        softmax (ring_attend below); activations of T/S tokens with every head, no T^2 term;
//        sends (6S-4) B (T/S) C elements per block and micro-step (ulysses/formulas.h).
// Docs:  docs/ulysses.md; README.md (the ladder); docs/stages.md.
#include <cmath>      // std::sqrt
#include <cstring>    // memcpy

#include "kernels/ops.h"  // kernels on the run's backend
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)
#include "ulysses/formulas.h"  // ulysses_activation_bytes

using namespace nz;

namespace {

// The split: S sequence slices x D = N/S replicas, a replica's slices on consecutive ranks.
// What cannot be split is one line here, before anything is sized.
Topology ulysses_topology(const Args& a, int world, int rank) {
  const int S = a.sp, H = a.cfg.heads, T = a.seq;
  const bool ring = a.sp_mode == "ring";
  if (world % S != 0)
    user_error("--sp %d on %d ranks: the ranks do not make whole sequence groups of %d, "
               "expected an S that divides %d (N = S x replicas); e.g. --sp %d",
               S, world, S, world, world % 2 == 0 ? 2 : 1);
  if (!ring && H % S != 0)
    user_error("--sp %d: the %d heads do not split over %d ranks, expected an S that divides "
               "%d (each rank attends with NH/S whole heads); e.g. --sp %d",
               S, H, S, H, H % 2 == 0 ? 2 : 1);
  if (ring && T % (2 * S) != 0)
    user_error("--sp %d --sp-mode ring: a sequence of %d tokens does not cut into %d equal chunks "
               "(the zig-zag order gives each rank two), expected --seq a multiple of %d; e.g. --seq %d",
               S, T, 2 * S, 2 * S, T / (2 * S) * 2 * S > 0 ? T / (2 * S) * 2 * S : 2 * S);
  if (T % S != 0)
    user_error("--sp %d: a sequence of %d tokens does not split into %d equal slices, "
               "expected an S that divides --seq %d; e.g. --seq %d",
               S, T, S, T, T / S * S > 0 ? T / S * S : S);
  if (a.activation_checkpointing)
    user_error("--activation-checkpointing with ulysses: not built yet (the recompute would "
               "repeat the all-to-alls), expected it off; drop the flag");
  if (!a.ckpt_dir.empty() || !a.resume.empty())
    user_error("--ckpt-dir/--resume with ulysses: checkpoints are not built for this rung "
               "yet, expected neither; drop them, or train with stage3");
  if (a.qat_bits)
    user_error("--qat with ulysses: not built for this rung, expected no --qat; drop it");
  if (a.device == "cuda")
    user_error("--device cuda: ulysses' all-to-alls run on the CPU backend only, expected "
               "--device cpu or auto; run stage3 on the GPU");
  Topology t;
  t.dp_world = world / S, t.dp_rank = rank / S;  // my replica: it splits the data with the others
  const int s = rank % S;                        // my slice of every sequence
  t.seq.slices = S;
  t.seq.slice = s;
  t.seq.first_position = s * (T / S);  // learned absolute positions: my tokens' rows of wpe
  if (ring) {  // the zig-zag order: chunks s and 2S-1-s of 2S, and their positions
    t.seq.ring = true;
    t.seq.first_position = s * (T / (2 * S));
    t.seq.second_position = (2 * S - 1 - s) * (T / (2 * S));
  }
  return t;
}


// ---- ring attention (--sp-mode ring) ----
// The sequence of T tokens is cut into 2S chunks of c = T/(2S); rank s of a sequence group holds
// chunks s and 2S-1-s, its halves 0 and 1 (the zig-zag order: an early chunk, which sees few keys,
// with a late one, which sees many, so every rank has the same causal work). My queries stay; the
// keys and values of every rank's tokens travel around the ring (rank s sends to s+1 and receives
// from s-1), so in hop h I hold those of rank s-h. Attention runs per (query chunk, key chunk) tile,
// every head, with an online softmax: nothing of size T is ever held.
struct RingDims {
  int S, B, Tl, C, NH;  // ranks in the ring, sequences, my tokens (2 chunks), width, heads
};

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

// The forward of my queries (qkv: B x Tl x 3C) against rank src's keys and values (kv: B x Tl x 2C,
// k | v), tile by tile (my half, its half), in that order. Each query row and head keeps m (the
// running max of its scores), l (the running sum of exp(score - m)) and acc (the running sum of
// exp(score - m) v). A tile that raises the max rescales what was accumulated by exp(m_old - m_new),
// so at the end every term is relative to the final max: out = acc / l, exactly softmax(scores) v.
template <class T>
void ring_attend(const RingDims& d, int me, int src, const T* qkv, const T* kv, acc_t<T>* m, acc_t<T>* l,
                 acc_t<T>* acc) {
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
            const A rescale = std::exp(m[row] - m_new);  // the terms so far, relative to the new max
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
void ring_finish(const RingDims& d, const acc_t<T>* m, const acc_t<T>* l, const acc_t<T>* acc, T* out,
                 acc_t<T>* lse) {
  const int hd = d.C / d.NH;
  for (int b = 0; b < d.B; b++)
    for (int h = 0; h < d.NH; h++)
      for (int t = 0; t < d.Tl; t++) {
        const size_t row = (size_t(b) * d.NH + h) * d.Tl + t, at = (size_t(b) * d.Tl + t) * d.C + h * hd;
        for (int x = 0; x < hd; x++) out[at + x] = store<T>(acc[at + x] / l[row]);
        lse[row] = m[row] + std::log(l[row]);
      }
}

// The backward of one tile set (my queries, rank src's keys and values), recomputing each probability
// from the saved log-sum-exp: p = exp(score - lse), dv += p dout, dp = dout . v, ds = p (dp - D) with
// D = dout . out per row, dq += ds k scale, dk += ds q scale. dq (B x Tl x C) is mine; dkv (B x Tl x 2C,
// dk | dv) is rank src's, this hop's part.
template <class T>
void ring_attend_backward(const RingDims& d, int me, int src, const T* qkv, const T* kv, const T* dout,
                          const acc_t<T>* lse, const acc_t<T>* D, acc_t<T>* dq, acc_t<T>* dkv) {
  using A = acc_t<T>;
  const int c = d.Tl / 2, hd = d.C / d.NH;
  const A scale = A(1) / std::sqrt(A(hd));
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++) {
      if (ring_position(d, src, kh, 0) > ring_position(d, me, qh, c - 1)) continue;  // as the forward
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

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Ulysses, ulysses_topology);
  const Layout& L = run.layout;  // padded for all N ranks: ZeRO-3 over replicas and slices
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int LNF = L.lnf_unit();
  const int rank = run.rank();
  GPT& model = *run.model;  // my slice of every sequence (model.h, SeqSlices)
  Comm& comm = run.comm;

  // ---- the split: my replica's S ranks, who hold the other slices of my sequences ----
  const int S = run.args.sp, T = run.args.seq, Tl = T / S, C = run.args.cfg.dim;
  Comm group(comm, /*color: my replica*/ rank / S, /*key: my slice*/ rank % S);
  // the all-to-alls' send and receive buffer, in place: B T/S tokens of 3C (q | k | v) at most
  const bool ring = run.args.sp_mode == "ring";
  Buffer exchange;  // (ring mode passes keys and values around instead: the ring's buffers below)
  if (!ring)
    exchange = Buffer(Category::Activations, Location::Device, size_t(run.args.batch) * Tl * 3 * C * e,
                      "all-to-all exchange");

  // ---- the two all-to-alls (DeepSpeed-Ulysses) ----
  // tokens (B, T/S, parts x C): my tokens, every head  ->  heads (B, T, parts x C/S): every
  // token, my NH/S heads. parts = 3 for q | k | v, 1 for attention's output (or the gradients).
  // Head group j's columns of part p are [p C + j C/S, p C + (j + 1) C/S): slot j of the
  // exchange is what goes to rank j; after the all-to-all, slot j holds rank j's tokens
  // (positions j T/S on) of my heads.
  auto tokens_to_heads = [&](const void* tokens, void* heads, int parts) {
    const int B = model.rows(), Ch = C / S;
    // bytes: a token's row in the heads' layout, and a slot (what one rank gets)
    const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;
    const char* tok = static_cast<const char*>(tokens);
    char* x = static_cast<char*>(exchange.data());
    for (int j = 0; j < S; j++)
      for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
          for (int p = 0; p < parts; p++)
            memcpy(x + j * slot + (size_t(b) * Tl + t) * row + p * Ch * e,
                   tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e, Ch * e);
    group.all_to_all(exchange.data(), slot / e, dt);  // all-to-all: my heads' share to each rank
    char* out = static_cast<char*>(heads);
    for (int j = 0; j < S; j++)  // rank j's tokens are positions j T/S .. (j + 1) T/S - 1
      for (int b = 0; b < B; b++)
        memcpy(out + (size_t(b) * T + size_t(j) * Tl) * row, x + j * slot + size_t(b) * Tl * row,
               Tl * row);
  };
  // heads (B, T, parts x C/S)  ->  tokens (B, T/S, parts x C): the inverse, back to my tokens
  auto heads_to_tokens = [&](const void* heads, void* tokens, int parts) {
    const int B = model.rows(), Ch = C / S;
    const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;
    const char* in = static_cast<const char*>(heads);
    char* x = static_cast<char*>(exchange.data());
    for (int j = 0; j < S; j++)  // to rank j: its tokens, of my heads
      for (int b = 0; b < B; b++)
        memcpy(x + j * slot + size_t(b) * Tl * row, in + (size_t(b) * T + size_t(j) * Tl) * row,
               Tl * row);
    group.all_to_all(exchange.data(), slot / e, dt);  // all-to-all: slot j: heads j, my tokens
    char* tok = static_cast<char*>(tokens);
    for (int j = 0; j < S; j++)
      for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
          for (int p = 0; p < parts; p++)
            memcpy(tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e,
                   x + j * slot + (size_t(b) * Tl + t) * row + p * Ch * e, Ch * e);
  };


  // ---- ring attention (--sp-mode ring): my queries stay, keys and values go around the ring ----
  const int B = run.args.batch, NH = run.args.cfg.heads, s_me = rank % S;
  const RingDims rd{S, B, Tl, C, NH};
  const size_t f = dt == DType::F64 ? 8 : 4;  // the online softmax's running values: fp32 (fp64 in tests)
  const size_t rows = size_t(B) * NH * Tl, kv_elems = size_t(B) * Tl * 2 * C;
  std::vector<Buffer> lse;  // per block: the log-sum-exp of every row, what the backward recomputes from
  Buffer run_max, run_sum, run_acc, dkv_hop;  // the forward's m, l, acc; the backward's D, dq, a hop's dk|dv
  Buffer travel[2];  // what travels: k | v of one rank's tokens, then (backward) their dk | dv
  if (ring) {
    for (int l = 0; l < run.args.cfg.layers; l++)
      lse.emplace_back(Category::Activations, Location::Device, rows * f, "ring: log-sum-exp");
    run_max = Buffer(Category::Activations, Location::Device, rows * f, "ring: running max (D)");
    run_sum = Buffer(Category::Activations, Location::Device, rows * f, "ring: running sum");
    run_acc = Buffer(Category::Activations, Location::Device, size_t(B) * Tl * C * f, "ring: output (dq) sums");
    dkv_hop = Buffer(Category::Activations, Location::Device, kv_elems * f, "ring: a hop's dk | dv");
    for (Buffer& b : travel)
      b = Buffer(Category::Activations, Location::Device, 2 * kv_elems * e, "ring: k | v, dk | dv");
  }
  int cur = 0;  // travel[cur] holds what I work on this hop
  // one hop: send what I hold (elems from `offset` on) to the next rank, receive the previous rank's
  auto pass = [&](size_t offset, size_t elems) {
    char* mine = static_cast<char*>(travel[cur].data()) + offset * e;
    char* theirs = static_cast<char*>(travel[1 - cur].data()) + offset * e;
    CommRequest sent = group.send_start(mine, elems, dt, (s_me + 1) % S, /*tag*/ 42);
    group.recv(theirs, elems, dt, (s_me + S - 1) % S, 42);
    group.wait(sent);
    cur = 1 - cur;
  };
  // forward: k | v of my tokens set off; in hop h I attend to those of rank s-h (S hops, S-1 sends)
  auto ring_forward = [&](int u, const void* qkv, void* out) {
    NZ_DISPATCH_DTYPE(dt, {
      using A = acc_t<T>;
      const T* x = static_cast<const T*>(qkv);
      T* kv = static_cast<T*>(travel[cur].data());
      for (size_t t = 0; t < size_t(B) * Tl; t++)  // k | v: columns C .. 3C of my q | k | v
        memcpy(kv + t * 2 * C, x + t * 3 * C + C, 2 * C * e);
      A* m = static_cast<A*>(run_max.data());
      A* l = static_cast<A*>(run_sum.data());
      A* acc = static_cast<A*>(run_acc.data());
      for (size_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
      for (size_t i = 0; i < size_t(B) * Tl * C; i++) acc[i] = 0;
      for (int hop = 0; hop < S; hop++) {
        if (hop > 0) pass(0, kv_elems);  // send: k | v I hold to s+1; receive: s-1's
        ring_attend<T>(rd, s_me, (s_me - hop + S) % S, x, static_cast<const T*>(travel[cur].data()), m, l, acc);
      }
      ring_finish<T>(rd, m, l, acc, static_cast<T*>(out), static_cast<A*>(lse[u - 1].data()));
    });
  };
  // backward: k | v travel again, now with the dk | dv of their rank. Hop h: I add my queries' part
  // to rank s-h's dk | dv and pass both on; after the S-th hop one more send takes each rank's dk | dv
  // home, summed over the query ranks in ring order (s, s+1, ..., s-1), one rounding per hop.
  // Exact and simple: nothing is held for other ranks between hops.
  auto ring_backward = [&](int u, const void* qkv, const void* out, const void* dout, void* dqkv) {
    NZ_DISPATCH_DTYPE(dt, {
      using A = acc_t<T>;
      const T* x = static_cast<const T*>(qkv);
      T* kv = static_cast<T*>(travel[cur].data());
      for (size_t t = 0; t < size_t(B) * Tl; t++) memcpy(kv + t * 2 * C, x + t * 3 * C + C, 2 * C * e);
      for (size_t i = 0; i < kv_elems; i++) kv[kv_elems + i] = store<T>(A(0));
      A* D = static_cast<A*>(run_max.data());
      A* dq = static_cast<A*>(run_acc.data());
      A* dkv = static_cast<A*>(dkv_hop.data());
      ring_row_dots<T>(rd, static_cast<const T*>(dout), static_cast<const T*>(out), D);
      for (size_t i = 0; i < size_t(B) * Tl * C; i++) dq[i] = 0;
      for (int hop = 0; hop < S; hop++) {
        if (hop > 0) pass(0, 2 * kv_elems);  // k | v and dk | dv so far, to s+1
        T* held = static_cast<T*>(travel[cur].data());
        for (size_t i = 0; i < kv_elems; i++) dkv[i] = 0;
        ring_attend_backward<T>(rd, s_me, (s_me - hop + S) % S, x, held, static_cast<const T*>(dout),
                                static_cast<const A*>(lse[u - 1].data()), D, dq, dkv);
        for (size_t i = 0; i < kv_elems; i++) held[kv_elems + i] = store<T>(load(held[kv_elems + i]) + dkv[i]);
      }
      if (S > 1) pass(kv_elems, kv_elems);  // dk | dv home: I now hold my own tokens'
      const T* home = static_cast<const T*>(travel[cur].data()) + kv_elems;
      T* g = static_cast<T*>(dqkv);
      for (size_t t = 0; t < size_t(B) * Tl; t++) {
        for (int c = 0; c < C; c++) g[t * 3 * C + c] = store<T>(dq[t * C + c]);
        memcpy(g + t * 3 * C + C, home + t * 2 * C, 2 * C * e);
      }
    });
  };

  // ---- a block, forward and backward: per token, but attention between two all-to-alls ----
  auto block_forward = [&](int u, const void* p) {
    const GPT::AttentionBuffers a = model.attention_buffers(u);
    model.attention_input(u, p);              // ln1, q k v: my T/S tokens, all heads
    if (ring) {  // ring: my queries against every rank's keys, passed around (no all-to-all)
      ring_forward(u, a.qkv, a.out);
      model.attention_output(u, p);
      return;
    }
    tokens_to_heads(a.qkv, a.qkv_heads, 3);   // all-to-all: all T tokens, my NH/S heads
    model.attention(u, T);  // exact, per head, sequences of T tokens: causal in global positions
    heads_to_tokens(a.out_heads, a.out, 1);   // all-to-all: back to my tokens, all heads
    model.attention_output(u, p);             // the projection and the MLP: per token
  };
  auto block_backward = [&](int u, const void* p, void* g) {
    const GPT::AttentionBuffers a = model.attention_buffers(u);
    model.attention_output_backward(u, p, g);          // the MLP, the projection: d out, my tokens
    if (ring) {  // ring: keys and values around again, their gradients with them
      ring_backward(u, a.qkv, a.out, a.grad_out, a.grad_qkv);
      model.attention_input_backward(u, p, g);
      return;
    }
    tokens_to_heads(a.grad_out, a.grad_out_heads, 1);  // all-to-all: d out of all T, my heads
    model.attention_backward(u, T);  // the same sequences of T tokens: causal in global positions
    heads_to_tokens(a.grad_qkv_heads, a.grad_qkv, 3);  // all-to-all: d q k v back to my tokens
    model.attention_input_backward(u, p, g);           // qkv, ln1: my tokens' part of the gradient
  };
  auto is_block = [&](int u) { return u != EMBED && u != LNF; };

  // ---- model state: params (P_p), gradients and optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.shard_total * e, "params (my slices)");
  Buffer grads(Category::Grads, Location::Device, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  // my slice of unit u, packed in the sharded parameter and gradient buffers
  auto my_P = [&](int u) { return elem_ptr(params, L.units[u].shard_offset, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  AdamW adam(L, owned_shards(L, rank), dt, run.adamw);  // P_os: m, v for my slices only
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.shard(u, rank), my_P(u));  // P_p: only my slice is ever initialised
    adam.init_master(u, my_P(u));
  }

  // ---- gather and release: a unit's full parameters exist only while it is in use ----
  std::vector<Buffer> gathered(L.num_units());        // unit u's full params (ledger: gathered)
  std::vector<CommRequest> in_flight(L.num_units());  // unit u's all-gather, until waited for
  // all-gather, started: every rank's slice of unit u, into a fresh buffer of the unit's size
  auto gather_start = [&](int u) {
    const Unit& unit = L.units[u];
    gathered[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e,
                         "gathered " + unit.name);
    in_flight[u] = comm.all_gather_start(my_P(u), gathered[u].data(), owned(u), dt);
  };
  // unit u's full parameters: gathered now, or the prefetch already started is waited for
  auto gather_unit = [&](int u) -> const void* {
    if (gathered[u].empty()) gather_start(u);
    comm.wait(in_flight[u]);
    return gathered[u].data();
  };
  // prefetch: start the next unit's all-gather before this unit computes, so the two overlap
  auto prefetch = [&](int u) { if (run.args.prefetch) gather_start(u); };
  auto release_unit = [&](int u) { gathered[u].release(); };  // release: only my slice stays
  // The prefetch order: the unit a micro-step needs after unit u (FSDP2 records it in its first
  // forward; here it is written down). Forward: embed, blocks, lnf, then the embedding again for
  // the LM head. Backward: lnf down to block 0; the embedding's backward needs no parameters.
  auto prefetch_after_forward = [&](int u) { prefetch(u < LNF ? u + 1 : EMBED); };
  auto prefetch_after_backward = [&](int u) { if (u - 1 > EMBED) prefetch(u - 1); };
  run.unit_access = UnitAccess{gather_unit, release_unit};  // the model file: unit by unit
  // validation: the forward of my slice, the blocks between their all-to-alls
  run.hooks.forward_loss = [&] {
    for (int u = 0; u < L.num_units(); u++) {
      const void* p = gather_unit(u);
      if (is_block(u)) block_forward(u, p);
      else model.forward(u, p);
      release_unit(u);
    }
    model.head_forward(gather_unit(EMBED));
    release_unit(EMBED);
    return model.take_loss_sum();  // my tokens' losses: the Trainer sums the ranks'
  };
  // the memory table: stage3's model states (the layout padded for N), my slice's activations
  run.hooks.state_formula = [&](int) { return expected_state_bytes(Stage::Ulysses, L, dt); };
  run.hooks.activation_formula = [&](int) {
    return ring ? ring_activation_bytes(run.args.cfg, run.args.batch, T, S, dt)
                : ulysses_activation_bytes(run.args.cfg, run.args.batch, T, S, dt);
  };

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);  // my replica's sequences; the model keeps my slice of each
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) {
        const void* p = gather_unit(u);       // all-gather: unit u, just before it runs
        prefetch_after_forward(u);            // prefetch: the next unit (after lnf, the LM head's)
        if (is_block(u)) block_forward(u, p); // a block: attention between two all-to-alls
        else model.forward(u, p);
        release_unit(u);                      // release: unit u, until it is needed again
      }
      const void* wte = gather_unit(EMBED);   // all-gather: the embedding again, for the LM head
      prefetch(LNF);                          // prefetch: the first unit of the backward
      model.head_forward(wte);  // adds my tokens' summed loss to the step total, on the device
      run.phase("backward");
      model.head_backward(wte);  // d loss / d logits: my tokens' part of the batch's mean
      release_unit(EMBED);                    // release: the LM head is done with the embedding
      for (int u = L.num_units() - 1; u >= 0; u--) {
        // all-gather: unit u again for its backward; the embedding's backward needs no parameters
        const void* p = u == EMBED ? nullptr : gather_unit(u);
        prefetch_after_backward(u);           // prefetch: the next unit of the backward
        if (is_block(u)) block_backward(u, p, bucket.data());  // my tokens' part of the gradient
        else model.backward(u, p, bucket.data());
        release_unit(u);                      // release: unit u, until the next forward
        // reduce-scatter over all N ranks, every micro-step: the S slices' parts and the D
        // replicas' gradients summed in rank order; each rank receives the slice it owns
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);
      }
    }
    run.phase("optimizer");
    // global gradient norm: each rank sums its slices, then one rank-ordered sum of the partials
    double sq = sq_sum_of_shard(L, dt, grads.data());
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();  // fp16: the gradients are stored scaled
    const double loss_sum = model.take_loss_sum();  // my tokens' summed losses, all micro-steps
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());  // P_os: my slice only
      // no all-gather here: the next forward gathers each unit just before it needs it (P_p)
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
