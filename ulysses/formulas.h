// formulas.h — what a rank of ulysses holds and sends: its activations, its all-to-alls.
//
// To the byte: the activations of a rank's slice of the sequence, and the elements of the
// all-to-alls that turn attention's tokens into heads and back.
#pragma once
#include <cstdint>

#include "kernels/dtype.h"
#include "layout.h"  // GPTConfig

namespace nz {

// ---- ulysses: S ranks split each sequence of T tokens (B sequences per micro-batch, width C, NH
// heads, L blocks, vocabulary V), each holding T/S tokens: every term of expected_activation_bytes
// (zero_formulas.h) with T/S tokens in place of T, except attention's probabilities, which keep all
// T tokens for NH/S heads: B (NH/S) T^2 e per block, 1/S of stage3's. Attention's input and output in
// the heads' layout (B, T, 3C/S) and (B, T, C/S) add r(3BTCe/S) + r(BTCe/S) per block, their
// gradients as much once, and the all-to-all's exchange buffer r(3BTCe/S) once. (r: rounded up to
// 64 bytes.) Every term falls as 1/S; the probabilities, T^2 per head, are the ones that grow
// fastest with T.
uint64_t ulysses_activation_bytes(const GPTConfig& cfg, int B, int T, int S, DType dt);
// Of those, the probabilities of one block: r(B (NH/S) T^2 e).
uint64_t ulysses_scores_bytes(const GPTConfig& cfg, int B, int T, int S, DType dt);

// ---- the all-to-alls, per block and micro-step, elements sent by each rank: forward q, k, v
// (3C/S of each of my T/S tokens to each of the S-1 others) and the output (C/S), backward their
// gradients the same: 8 B (T/S) C (S-1)/S. With N = S ranks and T growing with them (T/S fixed), a
// constant per rank and link: the point of Ulysses (ring attention sends K, V of T/S tokens around
// all S-1 steps instead: 2 B (T/S) C (S-1) per rank in the forward, growing with S).
uint64_t ulysses_all_to_all_elems_per_block(const GPTConfig& cfg, int B, int T, int S);
// A step of K micro-steps: every block's, K times (the evaluation's forwards not counted).
uint64_t ulysses_all_to_all_elems(const GPTConfig& cfg, int B, int T, int S, int accum);

// ---- ring attention (--sp-mode ring): my T/S tokens (two zig-zag chunks of T/(2S)) with every head.
// Every term of ulysses_activation_bytes but the heads' layout, the all-to-all's buffer and the
// probabilities (the ring materialises no scores beyond one row of a tile) plus, per block, the
// log-sum-exp r(B NH (T/S) f) the backward recomputes from, and once: the online softmax's running
// max and sum r(B NH (T/S) f) each, its output sums r(B (T/S) C f), a hop's dk|dv r(2 B (T/S) C f)
// and the two travelling buffers r(4 B (T/S) C e) each (f: 4 bytes, 8 in fp64). Every term falls as
// 1/S; none grows as T^2 (on the flash path Ulysses too keeps only the log-sum-exp: then both hold
// T/S tokens' worth, Ulysses' (B, T, 3C/S) heads' layout as many elements as my tokens' q, k, v).
uint64_t ring_activation_bytes(const GPTConfig& cfg, int B, int T, int S, DType dt);
// Elements each rank sends per block and micro-step (point to point): the forward passes k|v of
// B (T/S) tokens S-1 times, 2 B (T/S) C (S-1); the backward passes k|v with their dk|dv S-1 times
// and the dk|dv home once, 4 B (T/S) C (S-1) + 2 B (T/S) C (S > 1; none at S = 1).
uint64_t ring_p2p_elems_forward_per_block(const GPTConfig& cfg, int B, int T, int S);
uint64_t ring_p2p_elems_per_block(const GPTConfig& cfg, int B, int T, int S);

// ---- what fits: the head count's limit on S, and the longest sequence a device holds ----
// The largest S the trainer accepts on N ranks for sequences of T tokens: S divides NH (whole heads per
// rank), N (whole sequence groups) and T (equal slices); ring mode: S divides N and 2S divides T (the
// zig-zag's 2S chunks), whatever the heads.
int ulysses_largest_sp(const GPTConfig& cfg, int world, int T, bool ring);
// The activations with activation checkpointing, which this rung does not build (the recompute would
// repeat the all-to-alls): a formula, as stage3's expected_activation_bytes(..., true) is. The L blocks
// keep only their input, r(B (T/S) C e) each, and one block's internals are live at a time (its
// recompute); the ends, the gradients, the tokens and the buffers are as without. Derived from the
// formula above: one block's internals are what one more block adds, less its output.
uint64_t ulysses_checkpointed_activation_bytes(const GPTConfig& cfg, int B, int T, int S, DType dt, bool ring);
// The longest sequence T (a multiple of S; ring: of 2S) whose device peak per rank fits `budget` bytes:
// stage3's model states over N ranks (the model's wpe grown to ctx = T when T is longer: its positions are
// learned, one row each) plus the activations (with or without checkpointing), T at most max_T; 0 when
// not even the shortest fits. S = 1 without ring: stage3 alone, its own activations (zero_formulas.h).
struct SeqFit { int seq = 0; uint64_t state = 0, activations = 0; };
SeqFit ulysses_longest_seq(const GPTConfig& cfg, int world, int S, int B, DType dt, uint64_t budget,
                           bool checkpointing, bool ring, bool stage3_alone, int max_T);

}  // namespace nz
