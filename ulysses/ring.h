// ring.h — ring attention, ulysses' --sp-mode ring: keys and values go around the group.
//
// The comparison beside Ulysses' two all-to-alls (ulysses/train.cpp). The sequence of T tokens is
// cut into 2S chunks of c = T/(2S); rank s of a sequence group holds chunks s and 2S-1-s, its
// halves 0 and 1 (the zig-zag order: an early chunk, which sees few keys, with a late one, which
// sees many, so every rank has the same causal work). My queries stay; the keys and values of
// every rank's tokens travel around the ring (rank s sends to s+1 and receives from s-1), so in
// hop h I hold those of rank s-h. Attention runs per (query chunk, key chunk) tile, every head,
// with an online softmax: nothing of size T is ever held. Activations of T/S tokens with every
// head, no T^2 term; sends (6S-4) B (T/S) C elements per block and micro-step (formulas.h).
#pragma once
#include <vector>

#include "comm.h"
#include "input/cli.h"  // Args
#include "kernels/dtype.h"
#include "ledger.h"  // Buffer
#include "rung.h"    // Topology

namespace nz {

// The zig-zag order: my tokens are chunks s and 2S-1-s of 2S, with their positions (learned
// absolute positions: those chunks' rows of wpe). A sequence that does not cut into 2S equal
// chunks is one line.
void ring_zigzag(const Args& a, int s, Topology& t);

struct RingDims {
  int S, B, Tl, C, NH;  // ranks in the ring, sequences, my tokens (2 chunks), width, heads
};

// One per run: the ring's buffers (the running softmax, what travels) and its two passes.
class RingAttention {
 public:
  // group: my replica's S ranks (--sp), s my place among them; --batch sequences of T/S tokens
  RingAttention(Comm& group, const Args& a, int s, DType dt);
  // block unit u: out (B x Tl x C) = causal attention of my queries (qkv: B x Tl x 3C, q | k | v)
  // against the keys and values of the whole sequence, passed around the ring
  void forward(int u, const void* qkv, void* out);
  // and back: dqkv (B x Tl x 3C) from dout, keys and values around again with their gradients
  void backward(int u, const void* qkv, const void* out, const void* dout, void* dqkv);

 private:
  void pass(size_t offset, size_t elems);  // one hop: what I hold to s+1, s-1's to me

  Comm& group_;
  int s_;
  DType dt_;
  size_t e_;
  RingDims d_;
  size_t rows_, kv_elems_;  // B NH Tl softmax rows; B Tl 2C elements of k | v
  std::vector<Buffer> lse_;  // per block: every row's log-sum-exp, the backward's starting point
  // the forward's m, l, acc (the backward: D in m's, dq in acc's)
  Buffer run_max_, run_sum_, run_acc_;
  Buffer dkv_hop_;                      // the backward: a hop's dk | dv
  Buffer travel_[2];  // what travels: k | v of one rank's tokens, then (backward) their dk | dv
  int cur_ = 0;       // travel_[cur_] holds what I work on this hop
};

}  // namespace nz
