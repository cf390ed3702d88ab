// exercise_quantizer_probe.cpp — the block quantizer (kernels/quantize.h) on blocks made to find
// its mistakes, for the exercise grader (scripts/exercises.py, zeropp_block_quantizer). The grader
// links it once with the real library and once with the learner's quantize.cpp, runs both, and
// compares every scale and code: the real quantizer is the truth, never stored numbers.
//
// The cases: exact .5 ties (x / scale = k + 1/2 in every storage type: ties go to the even integer),
// blocks of very different magnitudes in one call (one scale per block, not per call), a block whose
// largest magnitude is negative, zeros, values whose scale underflows or is subnormal (the clamp), the
// largest float (the scale stepped down), a NaN and an infinity (scale NaN, codes 0, counted), a tie
// that a multiplication by 1/scale misses, and longer random calls with a short last block.
// Output, per case: "case NAME bits B block K type T n N bad COUNT", then the lines "x", "scale" and
// "code": values as fp32 bit patterns in hex (NaN and -0 stay what they are), codes as integers.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quantize.h"

using namespace nz;

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static int code_at(const uint8_t* codes, int bits, size_t i) {
  if (bits == 8) return int8_t(codes[i]);
  const uint8_t nib = (i % 2 == 0) ? (codes[i / 2] & 0xF) : (codes[i / 2] >> 4);
  return int8_t(uint8_t(nib << 4)) >> 4;
}

template <class T>
static void one_case(const char* name, int bits, size_t block, const char* type, const std::vector<float>& v) {
  const BlockQuant q{bits, block};
  const size_t n = v.size();
  std::vector<T> x(n);
  for (size_t i = 0; i < n; i++) x[i] = store<T>(v[i]);  // the crafted cases are exact in T
  std::vector<uint8_t> codes(q.code_bytes(n), 0);
  std::vector<float> scales(q.blocks(n), -1.0f);
  const size_t bad = quantize_blocks(q, x.data(), n, codes.data(), scales.data());
  printf("case %s bits %d block %zu type %s n %zu bad %zu\nx", name, bits, block, type, n, bad);
  for (size_t i = 0; i < n; i++) printf(" %08x", bits_of(load(x[i])));
  printf("\nscale");
  for (float s : scales) printf(" %08x", bits_of(s));
  printf("\ncode");
  for (size_t i = 0; i < n; i++) printf(" %d", code_at(codes.data(), bits, i));
  printf("\n");
}

static void fp32_case(const char* name, int bits, size_t block, const std::vector<float>& v) {
  one_case<float>(name, bits, block, "fp32", v);
}

// Values a learner's data would have: normal, of a different magnitude in every block.
static std::vector<float> random_values(size_t n, size_t block, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed;
  auto uniform = [&] { s = s * 6364136223846793005ull + 1442695040888963407ull; return ((s >> 40) + 0.5) / 16777216.0; };
  for (size_t i = 0; i < n; i++) {
    const double mag = std::pow(10.0, -3.0 + 4.0 * double((i / block * 7919) % 13) / 12.0);
    const double g = std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
    v[i] = float(mag * g);
  }
  return v;
}

int main() {
  // x / scale = k + 1/2 exactly: int4 with absmax 7 (scale 1), then the same scaled by 2^-6
  std::vector<float> ties4 = {7, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.5f,
                              -7, 4.5f, 5.5f, 6.5f, -3.5f, -4.5f, -5.5f, -6.5f};
  for (int i = 0; i < 16; i++) ties4.push_back(ties4[i] * 0.015625f);
  fp32_case("ties", 4, 8, ties4);
  one_case<bf16>("ties", 4, 8, "bf16", ties4);
  one_case<f16>("ties", 4, 8, "fp16", ties4);
  // int8: absmax 127 (scale 1): halves up to 126.5, exact in bf16 (8 significant bits) and fp16
  std::vector<float> ties8 = {127, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 62.5f, -63.5f, 64.5f, 100.5f, -101.5f, 125.5f,
                              126.5f, -126.5f, 3.5f, 4.5f};
  one_case<bf16>("ties", 8, 16, "bf16", ties8);
  fp32_case("ties", 8, 16, ties8);
  // ties that x * (1 / scale) misses, 1 / scale being rounded: int4 with absmax 19 and 12 (x / scale =
  // 2.5 and 1.5 exactly; times the rounded reciprocal, 2.5000002 and 1.4999999), int8 with 128 (87.5)
  const float s19 = 19.0f / 7, s12 = 12.0f / 7, s128 = 128.0f / 127;
  fp32_case("ties_with_an_inexact_reciprocal", 4, 8, {19, 2.5f * s19, -2.5f * s19, 1, 0, 0, 0, 0,
                                                 12, 1.5f * s12, -1.5f * s12, 0, 0, 0, 0, 0});
  fp32_case("ties_with_an_inexact_reciprocal", 8, 8, {128, 87.5f * s128, -87.5f * s128, 1, 0, 0, 0, 0});
  // one scale per block: a small block beside large ones, in one call
  std::vector<float> mixed;
  const float mag[4] = {1e-3f, 10.0f, 0.1f, 0.0f};
  for (int b = 0; b < 4; b++)
    for (int i = 0; i < 8; i++) mixed.push_back(mag[b] * float((i * 37) % 11 - 5) / 5.0f);
  fp32_case("blocks_of_different_magnitudes", 8, 8, mixed);
  fp32_case("blocks_of_different_magnitudes", 4, 8, mixed);
  // the largest magnitude is a negative value
  fp32_case("largest_magnitude_negative", 4, 8, {-5, 1, 2, -1, 0.3f, 4.9f, -2.2f, 1.1f});
  // zeros; values whose scale underflows to 0; a subnormal scale rounded down, so that |x / scale|
  // exceeds qmax and only the clamp keeps the code in range (190 x the smallest float, scale 1 of it)
  const float tiny = std::nextafter(0.0f, 1.0f);
  fp32_case("zeros_and_subnormals", 8, 8, {0, 0, 0, 0, 0, 0, 0, 0, tiny, -tiny, 0, tiny, 0, 0, tiny, 0,
                                      190 * tiny, -190 * tiny, 3 * tiny, -77 * tiny, 0, 1 * tiny, 100 * tiny, 0});
  // the largest float: absmax / qmax rounds up, and qmax * scale would overflow
  fp32_case("largest_float", 8, 8, {FLT_MAX, -FLT_MAX / 3, 1, -1, 0, 2.5e38f, -3.4e38f, 1e30f});
  fp32_case("largest_float", 4, 8, {-FLT_MAX, FLT_MAX / 3, 1, -1, 0, 2.5e38f, -3.4e38f, 1e30f});
  // a NaN, an infinity: scale NaN, codes 0, the blocks counted; the block after them is normal
  fp32_case("not_finite", 4, 8, {1, 2, NAN, 3, -1, 0, 0.5f, 1, 1, INFINITY, 2, 3, 4, 5, 6, 7,
                            1, 2, 3, 4, 5, 6, 7, -7});
  // random calls: a short last block, and an odd count (int4's last nibble)
  const std::vector<float> r = random_values(1000, 64, 7);
  fp32_case("random", 8, 64, r);
  fp32_case("random", 4, 64, r);
  one_case<bf16>("random", 8, 64, "bf16", r);
  one_case<f16>("random", 4, 64, "fp16", r);
  fp32_case("random", 4, 16, random_values(77, 16, 11));
  return 0;
}
