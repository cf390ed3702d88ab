// test_inference.cpp — KV-cached decoding (inference/decoder.h) against the full forward (model.h).
//
// Truth: GPT::forward over the whole sequence at once, the model the trainers train. The decoder
// feeds the same sequence one position at a time, B sequences together; at every position its
// probabilities must be the full forward's row — to the bit with the reference kernels, whose sums
// run in an order that does not depend on the other rows (fp32 and bf16 alike), and within a
// stated bound with the fast ones (a BLAS may sum a 1-row product in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "inference/decoder.h"
#include "kernels/kernels.h"
#include "ledger.h"
#include "model.h"
#include "kernels/ops.h"
#include "inference/quant.h"
#include "runtime/rng.h"

using namespace nz;

namespace {

// The padded model of layout L in the storage type dt (the trainers' initialisation).
std::vector<char> init_params(const Layout& L, DType dt) {
  std::vector<float> f(L.padded_total, 0.0f);
  for (int u = 0; u < L.num_units(); u++) init_unit(L, u, 11, f.data() + L.units[u].offset);
  // larger weights than the N(0, 0.02) start, so attention is far from uniform and a wrong
  // position or a stale cache row would change the result
  for (float& x : f) x *= 8.0f;
  std::vector<char> p(f.size() * dtype_bytes(dt));
  if (dt == DType::BF16) cpu::cast<bf16, float>(reinterpret_cast<bf16*>(p.data()), f.data(), f.size());
  else memcpy(p.data(), f.data(), p.size());
  return p;
}

// Probabilities (B, T, V) of the full forward over tokens (B, T).
std::vector<float> full_probs(const Layout& L, DType dt, const char* p, const std::vector<int>& tokens, int B, int T) {
  const size_t e = dtype_bytes(dt);
  GPT m(L, dt, B, T);
  std::vector<int> targets(tokens.size(), 0);
  m.set_batch(tokens.data(), targets.data(), B);
  for (int u = 0; u < L.num_units(); u++) m.forward(u, p + L.units[u].offset * e);
  m.head_forward(p);
  const int V = L.cfg.vocab;
  std::vector<float> out(size_t(B) * T * V);
  for (int r = 0; r < B * T; r++) m.probs_row(r, out.data() + size_t(r) * V);
  return out;
}

// The same, one position per step with the KV cache.
std::vector<float> cached_probs(const Layout& L, DType dt, const char* p, const std::vector<int>& tokens, int B, int T) {
  const size_t e = dtype_bytes(dt);
  Decoder d(L, dt, B);
  const int V = L.cfg.vocab;
  std::vector<float> out(size_t(B) * T * V);
  std::vector<int> step(B);
  for (int s = 0; s < T; s++) {
    for (int b = 0; b < B; b++) step[b] = tokens[size_t(b) * T + s];
    d.set_step(step.data(), s, B);
    for (int u = 0; u < L.num_units(); u++) d.forward(u, p + L.units[u].offset * e);
    d.head_forward(p);
    for (int b = 0; b < B; b++) d.probs_row(b, out.data() + (size_t(b) * T + s) * V);
  }
  return out;
}

std::vector<int> random_tokens(int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = int(rng.next() % 256);
  return t;
}

}  // namespace

// Every position from the first byte to the full context, B = 1 and 3, fp32 and bf16.
TEST(Decoder, CacheGivesTheFullForwardsProbabilitiesToTheBitWithReferenceKernels) {
  set_kernels(Kernels::Reference);
  GPTConfig c{256, 24, 2, 32, 4};
  Layout L = make_layout(c, 1);
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::vector<char> p = init_params(L, dt);
    for (int B : {1, 3}) {
      const std::vector<int> tokens = random_tokens(B * c.ctx, 5 + B);
      const std::vector<float> want = full_probs(L, dt, p.data(), tokens, B, c.ctx);
      const std::vector<float> got = cached_probs(L, dt, p.data(), tokens, B, c.ctx);
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); i++) differ += memcmp(&want[i], &got[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << dtype_name(dt) << " B=" << B << ": probabilities that differ in some bit";
    }
  }
  set_kernels(Kernels::Fast);
}

// The prefill: positions 0 .. T0-1 in one full forward, their K and V copied into the cache, then
// one position per step: the same bits as the full forward at every later position.
TEST(Decoder, PrefillFromOneForwardThenStepsGivesTheSameBits) {
  set_kernels(Kernels::Reference);
  GPTConfig c{256, 24, 2, 32, 4};
  Layout L = make_layout(c, 1);
  const int B = 3, T0 = 10, V = c.vocab;
  for (DType dt : {DType::F32, DType::BF16}) {
    const size_t e = dtype_bytes(dt);
    const std::vector<char> p = init_params(L, dt);
    const std::vector<int> tokens = random_tokens(B * c.ctx, 13);
    const std::vector<float> want = full_probs(L, dt, p.data(), tokens, B, c.ctx);
    Decoder d(L, dt, B);
    {
      GPT pre(L, dt, B, T0);
      std::vector<int> toks, none(size_t(B) * T0, 0);
      for (int b = 0; b < B; b++) toks.insert(toks.end(), tokens.begin() + b * c.ctx, tokens.begin() + b * c.ctx + T0);
      pre.set_batch(toks.data(), none.data(), B);
      for (int u = 0; u < L.lnf_unit(); u++) {
        pre.forward(u, p.data() + L.units[u].offset * e);
        if (u > 0) d.fill_cache(u - 1, pre.layer_qkv(u - 1), T0, T0, B);
      }
    }
    std::vector<int> step(B);
    std::vector<float> got(V);
    size_t differ = 0;
    for (int s = T0; s < c.ctx; s++) {
      for (int b = 0; b < B; b++) step[b] = tokens[size_t(b) * c.ctx + s];
      d.set_step(step.data(), s, B);
      for (int u = 0; u < L.num_units(); u++) d.forward(u, p.data() + L.units[u].offset * e);
      d.head_forward(p.data());
      for (int b = 0; b < B; b++) {
        d.probs_row(b, got.data());
        differ += memcmp(got.data(), want.data() + (size_t(b) * c.ctx + s) * V, V * sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(differ, 0u) << dtype_name(dt) << ": rows that differ after the prefill";
  }
  set_kernels(Kernels::Fast);
}

// The fast kernels: the decode step's products have other shapes than the full forward's, and the
// BLAS may add their terms in another order. Each product then differs by at most its rounding
// bound, about K·u·Σ|terms| (u = 2^-24, K <= 4C terms); through 2 blocks and the softmax these stay
// far below 1e-4 in a probability at this width; the bound checked is 1e-4 absolute.
TEST(Decoder, CacheMatchesTheFullForwardWithinRoundingWithFastKernels) {
  set_kernels(Kernels::Fast);
  GPTConfig c{256, 24, 2, 32, 4};
  Layout L = make_layout(c, 1);
  const std::vector<char> p = init_params(L, DType::F32);
  const int B = 3;
  const std::vector<int> tokens = random_tokens(B * c.ctx, 9);
  const std::vector<float> want = full_probs(L, DType::F32, p.data(), tokens, B, c.ctx);
  const std::vector<float> got = cached_probs(L, DType::F32, p.data(), tokens, B, c.ctx);
  double worst = 0;
  for (size_t i = 0; i < want.size(); i++) worst = std::max(worst, double(std::fabs(want[i] - got[i])));
  EXPECT_LT(worst, 1e-4);
  printf("fast kernels: largest probability difference, cache vs full forward: %.3g\n", worst);
}

// A wrong cache must show: attending to one position too few (a decoder that forgot to append)
// changes the probabilities, so the bitwise test above can fail.
TEST(Decoder, AStaleCacheRowIsSeen) {
  set_kernels(Kernels::Reference);
  GPTConfig c{256, 8, 1, 16, 2};
  Layout L = make_layout(c, 1);
  const std::vector<char> p = init_params(L, DType::F32);
  const std::vector<int> tokens = random_tokens(c.ctx, 3);
  const std::vector<float> want = full_probs(L, DType::F32, p.data(), tokens, 1, c.ctx);
  // decode position 5 with positions 0..4 never fed: their cache rows are zeros
  Decoder d(L, DType::F32, 1);
  d.set_step(&tokens[5], 5, 1);
  for (int u = 0; u < L.num_units(); u++) d.forward(u, p.data() + L.units[u].offset * 4);
  d.head_forward(p.data());
  std::vector<float> got(c.vocab);
  d.probs_row(0, got.data());
  EXPECT_NE(memcmp(got.data(), want.data() + 5 * c.vocab, c.vocab * sizeof(float)), 0);
  set_kernels(Kernels::Fast);
}

// kv_cache: exactly 2·L·B·T·C·e bytes, counted in the ledger's own category on the device.
TEST(Decoder, KVCacheLedgerIsTwoLBTCe) {
  GPTConfig c;
  ASSERT_TRUE(preset_config("small", &c));
  Layout L = make_layout(c, 1);
  for (DType dt : {DType::F32, DType::BF16})
    for (int B : {1, 3, 8}) {
      Ledger::get().reset();
      {
        Decoder d(L, dt, B);
        const uint64_t want = 2ull * c.layers * B * c.ctx * c.dim * dtype_bytes(dt);
        EXPECT_EQ(Ledger::get().current(Category::KVCache, Location::Device), want);
        EXPECT_EQ(Ledger::get().current(Category::KVCache), want);  // and nowhere else
      }
      EXPECT_EQ(Ledger::get().current(Category::KVCache), 0u);
    }
}

// int8: every element within half its block's scale of the original, the block's largest |w| at
// ±127 exactly, blocks counted from the unit's first element (a unit of 200: blocks 64, 64, 64, 8).
TEST(Int8, DequantisedWithinHalfAScaleOfTheOriginal) {
  Rng rng(17);
  const size_t n = 200;
  std::vector<float> w(n);
  for (size_t i = 0; i < n; i++) w[i] = rng.normal() * (i < 64 ? 0.02f : i < 128 ? 3.0f : 1e-4f);
  for (size_t i = 128; i < 192; i++) w[i] = 0.0f;  // an all-zero block: scale 0, exact zeros
  std::vector<int8_t> q(n);
  std::vector<float> s((n + 63) / 64);
  quantize_int8(w.data(), n, q.data(), s.data());
  ASSERT_EQ(s.size(), 4u);
  std::vector<float> deq(n);
  dequantize_int8<float>(deq.data(), q.data(), s.data(), n);
  for (size_t b = 0; b < s.size(); b++) {
    float amax = 0;
    for (size_t i = b * 64; i < std::min(n, b * 64 + 64); i++) amax = std::max(amax, std::fabs(w[i]));
    EXPECT_EQ(s[b], amax / 127.0f) << "block " << b;
    bool has_127 = amax == 0;
    for (size_t i = b * 64; i < std::min(n, b * 64 + 64); i++) {
      // q·s rounds once in fp32: allow that one rounding (2^-24 relative) on top of s/2
      EXPECT_LE(std::fabs(w[i] - deq[i]), s[b] / 2 * (1 + 1e-6f) + std::fabs(w[i]) * 6e-8f) << "element " << i;
      has_127 |= std::abs(q[i]) == 127;
    }
    EXPECT_TRUE(has_127) << "block " << b << ": the largest weight must map to ±127";
  }
  EXPECT_EQ(int8_unit_bytes(n), 200u + 4 * 4);
  // a wrong block alignment (scales shifted by one block) breaks the bound: the check can fail
  std::vector<float> shifted(s.begin() + 1, s.end());
  shifted.push_back(s[0]);
  dequantize_int8<float>(deq.data(), q.data(), shifted.data(), n);
  size_t outside = 0;
  for (size_t i = 0; i < n; i++) outside += std::fabs(w[i] - deq[i]) > s[i / 64] / 2 * (1 + 1e-6f) + 1e-12f;
  EXPECT_GT(outside, 0u);
}

// The byte count of a model stored as int8: n + 4·ceil(n/64) per unit, 3.76x below fp32 for small.
TEST(Int8, ModelBytesDropByTheFormulasFactor) {
  GPTConfig c;
  ASSERT_TRUE(preset_config("small", &c));
  Layout L = make_layout(c, 1);
  size_t int8 = 0;
  for (const Unit& u : L.units) int8 += int8_unit_bytes(u.padded);
  const double factor = double(L.padded_total * 4) / double(int8);
  EXPECT_NEAR(factor, 4.0 / (1.0 + 4.0 / 64), 0.01);
}
