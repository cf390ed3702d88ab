// test_cpu_adam.cpp — the fast host AdamW (cpu_adam.h) is the reference AdamW (kernels_cpu.cpp)
// bit for bit: on sizes that are not multiples of the SIMD width, on unaligned pointers, with fp32
// and bf16 gradients, with and without weight decay and gradient scaling, on 1 to 3 threads; and
// the storage-type copy it writes for the device is the reference's rounding of the same values.
// A last test shows the comparison has teeth: one reassociated operation changes the bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu_adam.h"
#include "kernels/kernels.h"  // nz::cpu::adamw_update, the reference

using namespace nz;

namespace {

// Values over many magnitudes, with exact zeros, signs and subnormals: where rounding differences
// would show.
float awkward(std::mt19937& rng, float scale) {
  std::uniform_int_distribution<int> kind(0, 9), ex(-30, 4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  switch (kind(rng)) {
    case 0: return 0.0f;
    case 1: return u(rng) * 1e-40f;  // subnormal
    case 2: return std::ldexp(u(rng), ex(rng));
    default: return u(rng) * scale;
  }
}

struct State {
  std::vector<float> p, m, v;
};

State random_state(size_t n, std::mt19937& rng) {
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; i++) {
    s.p[i] = awkward(rng, 0.1f);
    s.m[i] = awkward(rng, 1e-3f);
    s.v[i] = std::fabs(awkward(rng, 1e-6f));  // a second moment is never negative
  }
  return s;
}

template <class T>
std::vector<T> random_grads(size_t n, std::mt19937& rng) {
  std::vector<T> g(n);
  for (size_t i = 0; i < n; i++) g[i] = store<T>(awkward(rng, 1e-2f));
  return g;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return bytes == 0 || memcmp(a, b, bytes) == 0; }

template <class T>
void check_bitwise_equal() {
  std::mt19937 rng(1234);
  const size_t sizes[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1023, 65536 + 13, 200003};
  struct Hyper { float lr, wd, gs; int t; };
  const Hyper hypers[] = {{1e-3f, 0.0f, 1.0f, 1}, {3e-3f, 0.1f, 1.0f, 2}, {1e-3f, 0.0f, 0.37f, 7},
                          {6e-4f, 0.1f, 0.2934f, 1000}};
  int cases = 0;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (size_t n : sizes) {
      for (const Hyper& h : hypers) {
        for (size_t offset : {0, 1}) {  // offset 1: pointers off the vector alignment
          State ref = random_state(n + offset, rng);
          std::vector<T> g = random_grads<T>(n + offset, rng);
          State fast = ref, fused = ref;
          std::vector<T> p_out(n + offset), g_alias = g;
          cpu::adamw_update<T>(ref.p.data() + offset, ref.m.data() + offset, ref.v.data() + offset,
                               g.data() + offset, n, h.lr, 0.9f, 0.95f, 1e-8f, h.wd, h.gs, h.t);
          cpu_adam::adamw_update<T>(fast.p.data() + offset, fast.m.data() + offset, fast.v.data() + offset,
                                    g.data() + offset, n, h.lr, 0.9f, 0.95f, 1e-8f, h.wd, h.gs, h.t);
          // fused: the parameters also written in the storage type, over the gradients (as offload does)
          cpu_adam::adamw_update<T>(fused.p.data() + offset, fused.m.data() + offset, fused.v.data() + offset,
                                    g_alias.data() + offset, n, h.lr, 0.9f, 0.95f, 1e-8f, h.wd, h.gs, h.t,
                                    g_alias.data() + offset);
          std::vector<T> p_ref_t(n);
          for (size_t i = 0; i < n; i++) p_ref_t[i] = store<T>(ref.p[offset + i]);
          const size_t fb = (n + offset) * sizeof(float);
          SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << offset << " threads=" << threads
                                            << " wd=" << h.wd << " gs=" << h.gs << " t=" << h.t);
          ASSERT_TRUE(same_bits(ref.p.data(), fast.p.data(), fb));
          ASSERT_TRUE(same_bits(ref.m.data(), fast.m.data(), fb));
          ASSERT_TRUE(same_bits(ref.v.data(), fast.v.data(), fb));
          ASSERT_TRUE(same_bits(ref.p.data(), fused.p.data(), fb));
          ASSERT_TRUE(same_bits(ref.m.data(), fused.m.data(), fb));
          ASSERT_TRUE(same_bits(ref.v.data(), fused.v.data(), fb));
          ASSERT_TRUE(same_bits(p_ref_t.data(), g_alias.data() + offset, n * sizeof(T)));
          if (offset) {
            ASSERT_TRUE(same_bits(&g_alias[0], &g[0], sizeof(T))) << "wrote outside [0, n)";
          }
          cases++;
        }
      }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
  printf("%d cases bitwise equal (%d SIMD lanes)\n", cases, cpu_adam::lanes());
}

}  // namespace

TEST(CpuAdam, Fp32GradsBitwiseEqualToReference) { check_bitwise_equal<float>(); }
TEST(CpuAdam, Bf16GradsBitwiseEqualToReference) { check_bitwise_equal<bf16>(); }
TEST(CpuAdam, Fp16GradsBitwiseEqualToReference) { check_bitwise_equal<nz::f16>(); }

// The check above can fail: the same update with the bias correction applied as a multiplication
// by its reciprocal (a classic "optimization") differs from the reference in some elements.
TEST(CpuAdam, OneReassociatedOperationChangesTheBits) {
  std::mt19937 rng(99);
  const size_t n = 10000;
  State ref = random_state(n, rng), other = ref;
  std::vector<float> g = random_grads<float>(n, rng);
  const int t = 3;
  cpu::adamw_update<float>(ref.p.data(), ref.m.data(), ref.v.data(), g.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                           1.0f, t);
  const float inv_bc1 = 1.0f / (1.0f - powf(0.9f, float(t))), bc2 = 1.0f - powf(0.95f, float(t));
  for (size_t i = 0; i < n; i++) {
    const float gi = g[i];
    const float mi = 0.9f * other.m[i] + (1.0f - 0.9f) * gi;
    const float vi = 0.95f * other.v[i] + (1.0f - 0.95f) * gi * gi;
    const float mhat = mi * inv_bc1, vhat = vi / bc2;  // * (1 / bc1) instead of / bc1
    other.p[i] = other.p[i] - 1e-3f * (mhat / (std::sqrt(vhat) + 1e-8f) + 0.1f * other.p[i]);
  }
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) differ += memcmp(&ref.p[i], &other.p[i], 4) != 0;
  printf("%zu of %zu parameters differ\n", differ, n);
  EXPECT_GT(differ, 0u);
}
