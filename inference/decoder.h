// decoder.h — the GPT forward for one new position of B sequences, with a KV cache.
//
// GPT (model.h) runs every position of a window; generating byte t that way recomputes the keys
// and values of positions 0 .. t-1, which did not change. The decoder keeps them: per layer, a
// cache of K and V, each (B, ctx, C), and a decode step computes only the new row of every op,
// appending its K and V at position pos. The unit loop stays the caller's, as in the trainers, so
// the caller decides where each unit's weights come from (inference/generate.cpp).
//
// Same bits as the full recompute: every op but attention is row-wise, and the decode attention
// sums in the order of nz::ref::attention_forward's row pos. With the reference kernels
// (--kernels reference) a step's probabilities are therefore the full forward's to the bit
// (tests/inference/test_inference.cpp); with the fast ones the BLAS may sum a 1-row product in another order.
#pragma once
#include <vector>

#include "kernels/dtype.h"
#include "ledger.h"
#include "model.h"

namespace nz {

// Bytes of the KV cache: K and V (2) for every layer (L), sequence (B), position (T) and channel
// (C), in the storage type (e bytes).
inline size_t kv_cache_bytes(const GPTConfig& c, int B, DType dt) {
  return 2 * size_t(c.layers) * B * c.ctx * c.dim * dtype_bytes(dt);
}

class Decoder {
 public:
  Decoder(const Layout& layout, DType dt, int B);
  int batch() const { return B_; }

  // The next step: tokens (b, host) at position pos of every sequence (0 <= pos < ctx). Positions
  // 0 .. pos-1 must have been decoded before (their K and V are in the cache).
  void set_step(const int* tokens, int pos, int b);
  // Unit u for the step's rows, given the unit's parameters (anywhere on the device). A block
  // appends its K and V at pos, then attends over positions 0 .. pos.
  void forward(int u, const void* unit_params);
  // LM head (the tied wte) and softmax: the step's probabilities (b, V).
  void head_forward(const void* embed_params);
  // Row b's probabilities as fp32 on the host.
  void probs_row(int b, float* out_vocab) const;
  // The prefill: layer l's K and V at positions 0 .. T0-1 of the b sequences, from the q | k | v
  // (b, Tq, 3C) of a full forward over them (GPT::layer_qkv; Tq >= T0). The whole prompt in one
  // forward, whose row-wise ops give the same rows as one position per step.
  void fill_cache(int l, const void* qkv, int Tq, int T0, int b);

 private:
  template <class T> void forward_t(int u, const T* p);
  template <class T> void head_forward_t(const T* wte);

  const Layout& L_;
  DType dt_;
  int B_, b_ = 0, pos_ = 0;
  Buffer kv_;      // K then V of every layer: (L, 2, B, ctx, C) — ledger: kv_cache
  Buffer acts_;    // one step's activations, rows of B (ledger: activations)
  Buffer tokens_;  // (B) ints on the device
  Buffer zeros_;   // (B) zero targets for the softmax's loss, which generation does not use
};

// The two ops a decode step needs beyond kernels.h, on the CPU (decoder.cpp) and on CUDA
// (inference/kernels_decode.cu). Shapes: out/x (B,C); qkv (B,3C); cache rows (B, Tc, C).
namespace decode_cpu {
// out[b] = wte[tokens[b]] + wpe[pos]
template <class T>
void embedding_at(T* out, const int* tokens, const T* wte, const T* wpe, int pos, int B, int C);
// out[b] = softmax(q[b] . K[b, 0..pos] / sqrt(hs)) V[b, 0..pos], per head, in nz::ref's order
template <class T>
void attention_at(T* out, const T* qkv, const T* kcache, const T* vcache, int pos, int B, int Tc, int C, int NH);
}  // namespace decode_cpu
namespace decode_cuda {
template <class T>
void embedding_at(T* out, const int* tokens, const T* wte, const T* wpe, int pos, int B, int C);
template <class T>
void attention_at(T* out, const T* qkv, const T* kcache, const T* vcache, int pos, int B, int Tc, int C, int NH);
}  // namespace decode_cuda

}  // namespace nz
