// test_quantize.cpp — the block quantizer (common/kernels/quantize.h) against its rule written out
// here, on the cases where a quantizer goes wrong: ties, all zeros, one huge value among small
// ones, the largest float, subnormals, NaN and infinity, int4's nibbles, blocks counted from the
// start with a shorter last one, bf16 and fp16 inputs; and inference's int8 (inference/quant.h) is
// the same rule with blocks of 64.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "inference/quant.h"
#include "kernels/quantize.h"

using namespace nz;

namespace {

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  size_t bad = 0;
};

template <class T>
Quantized quantize(const BlockQuant& q, const std::vector<T>& x) {
  Quantized r;
  r.codes.assign(q.code_bytes(x.size()), 0);
  r.scales.assign(q.blocks(x.size()), -1.0f);
  r.bad = quantize_blocks(q, x.data(), x.size(), r.codes.data(), r.scales.data());
  return r;
}

std::vector<float> dequantize(const BlockQuant& q, const Quantized& z, size_t n) {
  std::vector<float> out(n, -1.0f);
  dequantize_blocks(q, z.codes.data(), z.scales.data(), n, out.data());
  return out;
}

// The code of value i, read back the way quantize.h says they are laid out.
int code(const BlockQuant& q, const Quantized& z, size_t i) {
  if (q.bits == 8) return int8_t(z.codes[i]);
  int nib = i % 2 == 0 ? z.codes[i / 2] & 0xF : z.codes[i / 2] >> 4;
  return nib >= 8 ? nib - 16 : nib;
}

// The rule of quantize.h, written out again: the scale of a block is absmax / qmax in fp32 (one
// ulp lower if qmax * scale overflows); a code is round-half-even(x / scale) clamped to +-qmax.
float formula_scale(const std::vector<float>& block, int qmax) {
  float absmax = 0;
  for (float v : block) absmax = std::max(absmax, std::fabs(v));
  float s = absmax / float(qmax);
  if (std::isinf(float(qmax) * s)) s = std::nextafter(s, 0.0f);
  return s;
}
int formula_code(float x, float scale, int qmax) {
  if (scale == 0) return 0;
  double r = double(x / scale);  // one fp32 division
  double fl = std::floor(r), frac = r - fl;
  double q = frac > 0.5 ? fl + 1 : frac < 0.5 ? fl : (std::fmod(fl, 2.0) == 0 ? fl : fl + 1);  // ties to even
  return int(std::max(-double(qmax), std::min(double(qmax), q)));
}

}  // namespace

TEST(Quantize, TiesRoundToEvenAndTheScaleIsAbsmaxOverQmax) {
  const BlockQuant q8{8, 8};
  // absmax 127: scale exactly 1, so x / scale is x and the rounding is seen directly
  const std::vector<float> x = {127, 2.5f, 3.5f, -2.5f, 126.5f, 0.49f, -0.5f, -127};
  Quantized z = quantize(q8, x);
  ASSERT_EQ(z.bad, 0u);
  EXPECT_EQ(z.scales[0], 1.0f);
  const int want[] = {127, 2, 4, -2, 126, 0, 0, -127};
  for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(code(q8, z, i), want[i]) << "x = " << x[i];
  const std::vector<float> d = dequantize(q8, z, x.size());
  for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(d[i], float(want[i]));
  // int4: absmax 7, scale 1; codes packed two to a byte, low nibble first
  const BlockQuant q4{4, 8};
  const std::vector<float> y = {7, 0.5f, 1.5f, -6.5f, -7, 2.5f, -1, 3};
  Quantized z4 = quantize(q4, y);
  EXPECT_EQ(z4.scales[0], 1.0f);
  const int want4[] = {7, 0, 2, -6, -7, 2, -1, 3};
  for (size_t i = 0; i < y.size(); i++) EXPECT_EQ(code(q4, z4, i), want4[i]) << "y = " << y[i];
  ASSERT_EQ(z4.codes.size(), 4u);
  EXPECT_EQ(z4.codes[0], 0x07);  // 7 low, 0 high
  EXPECT_EQ(z4.codes[1], 0xA2);  // 2 low, -6 = 0xA high
  EXPECT_EQ(z4.codes[2], 0x29);  // -7 = 0x9 low, 2 high
  EXPECT_EQ(z4.codes[3], 0x3F);  // -1 = 0xF low, 3 high
  const std::vector<float> d4 = dequantize(q4, z4, y.size());
  for (size_t i = 0; i < y.size(); i++) EXPECT_EQ(d4[i], float(want4[i]));
}

TEST(Quantize, AllZerosGiveScaleZeroAndZeros) {
  for (int bits : {8, 4}) {
    const BlockQuant q{bits, 16};
    std::vector<float> x(32, 0.0f);
    x[3] = -0.0f;
    Quantized z = quantize(q, x);
    EXPECT_EQ(z.bad, 0u);
    for (float s : z.scales) EXPECT_EQ(s, 0.0f);
    for (uint8_t c : z.codes) EXPECT_EQ(c, 0);
    for (float v : dequantize(q, z, x.size())) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Quantize, OneHugeValueFlushesTheSmallOnesOfItsBlockOnly) {
  const BlockQuant q{8, 4};
  const std::vector<float> x = {1e30f, 1.0f, -3.0f, 2e27f, /* next block */ 1.0f, -3.0f, 0.25f, 2.0f};
  Quantized z = quantize(q, x);
  EXPECT_EQ(z.scales[0], 1e30f / 127.0f);
  EXPECT_EQ(code(q, z, 0), 127);
  EXPECT_EQ(code(q, z, 1), 0);
  EXPECT_EQ(code(q, z, 2), 0);
  EXPECT_EQ(code(q, z, 3), formula_code(2e27f, z.scales[0], 127));
  EXPECT_EQ(z.scales[1], 3.0f / 127.0f);  // the next block has its own scale
  const std::vector<float> d = dequantize(q, z, x.size());
  for (size_t i = 0; i < x.size(); i++)
    EXPECT_LE(std::fabs(d[i] - x[i]), z.scales[i / 4] / 2 * (1 + 1e-6)) << i;  // at most half a step off
}

TEST(Quantize, TheLargestFloatStaysFinite) {
  // FLT_MAX / 127 * 127 rounds up to infinity: the rule steps the scale one ulp down.
  ASSERT_TRUE(std::isinf(127.0f * (FLT_MAX / 127.0f))) << "the case this test is about";
  for (int bits : {8, 4}) {
    const BlockQuant q{bits, 4};
    const int qmax = q.qmax();
    const std::vector<float> x = {FLT_MAX, -FLT_MAX, 1.0f, FLT_MAX / 2};
    Quantized z = quantize(q, x);
    EXPECT_EQ(z.bad, 0u);
    EXPECT_EQ(z.scales[0], formula_scale(x, qmax));
    EXPECT_FALSE(std::isinf(float(qmax) * z.scales[0]));
    EXPECT_EQ(code(q, z, 0), qmax);
    EXPECT_EQ(code(q, z, 1), -qmax);
    const std::vector<float> d = dequantize(q, z, x.size());
    for (float v : d) EXPECT_TRUE(std::isfinite(v)) << bits << " bits";
    EXPECT_EQ(d[0], float(qmax) * z.scales[0]);
  }
}

TEST(Quantize, Subnormals) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const BlockQuant q{8, 2};
  // 178 tiny / 127 = 1.40 tiny rounds to 1 tiny: 178 / 1 is clamped to 127.
  // 2 tiny / 127 underflows to 0: the block is flushed to zeros.
  // 2^-126 (the smallest normal) / 127 is subnormal: codes as usual.
  const float normal_min = FLT_MIN;
  const std::vector<float> x = {178 * tiny, -50 * tiny, 2 * tiny, -tiny, normal_min, -normal_min / 3};
  Quantized z = quantize(q, x);
  EXPECT_EQ(z.scales[0], tiny);
  EXPECT_EQ(code(q, z, 0), 127);
  EXPECT_EQ(code(q, z, 1), -50);
  EXPECT_EQ(z.scales[1], 0.0f);
  EXPECT_EQ(code(q, z, 2), 0);
  EXPECT_EQ(code(q, z, 3), 0);
  EXPECT_EQ(z.scales[2], normal_min / 127.0f);
  EXPECT_EQ(code(q, z, 4), 127);
  EXPECT_EQ(code(q, z, 5), formula_code(-normal_min / 3, z.scales[2], 127));
  const std::vector<float> d = dequantize(q, z, x.size());
  EXPECT_EQ(d[0], 127 * tiny);
  EXPECT_EQ(d[2], 0.0f);
}

TEST(Quantize, NanAndInfinityMakeTheirBlockNanAndAreCounted) {
  for (float badv : {NAN, INFINITY, -INFINITY}) {
    const BlockQuant q{4, 4};
    const std::vector<float> x = {1, 2, 3, 4, 5, badv, 7, 8, -1, 0, 0, 1};
    Quantized z = quantize(q, x);
    EXPECT_EQ(z.bad, 1u);
    EXPECT_TRUE(std::isnan(z.scales[1]));
    EXPECT_EQ(z.scales[0], 4.0f / 7);
    EXPECT_EQ(z.scales[2], 1.0f / 7);
    for (size_t i = 4; i < 8; i++) EXPECT_EQ(code(q, z, i), 0);
    const std::vector<float> d = dequantize(q, z, x.size());
    for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(std::isnan(d[i]), i >= 4 && i < 8) << i;
  }
}

// Many random blocks, a shorter last one, each storage type: every code and scale = the formula,
// and quantizing from any block boundary gives the same codes (blocks count from the start).
template <class T>
void check_random(int bits, size_t block, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> x(n);
  std::vector<float> xf(n);
  for (size_t i = 0; i < n; i++) {
    x[i] = store<T>(nd(rng) * (i % 97 == 0 ? 50.0f : 1.0f));
    xf[i] = load(x[i]);
  }
  const BlockQuant q{bits, block};
  Quantized z = quantize(q, x);
  ASSERT_EQ(z.bad, 0u);
  ASSERT_EQ(z.scales.size(), (n + block - 1) / block);
  std::vector<float> d(n);
  dequantize_blocks(q, z.codes.data(), z.scales.data(), n, d.data());
  for (size_t b = 0; b < z.scales.size(); b++) {
    std::vector<float> blk(xf.begin() + b * block, xf.begin() + std::min(n, (b + 1) * block));
    const float s = formula_scale(blk, q.qmax());
    ASSERT_EQ(z.scales[b], s) << "block " << b;
    for (size_t i = b * block; i < std::min(n, (b + 1) * block); i++) {
      const int c = formula_code(xf[i], s, q.qmax());
      ASSERT_EQ(code(q, z, i), c) << "value " << i;
      ASSERT_EQ(d[i], float(c) * s);
      ASSERT_LE(std::fabs(d[i] - xf[i]), s / 2 * (1 + 1e-6));
    }
  }
  // a slice starting on a block boundary (ZeRO++'s slices): the same codes and scales as the whole
  const size_t from = block * 3;
  std::vector<uint8_t> packed(q.packed_bytes(n - from));
  ASSERT_EQ(quantize_packed(q, x.data() + from, n - from, packed.data()), 0u);
  ASSERT_EQ(memcmp(packed.data(), z.codes.data() + q.code_bytes(from), q.code_bytes(n - from)), 0);
  ASSERT_EQ(memcmp(packed.data() + q.code_bytes(n - from), z.scales.data() + 3, 4 * q.blocks(n - from)), 0);
  std::vector<T> back(n - from);
  dequantize_packed(q, packed.data(), n - from, back.data());
  for (size_t i = 0; i < n - from; i++) ASSERT_EQ(load(back[i]), load(store<T>(d[from + i])));
}

TEST(Quantize, RandomBlocksEqualTheFormulaInEveryStorageType) {
  for (int bits : {8, 4}) {
    check_random<float>(bits, 64, 64 * 20 + 10, 1);
    check_random<bf16>(bits, 32, 32 * 9 + 4, 2);
    check_random<f16>(bits, 256, 256 * 3 + 100, 3);
    check_random<float>(bits, 8, 1 << 17, 4);  // large enough for the threaded loop
  }
  EXPECT_EQ((BlockQuant{8, 256}.packed_bytes(1024)), 1024u + 16);
  EXPECT_EQ((BlockQuant{4, 256}.packed_bytes(1024)), 512u + 16);
}

TEST(Quantize, InferenceInt8IsTheSameRuleWithBlocksOf64) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const size_t n = 64 * 10 + 17;
  std::vector<float> w(n);
  for (float& v : w) v = nd(rng);
  std::vector<int8_t> qi(n);
  std::vector<float> si((n + 63) / 64);
  quantize_int8(w.data(), n, qi.data(), si.data());
  const BlockQuant q{8, size_t(kQuantBlock)};
  Quantized z = quantize(q, w);
  EXPECT_EQ(memcmp(qi.data(), z.codes.data(), n), 0);
  EXPECT_EQ(memcmp(si.data(), z.scales.data(), 4 * si.size()), 0);
}

TEST(Quantize, BlockSizesArePowersOfTwoFrom8) {
  for (long b : {8L, 16L, 256L, 65536L}) EXPECT_TRUE(valid_quant_block(b)) << b;
  for (long b : {0L, 1L, 2L, 4L, 12L, 100L, 131072L, -8L}) EXPECT_FALSE(valid_quant_block(b)) << b;
}
