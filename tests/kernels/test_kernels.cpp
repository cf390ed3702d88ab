// test_kernels.cpp — the CPU reference kernels (common/kernels/kernels_cpu.cpp) against the math.
//
//  - KernelGrad:        every backward against central finite differences, in double precision
//  - KernelForward:     forward properties a gradient check cannot see (causal mask, known values,
//                       the float kernels' own exp against the double ones' std::exp)
//  - KernelConventions: weight grads accumulate (+=), input grads are overwritten (=), null = none
//  - AdamW:             one and two steps against the formula, decoupled decay, grad_scale
//  - Bf16:              round to nearest even bit patterns; bf16 kernels = fp32 kernels rounded once
//  - Fused:             the fused ops give the bits of the unfused ops they replace in the model
//  - Determinism:       bitwise identical results with 1, 2 and 3 OpenMP threads; the tiled
//                       matmul gives the textbook loop's bits
#include <gtest/gtest.h>  // TEST, EXPECT_*
#include <omp.h>          // omp_set_num_threads, omp_get_max_threads

#include <cmath>       // std::fabs, std::isnan, std::sqrt, std::log
#include <cstdint>     // uint16_t, uint32_t, uint64_t
#include <cstdio>      // printf
#include <cstring>     // std::memcpy, std::memcmp
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <vector>

// The hardware's fp32 <-> fp16, where there is some: the Fp16 tests' second reference.
#if defined(__F16C__)
#include <immintrin.h>  // _cvtss_sh, _cvtsh_ss (x86 F16C)
#define HARDWARE_FP16 1
static float hardware_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static uint16_t hardware_f32_to_f16(float x) { return uint16_t(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }
#elif defined(__aarch64__)  // FCVT, through GCC's __fp16 (IEEE binary16 on 64-bit ARM)
#define HARDWARE_FP16 1
static float hardware_f16_to_f32(uint16_t h) {
  __fp16 x;
  std::memcpy(&x, &h, 2);
  return float(x);
}
static uint16_t hardware_f32_to_f16(float x) {
  const __fp16 h = __fp16(x);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
#endif

#include "kernels/dtype.h"      // bf16, f32_to_bf16, bf16_to_f32, f16, f32_to_f16, f16_to_f32, acc_t
#include "kernels/gemm_bf16.h"  // bf16_gemm: bf16 products on the CPU's bf16 instructions
#include "kernels/kernels.h"  // nz::cpu::*

namespace {

using nz::bf16;
namespace cpu = nz::cpu;

// ---------------------------------------------------------------------------------------------
// helpers

// Small deterministic generator (splitmix64): the same numbers on every platform and library.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1.0p-53; }
  int below(int n) { return int(next() % uint64_t(n)); }
};

std::vector<double> random_vec(Rng& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<double> v(n);
  for (double& x : v) x = rng.uniform(lo, hi);
  return v;
}

std::vector<int> random_tokens(Rng& rng, size_t n, int V) {
  std::vector<int> t(n);
  for (int& x : t) x = rng.below(V);
  return t;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// Finite-difference check, in double. With step h the central difference has a truncation error
// ~h^2 |f'''| / 6 and a rounding error ~eps |L| / h (eps = 1.1e-16). h = 3e-5 balances the two for
// these shapes: over 40 random seeds the worst element of any kernel agreed to 1.3e-7 (softmax_xent,
// rounding-limited; at h = 1e-5 it reached 6.5e-7), so kFdTol = 1e-6 leaves a margin of ~8x, while
// a wrong gradient (a missing term, a factor off by 1%) misses by orders of magnitude.
// Each element is judged relative to itself, except that elements far below the tensor's largest
// gradient are judged relative to 1e-3 of that largest one: the central difference has an
// absolute error floor that would otherwise dominate a gradient of, say, 1e-9.
constexpr double kFdStep = 3e-5;
constexpr double kFdTol = 1e-6;

struct FdResult {
  double max_rel_err = 0.0;  // the worst element's relative error
  size_t worst = 0;          // its index
  double analytic = 0.0, numeric = 0.0;
};

// Compares analytic = dL/dx with central differences of loss(), perturbing x in place (loss() must
// read x). x is restored exactly.
FdResult fd_compare(std::vector<double>& x, const std::vector<double>& analytic,
                    const std::function<double()>& loss) {
  std::vector<double> numeric(x.size());
  double max_numeric = 0.0;
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    const double xp = x0 + kFdStep, xm = x0 - kFdStep;
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    numeric[i] = (lp - lm) / (xp - xm);  // the step actually taken, not the nominal 2h
    max_numeric = std::max(max_numeric, std::fabs(numeric[i]));
  }
  const double floor = std::max(1e-3 * max_numeric, 1e-300);
  FdResult r;
  for (size_t i = 0; i < x.size(); i++) {
    const double scale = std::max({std::fabs(analytic[i]), std::fabs(numeric[i]), floor});
    const double err = std::fabs(analytic[i] - numeric[i]) / scale;
    if (err > r.max_rel_err || i == 0) r = FdResult{err, i, analytic[i], numeric[i]};
  }
  return r;
}

// The assertion every gradient test makes; prints the worst error so regressions are visible.
void expect_grad(const char* what, std::vector<double>& x, const std::vector<double>& analytic,
                 const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const FdResult r = fd_compare(x, analytic, loss);
  printf("[   fd     ] %-26s max rel err %.2e  (%zu elements)\n", what, r.max_rel_err, x.size());
  EXPECT_LT(r.max_rel_err, kFdTol) << what << ": element " << r.worst << " analytic " << r.analytic
                                   << " vs finite difference " << r.numeric;
}

// Runs fn with exactly n OpenMP threads, then restores the previous setting.
void with_threads(int n, const std::function<void()>& fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(before);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

uint16_t bf16_bits_of(uint32_t f32_bits) {
  float f;
  std::memcpy(&f, &f32_bits, 4);
  return nz::f32_to_bf16(f).bits;
}

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = nz::f32_to_bf16(x[i]);
  return y;
}

std::vector<float> to_f32(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = nz::bf16_to_f32(x[i]);
  return y;
}

std::vector<float> random_f32(Rng& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.uniform(lo, hi));
  return v;
}

// Small, awkward shapes: nothing a multiple of anything, so every tail path is exercised.
constexpr int B = 2, Tn = 5, C = 12, NH = 3, OC = 7, V = 11;
constexpr int N = B * Tn;

// ---------------------------------------------------------------------------------------------
// KernelGrad: backward against finite differences, L = sum(out * R) for a fixed random R

TEST(KernelGrad, Embedding) {
  Rng rng(1);
  std::vector<int> tokens = random_tokens(rng, N, V);
  tokens[7] = tokens[2];  // a repeated token: its row of dwte must collect both contributions
  std::vector<double> wte = random_vec(rng, size_t(V) * C), wpe = random_vec(rng, size_t(Tn) * C);
  const std::vector<double> R = random_vec(rng, size_t(N) * C);
  std::vector<double> out(size_t(N) * C);
  auto loss = [&] {
    cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C);
    return dot(out, R);
  };
  std::vector<double> dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  cpu::embedding_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, Tn, C);
  expect_grad("embedding dwte", wte, dwte, loss);
  expect_grad("embedding dwpe", wpe, dwpe, loss);
}

TEST(KernelGrad, LayerNorm) {
  Rng rng(2);
  // rows with different offsets and spreads, so mean and rstd matter
  std::vector<double> inp(size_t(N) * C);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) inp[size_t(n) * C + c] = 0.3 * n - 1.0 + (0.5 + 0.2 * n) * rng.uniform(-1, 1);
  std::vector<double> w = random_vec(rng, C, 0.5, 1.5), b = random_vec(rng, C);
  const std::vector<double> R = random_vec(rng, size_t(N) * C);
  std::vector<double> out(size_t(N) * C), mean(N), rstd(N);
  auto loss = [&] {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();  // saves mean and rstd for the backward
  std::vector<double> dinp(inp.size(), 123.0), dw(C, 0.0), db(C, 0.0);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  expect_grad("layernorm dinp", inp, dinp, loss);
  expect_grad("layernorm dw", w, dw, loss);
  expect_grad("layernorm db", b, db, loss);
}

TEST(KernelGrad, Matmul) {
  Rng rng(3);
  std::vector<double> inp = random_vec(rng, size_t(N) * C), w = random_vec(rng, size_t(OC) * C);
  std::vector<double> bias = random_vec(rng, OC);
  const std::vector<double> R = random_vec(rng, size_t(N) * OC);
  std::vector<double> out(size_t(N) * OC);
  auto loss = [&] {
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    return dot(out, R);
  };
  std::vector<double> dinp(inp.size(), 123.0), dw(w.size(), 0.0), dbias(OC, 0.0);
  cpu::matmul_backward(dinp.data(), dw.data(), dbias.data(), R.data(), inp.data(), w.data(), N, C, OC);
  expect_grad("matmul dinp", inp, dinp, loss);
  expect_grad("matmul dw", w, dw, loss);
  expect_grad("matmul dbias", bias, dbias, loss);
}

TEST(KernelGrad, Attention) {
  Rng rng(4);
  // scores of a few units, so the softmax is far from uniform
  std::vector<double> qkv = random_vec(rng, size_t(N) * 3 * C, -1.5, 1.5);
  const std::vector<double> R = random_vec(rng, size_t(N) * C);
  std::vector<double> out(size_t(N) * C), att(size_t(B) * NH * Tn * Tn);
  auto loss = [&] {
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH);
    return dot(out, R);
  };
  loss();  // saves att
  std::vector<double> dqkv(qkv.size(), 123.0);
  cpu::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), out.data(), B, Tn, C, NH);
  expect_grad("attention dqkv", qkv, dqkv, loss);
}

TEST(KernelGrad, Gelu) {
  Rng rng(5);
  const size_t n = 37;
  std::vector<double> inp = random_vec(rng, n, -4.0, 4.0);
  const std::vector<double> R = random_vec(rng, n);
  std::vector<double> out(n);
  auto loss = [&] {
    cpu::gelu_forward(out.data(), inp.data(), n);
    return dot(out, R);
  };
  std::vector<double> dinp(n, 123.0);
  cpu::gelu_backward(dinp.data(), inp.data(), R.data(), n);
  expect_grad("gelu dinp", inp, dinp, loss);
}

TEST(KernelGrad, Residual) {
  // The residual has no backward kernel: its gradient is dout, unchanged, to both branches.
  Rng rng(6);
  const size_t n = 29;
  std::vector<double> a = random_vec(rng, n), b = random_vec(rng, n);
  const std::vector<double> R = random_vec(rng, n);
  std::vector<double> out(n);
  auto loss = [&] {
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    return dot(out, R);
  };
  expect_grad("residual da", a, R, loss);
  expect_grad("residual db", b, R, loss);
}

TEST(KernelGrad, SoftmaxXent) {
  // The mean loss over the B*T rows, as the trainer computes it: dloss = 1/(B*T) per row.
  Rng rng(7);
  std::vector<double> logits = random_vec(rng, size_t(N) * V, -3.0, 3.0);
  const std::vector<int> targets = random_tokens(rng, N, V);
  const float dloss = 1.0f / float(N);  // a float, as the interface takes it
  std::vector<double> probs(logits.size()), losses(N);
  auto loss = [&] {
    cpu::softmax_xent_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    double sum = 0.0;
    for (double l : losses) sum += l;
    return double(dloss) * sum;  // the same (float) factor as the backward, so that it cancels
  };
  loss();
  std::vector<double> dlogits(logits.size(), 123.0);
  cpu::softmax_xent_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  expect_grad("softmax_xent dlogits", logits, dlogits, loss);
}

// The test of the test: a gradient that is wrong by 1% (or in one element by 1e-4) must fail.
TEST(KernelGrad, FdCheckCatchesWrongGradient) {
  Rng rng(8);
  std::vector<double> inp = random_vec(rng, size_t(N) * C), w = random_vec(rng, size_t(OC) * C);
  const std::vector<double> R = random_vec(rng, size_t(N) * OC);
  std::vector<double> out(size_t(N) * OC);
  auto loss = [&] {
    cpu::matmul_forward<double>(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
    return dot(out, R);
  };
  std::vector<double> dinp(inp.size()), dw(w.size(), 0.0);
  cpu::matmul_backward<double>(dinp.data(), dw.data(), nullptr, R.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_LT(fd_compare(w, dw, loss).max_rel_err, kFdTol);  // the right gradient passes

  std::vector<double> scaled = dw;
  for (double& g : scaled) g *= 1.01;
  EXPECT_GT(fd_compare(w, scaled, loss).max_rel_err, 100 * kFdTol);

  std::vector<double> one_off = dw;
  one_off[17] *= 1.0 + 1e-4;
  const FdResult r = fd_compare(w, one_off, loss);
  EXPECT_GT(r.max_rel_err, 10 * kFdTol);
  EXPECT_EQ(r.worst, 17u);
}

// ---------------------------------------------------------------------------------------------
// KernelForward: what a gradient check cannot see

TEST(KernelForward, AttentionIsCausalSoftmax) {
  Rng rng(9);
  std::vector<double> qkv = random_vec(rng, size_t(N) * 3 * C, -2.0, 2.0);
  std::vector<double> out(size_t(N) * C), att(size_t(B) * NH * Tn * Tn, 123.0);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH);
  for (int bh = 0; bh < B * NH; bh++) {
    for (int t = 0; t < Tn; t++) {
      const double* row = &att[(size_t(bh) * Tn + t) * Tn];
      double sum = 0.0;
      for (int t2 = 0; t2 <= t; t2++) {
        EXPECT_GT(row[t2], 0.0);
        sum += row[t2];
      }
      EXPECT_NEAR(sum, 1.0, 1e-14) << "row " << t << " of head " << bh;
      for (int t2 = t + 1; t2 < Tn; t2++) EXPECT_EQ(row[t2], 0.0) << "future position " << t2 << " visible from " << t;
    }
  }
  // position 0 sees only itself: its output is its own value vector
  const int hs = C / NH;
  for (int h = 0; h < NH; h++)
    for (int i = 0; i < hs; i++) EXPECT_NEAR(out[h * hs + i], qkv[2 * C + h * hs + i], 1e-15);
}

TEST(KernelForward, GeluKnownValues) {
  // GPT-2's tanh approximation (PyTorch: gelu(x, approximate='tanh')), in double
  const std::vector<double> x = {1.0, -2.0, 0.5, 3.0, 0.0};
  const std::vector<double> want = {0.8411919906082768, -0.04540230591222494, 0.34571400982514394,
                                    2.996362607918227, 0.0};
  std::vector<double> y(x.size());
  cpu::gelu_forward(y.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(y[i], want[i], 1e-15) << "gelu(" << x[i] << ")";
}

// The float kernels use their own vectorizable exp (kernels_cpu.cpp, exp_vec); the double ones use
// std::exp. So float against double on the same inputs, over exp's whole range and beyond it.
// An exp's relative error is at least that of its argument times |argument| (and the argument is
// computed in float), so each output is allowed kExpTol * (1 + |argument|) relative to its size:
// over 200 seeds the worst was 3.3e-7 (softmax), and an exp with one wrong Taylor coefficient
// (1/25 for 1/24) is off by 2e-5. Where exp under/overflows in float the limits must be exact.
TEST(KernelForward, Fp32ExpKernelsAgreeWithDouble) {
  constexpr double kExpTol = 3e-6;
  constexpr double kTiny = 1e-37;  // below float's normal numbers (from 1.2e-38) no relative bound holds
  const double s = 0.7978845608028654, k = 0.044715;  // gelu's constants, as in the kernel
  Rng rng(20);
  // gelu: x in [-12, 12] takes exp's argument -2u beyond -88 and 88; then some extremes
  std::vector<float> x = random_f32(rng, 4000, -12.0, 12.0);
  for (float e : {-1e4f, -200.0f, -30.0f, -0.0f, 0.0f, 30.0f, 200.0f, 1e4f}) x.push_back(e);
  const std::vector<float> dy = random_f32(rng, x.size());
  const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
  std::vector<float> y(x.size()), dx(x.size());
  std::vector<double> yd(x.size()), dxd(x.size());
  cpu::gelu_forward(y.data(), x.data(), x.size());
  cpu::gelu_forward(yd.data(), xd.data(), x.size());
  cpu::gelu_backward(dx.data(), x.data(), dy.data(), x.size());
  cpu::gelu_backward(dxd.data(), xd.data(), dyd.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double xi = xd[i], arg = 2 * s * (xi + k * xi * xi * xi);  // exp's argument is -2u
    const double cond = 1 + std::fabs(arg), du = s * (1 + 3 * k * xi * xi);
    EXPECT_LE(std::fabs(y[i] - yd[i]), kExpTol * cond * std::fabs(yd[i]) + kTiny) << "gelu(" << x[i] << ")";
    // gelu' = sig (1 + 2x (1 - sig) du): relative to the size of its terms, not of their sum
    EXPECT_LE(std::fabs(dx[i] - dxd[i]), kExpTol * cond * std::fabs(dyd[i]) * (1 + std::fabs(xi) * du))
        << "gelu'(" << x[i] << ")";
  }
  EXPECT_EQ(y[x.size() - 8], 0.0f);  // gelu(-1e4): exp(-2u) is inf in float, the sigmoid 0
  EXPECT_EQ(y[x.size() - 1], 1e4f);  // gelu(1e4): exp(-2u) is 0, the sigmoid 1
  const float nan = std::nanf("");
  cpu::gelu_forward(y.data(), &nan, 1);
  EXPECT_TRUE(std::isnan(y[0])) << "a NaN must come out as NaN";

  // softmax + cross-entropy: rows of logits in [-60, 60] (exp's arguments down to -120), and a
  // row with extremes whose exps are 0 in float
  const int rows = 40, v = 50;
  std::vector<float> logits = random_f32(rng, size_t(rows) * v, -60.0, 60.0);
  for (int j = 0; j < v; j++) logits[j] = j < 3 ? float(j) : (j % 2 ? -1e30f : -200.0f);
  const std::vector<int> targets = random_tokens(rng, rows, v);
  const std::vector<double> logits_d(logits.begin(), logits.end());
  std::vector<float> probs(logits.size()), losses(rows);
  std::vector<double> probs_d(logits.size()), losses_d(rows);
  cpu::softmax_xent_forward(losses.data(), probs.data(), logits.data(), targets.data(), rows, v);
  cpu::softmax_xent_forward(losses_d.data(), probs_d.data(), logits_d.data(), targets.data(), rows, v);
  for (int i = 0; i < rows; i++) {
    double maxval = -INFINITY;
    for (int j = 0; j < v; j++) maxval = std::max(maxval, logits_d[size_t(i) * v + j]);
    for (int j = 0; j < v; j++) {
      const size_t ij = size_t(i) * v + j;
      const double cond = 1 + std::fabs(logits_d[ij] - maxval);
      EXPECT_LE(std::fabs(probs[ij] - probs_d[ij]), kExpTol * cond * probs_d[ij] + kTiny) << "prob " << ij;
    }
    EXPECT_LE(std::fabs(losses[i] - losses_d[i]), kExpTol * (1 + std::fabs(losses_d[i]))) << "loss " << i;
  }
  for (int j = 3; j < v; j++) EXPECT_EQ(probs[j], 0.0f) << "exp(-202) and exp(-1e30) are 0 in float";

  // attention: scores of tens of units, so that the softmax is nearly one-hot in places. The
  // scores themselves are float sums of 16 products, hence the looser bound.
  const int b = 2, t = 19, c = 48, nh = 3;
  const std::vector<float> qkv = random_f32(rng, size_t(b) * t * 3 * c, -3.0, 3.0);
  const std::vector<double> qkv_d(qkv.begin(), qkv.end());
  std::vector<float> out(size_t(b) * t * c), att(size_t(b) * nh * t * t);
  std::vector<double> out_d(out.size()), att_d(att.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
  cpu::attention_forward(out_d.data(), att_d.data(), qkv_d.data(), b, t, c, nh);
  for (size_t i = 0; i < att.size(); i++) EXPECT_LE(std::fabs(att[i] - att_d[i]), 1e-4 * att_d[i] + kTiny) << "att " << i;
  for (size_t i = 0; i < out.size(); i++) EXPECT_NEAR(out[i], out_d[i], 1e-5) << "out " << i;  // |v| <= 3
}

TEST(KernelForward, LayerNormKnownValues) {
  // row 0: x = 1, 2, 3, 4 (mean 2.5, biased variance 1.25); row 1: constant (variance 0, so
  // rstd = 1/sqrt(eps), eps = 1e-5, and the output is the bias)
  const std::vector<double> x = {1, 2, 3, 4, 7, 7, 7, 7}, w = {1, 2, 1, 0.5}, b = {0, 0, 1, -1};
  std::vector<double> out(8), mean(2), rstd(2);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 2, 4);
  const double s = 1.0 / std::sqrt(1.25 + 1e-5);
  EXPECT_DOUBLE_EQ(mean[0], 2.5);
  EXPECT_NEAR(rstd[0], s, 1e-15);
  EXPECT_NEAR(rstd[1], 1.0 / std::sqrt(1e-5), 1e-12);
  const std::vector<double> want = {-1.5 * s, -0.5 * s * 2, 0.5 * s + 1, 1.5 * s * 0.5 - 1, 0, 0, 1, -1};
  for (int i = 0; i < 8; i++) EXPECT_NEAR(out[i], want[i], 1e-14) << i;
}

TEST(KernelForward, SoftmaxXentLossAndInPlace) {
  Rng rng(10);
  const std::vector<float> logits = random_f32(rng, size_t(N) * V, -20.0, 20.0);
  const std::vector<int> targets = random_tokens(rng, N, V);
  const float dloss = 1.0f / float(N);
  // out of place
  std::vector<float> probs(logits.size()), dlogits(logits.size()), losses(N);
  cpu::softmax_xent_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  cpu::softmax_xent_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  for (int i = 0; i < N; i++) {
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += probs[size_t(i) * V + j];
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_NEAR(losses[i], -std::log(double(probs[size_t(i) * V + targets[i]])), 1e-5);
  }
  // in place: probs over the logits, then dlogits over the probs; must give the same bits
  std::vector<float> buf = logits, losses2(N);
  cpu::softmax_xent_forward(losses2.data(), buf.data(), buf.data(), targets.data(), N, V);
  EXPECT_TRUE(bitwise_equal(buf, probs));
  EXPECT_TRUE(bitwise_equal(losses2, losses));
  cpu::softmax_xent_backward(buf.data(), buf.data(), targets.data(), dloss, N, V);
  EXPECT_TRUE(bitwise_equal(buf, dlogits));
  // huge logits: subtracting the row max keeps everything finite
  std::vector<float> big(V, 1e30f), big_losses(1);
  big[3] = 1e30f + 1e25f;
  const int target = 3;
  cpu::softmax_xent_forward(big_losses.data(), big.data(), big.data(), &target, 1, V);
  EXPECT_TRUE(std::isfinite(big_losses[0]));
  for (float p : big) EXPECT_TRUE(std::isfinite(p));
}

// ---------------------------------------------------------------------------------------------
// KernelConventions: weight/bias grads accumulate (+=), input grads are overwritten (=)

TEST(KernelConventions, MatmulAccumulatesWeightGradsOverwritesDinp) {
  Rng rng(11);
  const std::vector<double> inp = random_vec(rng, size_t(N) * C), w = random_vec(rng, size_t(OC) * C);
  const std::vector<double> dout = random_vec(rng, size_t(N) * OC);
  std::vector<double> dinp1(inp.size(), 5.0), dw1(w.size(), 0.0), db1(OC, 0.0);
  cpu::matmul_backward(dinp1.data(), dw1.data(), db1.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  std::vector<double> dinp2 = dinp1, dw2 = dw1, db2 = db1;
  cpu::matmul_backward(dinp2.data(), dw2.data(), db2.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_TRUE(bitwise_equal(dinp2, dinp1));  // overwritten, not doubled
  // The kernel sums over rows first and adds once, so the second call adds exactly the same
  // amount: 2x, to the bit.
  for (size_t i = 0; i < dw1.size(); i++) EXPECT_EQ(dw2[i], 2.0 * dw1[i]);
  for (int o = 0; o < OC; o++) EXPECT_EQ(db2[o], 2.0 * db1[o]);
  // null dinp / dbias mean "none", and do not change dw
  std::vector<double> dw3(w.size(), 0.0);
  cpu::matmul_backward<double>(nullptr, dw3.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_TRUE(bitwise_equal(dw3, dw1));
  // null bias in the forward means "no bias"
  std::vector<double> out_nobias(size_t(N) * OC), out_zero(size_t(N) * OC), zeros(OC, 0.0);
  cpu::matmul_forward<double>(out_nobias.data(), inp.data(), w.data(), nullptr, N, C, OC);
  cpu::matmul_forward(out_zero.data(), inp.data(), w.data(), zeros.data(), N, C, OC);
  EXPECT_TRUE(bitwise_equal(out_nobias, out_zero));
}

TEST(KernelConventions, LayerNormAccumulatesWeightGradsOverwritesDinp) {
  Rng rng(12);
  const std::vector<double> inp = random_vec(rng, size_t(N) * C), w = random_vec(rng, C), b = random_vec(rng, C);
  const std::vector<double> dout = random_vec(rng, size_t(N) * C);
  std::vector<double> out(inp.size()), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  std::vector<double> dinp1(inp.size(), 5.0), dw1(C, 0.0), db1(C, 0.0);
  cpu::layernorm_backward(dinp1.data(), dw1.data(), db1.data(), dout.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  std::vector<double> dinp2 = dinp1, dw2 = dw1, db2 = db1;
  cpu::layernorm_backward(dinp2.data(), dw2.data(), db2.data(), dout.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(bitwise_equal(dinp2, dinp1));
  for (int c = 0; c < C; c++) {
    EXPECT_EQ(dw2[c], 2.0 * dw1[c]);
    EXPECT_EQ(db2[c], 2.0 * db1[c]);
  }
}

TEST(KernelConventions, EmbeddingAccumulates) {
  Rng rng(13);
  std::vector<int> tokens = random_tokens(rng, N, V);
  tokens[1] = tokens[8];
  const std::vector<double> dout = random_vec(rng, size_t(N) * C);
  std::vector<double> dwte1(size_t(V) * C, 0.0), dwpe1(size_t(Tn) * C, 0.0);
  cpu::embedding_backward(dwte1.data(), dwpe1.data(), dout.data(), tokens.data(), B, Tn, C);
  std::vector<double> dwte2 = dwte1, dwpe2 = dwpe1;
  cpu::embedding_backward(dwte2.data(), dwpe2.data(), dout.data(), tokens.data(), B, Tn, C);
  // dwpe: summed over b first, added once: exactly 2x. dwte: one += per occurrence, so a repeated
  // token's row is 2x only up to rounding.
  for (size_t i = 0; i < dwpe1.size(); i++) EXPECT_EQ(dwpe2[i], 2.0 * dwpe1[i]);
  for (size_t i = 0; i < dwte1.size(); i++) EXPECT_NEAR(dwte2[i], 2.0 * dwte1[i], 1e-14);
  // the tied embedding: a second, different contribution (the LM head's) lands in the same buffer
  std::vector<double> head_grad(dwte1.size(), 0.25), dwte3 = head_grad, dwpe3(dwpe1.size(), 0.0);
  cpu::embedding_backward(dwte3.data(), dwpe3.data(), dout.data(), tokens.data(), B, Tn, C);
  for (size_t i = 0; i < dwte1.size(); i++) EXPECT_NEAR(dwte3[i], 0.25 + dwte1[i], 1e-14);
}

TEST(KernelConventions, InputGradsOverwrite) {
  // attention, gelu and softmax_xent write their input gradient whatever was there before
  Rng rng(14);
  const std::vector<double> qkv = random_vec(rng, size_t(N) * 3 * C), dout = random_vec(rng, size_t(N) * C);
  std::vector<double> out(dout.size()), att(size_t(B) * NH * Tn * Tn);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH);
  std::vector<double> d1(qkv.size(), 0.0), d2(qkv.size(), 7.0);
  cpu::attention_backward(d1.data(), dout.data(), qkv.data(), att.data(), out.data(), B, Tn, C, NH);
  cpu::attention_backward(d2.data(), dout.data(), qkv.data(), att.data(), out.data(), B, Tn, C, NH);
  EXPECT_TRUE(bitwise_equal(d1, d2));

  std::vector<double> g1(dout.size(), 0.0), g2(dout.size(), -3.0);
  cpu::gelu_backward(g1.data(), qkv.data(), dout.data(), dout.size());
  cpu::gelu_backward(g2.data(), qkv.data(), dout.data(), dout.size());
  EXPECT_TRUE(bitwise_equal(g1, g2));
}

TEST(KernelConventions, SumSquaresAndAccumulate) {
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f};
  EXPECT_EQ(cpu::sum_squares(x.data(), x.size()), 14.25);
  const std::vector<bf16> xb = to_bf16(x);
  EXPECT_EQ(cpu::sum_squares(xb.data(), xb.size()), 14.25);
  // first micro-step: dst is not read (NaN stays out); later ones add
  std::vector<float> dst(4, NAN);
  cpu::accumulate(dst.data(), x.data(), x.size(), 0.5f, true);
  for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(dst[i], 0.5f * x[i]);
  cpu::accumulate(dst.data(), x.data(), x.size(), 0.5f, false);
  for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(dst[i], x[i]);
}

// ---------------------------------------------------------------------------------------------
// AdamW, against the formula in double (p, m, v are fp32, so agreement is to fp32 rounding)

constexpr float kLr = 1e-2f, kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f;

TEST(AdamW, FirstStepMovesByLrTimesSign) {
  // Step 1 with bias correction: mhat = g, vhat = g^2, so the update is lr * g / (|g| + eps),
  // about lr * sign(g) whatever the gradient's size.
  std::vector<float> p = {0.5f, -0.3f, 0.1f, 2.0f}, m(4, 0.0f), v(4, 0.0f);
  const std::vector<double> g = {0.2, -1e-3, 3.0, -0.5};
  const std::vector<float> p0 = p;
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), g.size(), kLr, kB1, kB2, kEps, 0.0f, 1.0f, 1);
  for (size_t i = 0; i < g.size(); i++) {
    const double want = p0[i] - double(kLr) * g[i] / (std::fabs(g[i]) + double(kEps));
    EXPECT_NEAR(p[i], want, 1e-6 * std::fabs(want) + 1e-9) << i;
    EXPECT_NEAR(std::fabs(p0[i] - p[i]), kLr, 1e-5 * kLr) << i;  // ~lr * sign(g)
    EXPECT_NEAR(m[i], (1.0 - double(kB1)) * g[i], 1e-6 * std::fabs(g[i]));
    EXPECT_NEAR(v[i], (1.0 - double(kB2)) * g[i] * g[i], 1e-6 * g[i] * g[i]);
  }
}

TEST(AdamW, SecondStepMatchesFormula) {
  std::vector<float> p = {0.5f, -0.3f, 0.1f}, m = {0.02f, -0.01f, 0.3f}, v = {4e-5f, 1e-6f, 9e-3f};
  const std::vector<double> g = {0.1, 0.05, -2.0};
  const float wd = 0.1f;
  const std::vector<float> p0 = p, m0 = m, v0 = v;
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), g.size(), kLr, kB1, kB2, kEps, wd, 1.0f, 2);
  for (size_t i = 0; i < g.size(); i++) {
    const double b1 = kB1, b2 = kB2;
    const double mi = b1 * m0[i] + (1 - b1) * g[i], vi = b2 * v0[i] + (1 - b2) * g[i] * g[i];
    // the interface computes the bias corrections once, in float, with powf (as the CUDA kernel does)
    const double bc1 = 1.0f - powf(kB1, 2.0f), bc2 = 1.0f - powf(kB2, 2.0f);
    const double mhat = mi / bc1, vhat = vi / bc2;
    const double want = p0[i] - double(kLr) * (mhat / (std::sqrt(vhat) + double(kEps)) + double(wd) * p0[i]);
    EXPECT_NEAR(p[i], want, 1e-6 * std::fabs(p0[i])) << i;
    EXPECT_NEAR(m[i], mi, 1e-6 * std::fabs(mi)) << i;
    EXPECT_NEAR(v[i], vi, 1e-6 * vi) << i;
  }
}

TEST(AdamW, WeightDecayIsDecoupled) {
  // g = 0 keeps m = v = 0, so Adam's term is 0/(0 + eps) = 0 and only the decay acts:
  // p -= lr * wd * p exactly, NOT the ~lr * sign(p) an L2 term folded into g would give.
  std::vector<float> p = {1.0f, -2.0f, 0.25f}, m(3, 0.0f), v(3, 0.0f);
  const std::vector<double> g(3, 0.0);
  const float wd = 0.1f;
  const std::vector<float> p0 = p;
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), g.size(), kLr, kB1, kB2, kEps, wd, 1.0f, 1);
  for (size_t i = 0; i < p.size(); i++) {
    EXPECT_NEAR(p[i], double(p0[i]) * (1.0 - double(kLr) * double(wd)), 1e-7 * std::fabs(p0[i]));
    EXPECT_EQ(m[i], 0.0f);
    EXPECT_EQ(v[i], 0.0f);
  }
}

TEST(AdamW, GradScaleIsApplied) {
  // g * 0.5 with grad_scale 2 is the same step as g with grad_scale 1 (exactly: powers of two)
  const std::vector<double> g = {0.3, -0.02, 1.5};
  std::vector<double> g_half(g.size());
  for (size_t i = 0; i < g.size(); i++) g_half[i] = 0.5 * g[i];
  std::vector<float> p1 = {0.5f, -0.3f, 0.1f}, m1 = {0.01f, 0.0f, -0.1f}, v1 = {1e-4f, 1e-6f, 1e-2f};
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  cpu::adamw_update(p1.data(), m1.data(), v1.data(), g.data(), g.size(), kLr, kB1, kB2, kEps, 0.0f, 1.0f, 3);
  cpu::adamw_update(p2.data(), m2.data(), v2.data(), g_half.data(), g.size(), kLr, kB1, kB2, kEps, 0.0f, 2.0f, 3);
  EXPECT_TRUE(bitwise_equal(p1, p2));
  EXPECT_TRUE(bitwise_equal(m1, m2));
  EXPECT_TRUE(bitwise_equal(v1, v2));
  // and it really scales: grad_scale 0 leaves m decaying towards 0 only
  std::vector<float> p3 = {0.5f}, m3 = {0.01f}, v3 = {1e-4f};
  cpu::adamw_update(p3.data(), m3.data(), v3.data(), g.data(), 1, kLr, kB1, kB2, kEps, 0.0f, 0.0f, 3);
  EXPECT_FLOAT_EQ(m3[0], kB1 * 0.01f);
}

TEST(AdamW, Bf16AndFloatGradsAgree) {
  // the storage type of g only changes how g is loaded: bf16-representable grads give the same bits
  Rng rng(15);
  const size_t n = 101;
  const std::vector<float> gf = to_f32(to_bf16(random_f32(rng, n)));
  const std::vector<bf16> gb = to_bf16(gf);
  std::vector<float> p1 = random_f32(rng, n), m1 = random_f32(rng, n, -0.1, 0.1), v1 = random_f32(rng, n, 0.0, 0.01);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  cpu::adamw_update(p1.data(), m1.data(), v1.data(), gf.data(), n, kLr, kB1, kB2, kEps, 0.1f, 0.7f, 5);
  cpu::adamw_update(p2.data(), m2.data(), v2.data(), gb.data(), n, kLr, kB1, kB2, kEps, 0.1f, 0.7f, 5);
  EXPECT_TRUE(bitwise_equal(p1, p2));
  EXPECT_TRUE(bitwise_equal(m1, m2));
  EXPECT_TRUE(bitwise_equal(v1, v2));
}

// ---------------------------------------------------------------------------------------------
// Bf16

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits_of(0x3F800000u), 0x3F80u);  // 1.0: exact
  EXPECT_EQ(bf16_bits_of(0x3F807FFFu), 0x3F80u);  // just below halfway: down
  EXPECT_EQ(bf16_bits_of(0x3F808001u), 0x3F81u);  // just above halfway: up
  EXPECT_EQ(bf16_bits_of(0x3F808000u), 0x3F80u);  // halfway, 0x3F80 even: down
  EXPECT_EQ(bf16_bits_of(0x3F818000u), 0x3F82u);  // halfway, 0x3F81 odd: up to even
  EXPECT_EQ(bf16_bits_of(0xBF808000u), 0xBF80u);  // the same for negatives (magnitude rounds)
  EXPECT_EQ(bf16_bits_of(0xBF818000u), 0xBF82u);
  EXPECT_EQ(bf16_bits_of(0x00008000u), 0x0000u);  // subnormals too
  EXPECT_EQ(bf16_bits_of(0x00018000u), 0x0002u);
  EXPECT_EQ(bf16_bits_of(0x3FFF8000u), 0x4000u);  // the carry ripples into the exponent
  EXPECT_EQ(bf16_bits_of(0x7F7F8000u), 0x7F80u);  // halfway above the largest bf16: to infinity
  EXPECT_EQ(bf16_bits_of(0x7F7FFFFFu), 0x7F80u);  // FLT_MAX is past it as well
  EXPECT_EQ(bf16_bits_of(0x7F7F7FFFu), 0x7F7Fu);  // just below halfway stays finite
}

TEST(Bf16, NanAndInf) {
  EXPECT_EQ(bf16_bits_of(0x7F800000u), 0x7F80u);  // +inf
  EXPECT_EQ(bf16_bits_of(0xFF800000u), 0xFF80u);  // -inf
  auto is_nan = [](uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; };
  EXPECT_TRUE(is_nan(bf16_bits_of(0x7FC00000u)));  // quiet NaN
  EXPECT_TRUE(is_nan(bf16_bits_of(0x7F800001u)));  // payload only in the dropped bits: still NaN,
  EXPECT_TRUE(is_nan(bf16_bits_of(0xFFFFFFFFu)));  // not inf, and no carry into the sign
  EXPECT_TRUE(std::isnan(nz::bf16_to_f32(nz::f32_to_bf16(NAN))));
}

TEST(Bf16, RoundTripAndCast) {
  // every bf16 value survives bf16 -> f32 -> bf16 unchanged (NaNs stay NaN)
  std::vector<bf16> all(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i].bits = uint16_t(i);
  std::vector<float> f(all.size());
  cpu::cast(f.data(), all.data(), all.size());
  std::vector<bf16> back(all.size());
  cpu::cast(back.data(), f.data(), f.size());
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; i++) {
    if (std::isnan(f[i])) {
      EXPECT_TRUE(std::isnan(nz::bf16_to_f32(back[i])));
      continue;
    }
    EXPECT_EQ(f[i], nz::bf16_to_f32(all[i]));
    mismatches += back[i].bits != all[i].bits;
  }
  EXPECT_EQ(mismatches, 0);
  // cast<bf16, float> is the scalar conversion, element by element
  Rng rng(16);
  const std::vector<float> x = random_f32(rng, 1000, -1e3, 1e3);
  std::vector<bf16> xb(x.size());
  cpu::cast(xb.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(xb[i].bits, nz::f32_to_bf16(x[i]).bits);
  // same-type casts copy
  std::vector<bf16> copy(xb.size());
  cpu::cast(copy.data(), xb.data(), xb.size());
  EXPECT_EQ(std::memcmp(copy.data(), xb.data(), xb.size() * sizeof(bf16)), 0);
}

// With bf16-representable inputs, the bf16 kernels do exactly the fp32 arithmetic and round once,
// on the store: every output is the fp32 kernel's output rounded, to the bit. Were anything summed
// in bf16 (or rounded twice) this would fail at once; C = 200 makes sure of it.
void expect_rounded_once(const std::vector<bf16>& got, const std::vector<float>& fp32, const char* what) {
  ASSERT_EQ(got.size(), fp32.size()) << what;
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i].bits != nz::f32_to_bf16(fp32[i]).bits && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0u) << what << ": first at " << first << ", bf16 " << nz::bf16_to_f32(got[first])
                            << " vs fp32 " << fp32[first];
}

TEST(Bf16, KernelsRoundOnceFromFp32) {
  Rng rng(17);
  const int b = 2, t = 7, c = 200, nh = 5, oc = 13, n = b * t, v = 50;
  auto representable = [&](size_t count, double lo, double hi) { return to_f32(to_bf16(random_f32(rng, count, lo, hi))); };
  const std::vector<float> inp = representable(size_t(n) * c, -2, 2), w = representable(size_t(oc) * c, -1, 1);
  const std::vector<float> bias = representable(oc, -1, 1), dout = representable(size_t(n) * oc, -1, 1);
  const std::vector<float> lw = representable(c, 0.5, 1.5), lb = representable(c, -1, 1);
  const std::vector<float> dln = representable(size_t(n) * c, -1, 1), qkv = representable(size_t(n) * 3 * c, -2, 2);
  const std::vector<float> logits = representable(size_t(n) * v, -5, 5);
  const std::vector<int> targets = random_tokens(rng, n, v);
  const std::vector<bf16> inp_b = to_bf16(inp), w_b = to_bf16(w), bias_b = to_bf16(bias), dout_b = to_bf16(dout);
  const std::vector<bf16> lw_b = to_bf16(lw), lb_b = to_bf16(lb), dln_b = to_bf16(dln), qkv_b = to_bf16(qkv);
  const std::vector<bf16> logits_b = to_bf16(logits);

  {  // matmul forward and backward (the weight grads start from 0, so "+=" is one rounding too)
    std::vector<float> out(size_t(n) * oc), dinp(inp.size()), dw(w.size(), 0.0f), db(oc, 0.0f);
    std::vector<bf16> out_b(out.size()), dinp_b(dinp.size()), dw_b(dw.size(), bf16{0}), db_b(oc, bf16{0});
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), n, c, oc);
    cpu::matmul_forward(out_b.data(), inp_b.data(), w_b.data(), bias_b.data(), n, c, oc);
    expect_rounded_once(out_b, out, "matmul_forward");
    cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), n, c, oc);
    cpu::matmul_backward(dinp_b.data(), dw_b.data(), db_b.data(), dout_b.data(), inp_b.data(), w_b.data(), n, c, oc);
    expect_rounded_once(dinp_b, dinp, "matmul_backward dinp");
    expect_rounded_once(dw_b, dw, "matmul_backward dw");
    expect_rounded_once(db_b, db, "matmul_backward dbias");
  }
  {  // layernorm forward and backward (mean and rstd are fp32 in both)
    std::vector<float> out(inp.size()), mean(n), rstd(n), mean_b(n), rstd_b(n), dinp(inp.size()), dw(c, 0.0f), db(c, 0.0f);
    std::vector<bf16> out_b(out.size()), dinp_b(dinp.size()), dw_b(c, bf16{0}), db_b(c, bf16{0});
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), lw.data(), lb.data(), n, c);
    cpu::layernorm_forward(out_b.data(), mean_b.data(), rstd_b.data(), inp_b.data(), lw_b.data(), lb_b.data(), n, c);
    EXPECT_TRUE(bitwise_equal(mean_b, mean));
    EXPECT_TRUE(bitwise_equal(rstd_b, rstd));
    expect_rounded_once(out_b, out, "layernorm_forward");
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dln.data(), inp.data(), lw.data(), mean.data(), rstd.data(), n, c);
    cpu::layernorm_backward(dinp_b.data(), dw_b.data(), db_b.data(), dln_b.data(), inp_b.data(), lw_b.data(), mean.data(), rstd.data(), n, c);
    expect_rounded_once(dinp_b, dinp, "layernorm_backward dinp");
    expect_rounded_once(dw_b, dw, "layernorm_backward dw");
    expect_rounded_once(db_b, db, "layernorm_backward db");
  }
  {  // attention forward: att and out both come from the fp32 probabilities
    std::vector<float> out(size_t(n) * c), att(size_t(b) * nh * t * t);
    std::vector<bf16> out_b(out.size()), att_b(att.size());
    cpu::attention_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
    cpu::attention_forward(out_b.data(), att_b.data(), qkv_b.data(), b, t, c, nh);
    expect_rounded_once(att_b, att, "attention_forward att");
    expect_rounded_once(out_b, out, "attention_forward out");
  }
  {  // gelu, and softmax + cross-entropy (the losses are fp32 in both)
    std::vector<float> g(inp.size()), probs(logits.size()), losses(n), losses_b(n);
    std::vector<bf16> g_b(g.size()), probs_b(probs.size());
    cpu::gelu_forward(g.data(), inp.data(), inp.size());
    cpu::gelu_forward(g_b.data(), inp_b.data(), inp.size());
    expect_rounded_once(g_b, g, "gelu_forward");
    cpu::softmax_xent_forward(losses.data(), probs.data(), logits.data(), targets.data(), n, v);
    cpu::softmax_xent_forward(losses_b.data(), probs_b.data(), logits_b.data(), targets.data(), n, v);
    expect_rounded_once(probs_b, probs, "softmax_xent_forward probs");
    EXPECT_TRUE(bitwise_equal(losses_b, losses));
  }
}

// With arbitrary fp32 inputs the bf16 kernels see inputs rounded to 8 significant bits (relative
// error <= 2^-9 each), so a product is off by <= ~2^-8 of its size. Bounds: matmul, per element,
// |bf16 - fp32| <= 1e-2 * sum_c |x_c w_c| (+ the output's own rounding); layernorm (outputs of
// order 1, inputs centred) |bf16 - fp32| <= 1e-2 * max |out|.
TEST(Bf16, CloseToFp32) {
  Rng rng(18);
  const int n = 9, c = 200, oc = 13;
  const std::vector<float> inp = random_f32(rng, size_t(n) * c, -2, 2), w = random_f32(rng, size_t(oc) * c);
  std::vector<float> out_f(size_t(n) * oc);
  std::vector<bf16> out_b(out_f.size());
  cpu::matmul_forward<float>(out_f.data(), inp.data(), w.data(), nullptr, n, c, oc);
  const std::vector<bf16> inp_b = to_bf16(inp), w_b = to_bf16(w);
  cpu::matmul_forward<bf16>(out_b.data(), inp_b.data(), w_b.data(), nullptr, n, c, oc);
  for (int i = 0; i < n; i++) {
    for (int o = 0; o < oc; o++) {
      double abs_sum = 0.0;
      for (int k = 0; k < c; k++) abs_sum += std::fabs(double(inp[size_t(i) * c + k]) * w[size_t(o) * c + k]);
      const float yf = out_f[size_t(i) * oc + o], yb = nz::bf16_to_f32(out_b[size_t(i) * oc + o]);
      EXPECT_LE(std::fabs(yb - yf), 1e-2 * abs_sum + std::fabs(yf) * 0x1p-8) << i << "," << o;
    }
  }
  const std::vector<float> lw = random_f32(rng, c, 0.5, 1.5), lb = random_f32(rng, c);
  std::vector<float> ln_f(size_t(n) * c), mean(n), rstd(n);
  std::vector<bf16> ln_b(ln_f.size());
  cpu::layernorm_forward(ln_f.data(), mean.data(), rstd.data(), inp.data(), lw.data(), lb.data(), n, c);
  const std::vector<bf16> lw_b = to_bf16(lw), lb_b = to_bf16(lb);
  cpu::layernorm_forward(ln_b.data(), mean.data(), rstd.data(), inp_b.data(), lw_b.data(), lb_b.data(), n, c);
  double max_out = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < ln_f.size(); i++) {
    max_out = std::max(max_out, std::fabs(double(ln_f[i])));
    max_diff = std::max(max_diff, std::fabs(double(nz::bf16_to_f32(ln_b[i])) - ln_f[i]));
  }
  EXPECT_LE(max_diff, 1e-2 * max_out);
}

// ---------------------------------------------------------------------------------------------
// Determinism: the same bits with 1, 2 and 3 threads (each element has one owner and one order).
// The linear layer's products are the BLAS's: the same bits for the same shapes and thread count,
// which is what the stages' bitwise comparisons rely on (they run the same shapes on the same
// number of threads), but across thread counts only on some processors: OpenBLAS's Haswell kernels
// (which 0.3.21 also picks for processors it does not know, such as AMD's Zen 5) split the work
// differently with the thread count. So those are checked bit for bit against a second run with the
// same threads, and across thread counts within the fp32 bound of two orders of the same sum.

// |a - b| <= 2 gamma_K (|c0| + sum_k |x_k y_k|) for every element: each is within gamma_K times that of
// the exact value (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), gamma_K = K u / (1 - K u).
// abs_terms[i] = |c0| + sum_k |x_k y_k| of element i.
bool within_two_orders(const std::vector<float>& a, const std::vector<float>& b,
                       const std::vector<double>& abs_terms, int K) {
  const double u = 0x1p-24, gamma = K * u / (1 - K * u);
  for (size_t i = 0; i < a.size(); i++)
    if (std::fabs(double(a[i]) - double(b[i])) > 2 * gamma * abs_terms[i]) return false;
  return true;
}

TEST(Determinism, BitwiseAcrossThreadCounts) {
  Rng rng(19);
  const int b = 3, t = 23, c = 96, nh = 4, oc = 80, n = b * t, vocab = 37;
  const std::vector<float> inp = random_f32(rng, size_t(n) * c), w = random_f32(rng, size_t(oc) * c);
  const std::vector<float> dout = random_f32(rng, size_t(n) * oc), bias = random_f32(rng, oc);
  const std::vector<float> qkv = random_f32(rng, size_t(n) * 3 * c, -2, 2), datt_out = random_f32(rng, size_t(n) * c);
  const std::vector<float> lw = random_f32(rng, c), lb = random_f32(rng, c), dln = random_f32(rng, size_t(n) * c);
  const std::vector<int> tokens = random_tokens(rng, n, vocab);

  struct Results {
    std::vector<float> out, dinp, dw, dbias, att, aout, dqkv, ln, dln_inp, dlw, dlb, dwte, dwpe;
    std::vector<float> gelu, dgelu, probs, losses;
  };
  auto run = [&](int threads) {
    Results r;
    with_threads(threads, [&] {
      r.out.resize(size_t(n) * oc);
      cpu::matmul_forward(r.out.data(), inp.data(), w.data(), bias.data(), n, c, oc);
      r.dinp.resize(inp.size());
      r.dw.assign(w.size(), 0.5f);
      r.dbias.assign(oc, 0.5f);
      cpu::matmul_backward(r.dinp.data(), r.dw.data(), r.dbias.data(), dout.data(), inp.data(), w.data(), n, c, oc);
      r.att.resize(size_t(b) * nh * t * t);
      r.aout.resize(size_t(n) * c);
      r.dqkv.resize(qkv.size());
      cpu::attention_forward(r.aout.data(), r.att.data(), qkv.data(), b, t, c, nh);
      cpu::attention_backward(r.dqkv.data(), datt_out.data(), qkv.data(), r.att.data(), r.aout.data(), b, t, c,
                              nh);
      std::vector<float> mean(n), rstd(n);
      r.ln.resize(inp.size());
      cpu::layernorm_forward(r.ln.data(), mean.data(), rstd.data(), inp.data(), lw.data(), lb.data(), n, c);
      r.dln_inp.resize(inp.size());
      r.dlw.assign(c, 0.0f);
      r.dlb.assign(c, 0.0f);
      cpu::layernorm_backward(r.dln_inp.data(), r.dlw.data(), r.dlb.data(), dln.data(), inp.data(),
                              lw.data(), mean.data(), rstd.data(), n, c);
      r.dwte.assign(size_t(vocab) * c, 0.0f);
      r.dwpe.assign(size_t(t) * c, 0.0f);
      cpu::embedding_backward(r.dwte.data(), r.dwpe.data(), dln.data(), tokens.data(), b, t, c);
      r.gelu.resize(qkv.size());
      r.dgelu.resize(qkv.size());
      cpu::gelu_forward(r.gelu.data(), qkv.data(), qkv.size());
      cpu::gelu_backward(r.dgelu.data(), qkv.data(), qkv.data(), qkv.size());
      r.probs.resize(size_t(n) * oc);
      r.losses.resize(n);
      cpu::softmax_xent_forward(r.losses.data(), r.probs.data(), dout.data(), tokens.data(), n, oc);
    });
    return r;
  };
  // |c0| + sum_k |x_k y_k| of every element of the three products
  std::vector<double> out_abs(size_t(n) * oc), dinp_abs(size_t(n) * c), dw_abs(size_t(oc) * c);
  for (int i = 0; i < n; i++)
    for (int o = 0; o < oc; o++) {
      double s = std::fabs(bias[o]);
      for (int k = 0; k < c; k++) s += std::fabs(double(inp[size_t(i) * c + k]) * w[size_t(o) * c + k]);
      out_abs[size_t(i) * oc + o] = s;
    }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c; j++) {
      double s = 0;
      for (int o = 0; o < oc; o++) s += std::fabs(double(dout[size_t(i) * oc + o]) * w[size_t(o) * c + j]);
      dinp_abs[size_t(i) * c + j] = s;
    }
  for (int o = 0; o < oc; o++)
    for (int j = 0; j < c; j++) {
      double s = 0.5;  // dw starts at 0.5: the product is added to it
      for (int i = 0; i < n; i++) s += std::fabs(double(dout[size_t(i) * oc + o]) * inp[size_t(i) * c + j]);
      dw_abs[size_t(o) * c + j] = s;
    }
  const Results r1 = run(1);
  for (int threads : {2, 3}) {
    const Results r = run(threads), again = run(threads);
    EXPECT_TRUE(bitwise_equal(r.out, again.out)) << threads << " threads: matmul_forward, run twice";
    EXPECT_TRUE(bitwise_equal(r.dinp, again.dinp)) << threads << " threads: matmul_backward dinp, run twice";
    EXPECT_TRUE(bitwise_equal(r.dw, again.dw)) << threads << " threads: matmul_backward dw, run twice";
    EXPECT_TRUE(within_two_orders(r.out, r1.out, out_abs, c)) << threads << " threads: matmul_forward";
    EXPECT_TRUE(within_two_orders(r.dinp, r1.dinp, dinp_abs, oc)) << threads << " threads: matmul_backward dinp";
    EXPECT_TRUE(within_two_orders(r.dw, r1.dw, dw_abs, n)) << threads << " threads: matmul_backward dw";
    EXPECT_TRUE(bitwise_equal(r.dbias, r1.dbias)) << threads << " threads: matmul_backward dbias";
    EXPECT_TRUE(bitwise_equal(r.att, r1.att)) << threads << " threads: attention_forward att";
    EXPECT_TRUE(bitwise_equal(r.aout, r1.aout)) << threads << " threads: attention_forward out";
    EXPECT_TRUE(bitwise_equal(r.dqkv, r1.dqkv)) << threads << " threads: attention_backward";
    EXPECT_TRUE(bitwise_equal(r.ln, r1.ln)) << threads << " threads: layernorm_forward";
    EXPECT_TRUE(bitwise_equal(r.dln_inp, r1.dln_inp)) << threads << " threads: layernorm_backward dinp";
    EXPECT_TRUE(bitwise_equal(r.dlw, r1.dlw)) << threads << " threads: layernorm_backward dw";
    EXPECT_TRUE(bitwise_equal(r.dlb, r1.dlb)) << threads << " threads: layernorm_backward db";
    EXPECT_TRUE(bitwise_equal(r.dwte, r1.dwte)) << threads << " threads: embedding_backward dwte";
    EXPECT_TRUE(bitwise_equal(r.dwpe, r1.dwpe)) << threads << " threads: embedding_backward dwpe";
    EXPECT_TRUE(bitwise_equal(r.gelu, r1.gelu)) << threads << " threads: gelu_forward";
    EXPECT_TRUE(bitwise_equal(r.dgelu, r1.dgelu)) << threads << " threads: gelu_backward";
    EXPECT_TRUE(bitwise_equal(r.probs, r1.probs)) << threads << " threads: softmax_xent_forward probs";
    EXPECT_TRUE(bitwise_equal(r.losses, r1.losses)) << threads << " threads: softmax_xent_forward losses";
  }
}

// ---------------------------------------------------------------------------------------------
// Fused: each fused op gives the bits of the unfused ops it replaces in the model (model.cpp), in
// place as the model calls it, in every storage type, with 1 and 3 threads. The shapes leave a
// partial block of channels (kChannelBlock = 64 in kernels_cpu.cpp: OC = 180).

template <class T>
std::vector<T> random_t(Rng& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(n);
  for (T& x : v) x = nz::store<T>(rng.uniform(lo, hi));
  return v;
}

template <class T>
void fused_same_bits_case(const char* type) {
  using A = nz::acc_t<T>;
  SCOPED_TRACE(type);
  Rng rng(29);
  const int n = 33, c = 45, oc = 4 * c;
  const size_t nc = size_t(n) * c, noc = size_t(n) * oc;
  const auto x = random_t<T>(rng, nc, -2, 3), att = random_t<T>(rng, nc), lw = random_t<T>(rng, c, 0.5, 1.5),
             lb = random_t<T>(rng, c), fw = random_t<T>(rng, size_t(oc) * c), fb = random_t<T>(rng, oc),
             dln = random_t<T>(rng, nc), dskip = random_t<T>(rng, nc), dfc = random_t<T>(rng, noc),
             g0 = random_t<T>(rng, size_t(oc) * c);

  // res_att = x + res_att; ln2 = layernorm(res_att)
  std::vector<T> res_u = att, ln_u(nc), res_f = att, ln_f(nc);
  std::vector<A> mean_u(n), rstd_u(n), mean_f(n), rstd_f(n);
  cpu::residual_forward(res_u.data(), x.data(), res_u.data(), nc);
  cpu::layernorm_forward(ln_u.data(), mean_u.data(), rstd_u.data(), res_u.data(), lw.data(), lb.data(), n, c);
  cpu::residual_layernorm_forward(res_f.data(), ln_f.data(), mean_f.data(), rstd_f.data(), x.data(),
                                  res_f.data(), lw.data(), lb.data(), n, c);
  EXPECT_TRUE(bitwise_equal(res_f, res_u)) << "residual_layernorm_forward res";
  EXPECT_TRUE(bitwise_equal(ln_f, ln_u)) << "residual_layernorm_forward out";
  EXPECT_TRUE(bitwise_equal(mean_f, mean_u) && bitwise_equal(rstd_f, rstd_u)) << "residual_layernorm_forward mean, rstd";

  // fch = ln2 @ fc_w^T + fc_b; fchg = gelu(fch)   (and without a bias)
  for (bool with_bias : {true, false}) {
    const T* bias = with_bias ? fb.data() : nullptr;
    std::vector<T> fc_u(noc), fcg_u(noc), fc_f(noc), fcg_f(noc);
    cpu::matmul_forward(fc_u.data(), ln_u.data(), fw.data(), bias, n, c, oc);
    cpu::gelu_forward(fcg_u.data(), fc_u.data(), noc);
    cpu::matmul_bias_gelu_forward(fc_f.data(), fcg_f.data(), ln_u.data(), fw.data(), bias, n, c, oc);
    EXPECT_TRUE(bitwise_equal(fc_f, fc_u)) << "matmul_bias_gelu_forward fc, bias " << with_bias;
    EXPECT_TRUE(bitwise_equal(fcg_f, fcg_u)) << "matmul_bias_gelu_forward fcg, bias " << with_bias;
  }
  std::vector<T> fch(noc), fchg(noc);
  cpu::matmul_bias_gelu_forward(fch.data(), fchg.data(), ln_u.data(), fw.data(), fb.data(), n, c, oc);

  // d4c = gelu'(fch) * d4c in place; dln, dFCW from it; dFCB: in matmul_backward, or fused
  std::vector<T> d4c_u = dfc, dinp_u(nc), dw_u = g0, db_u(fb.size(), nz::store<T>(0.0));
  std::vector<T> d4c_f = dfc, dinp_f(nc), dw_f = g0, db_f = db_u;
  cpu::gelu_backward(d4c_u.data(), fch.data(), d4c_u.data(), noc);
  cpu::matmul_backward(dinp_u.data(), dw_u.data(), db_u.data(), d4c_u.data(), ln_u.data(), fw.data(), n, c, oc);
  cpu::gelu_backward_bias(d4c_f.data(), db_f.data(), fch.data(), d4c_f.data(), n, oc);
  cpu::matmul_backward(dinp_f.data(), dw_f.data(), (T*)nullptr, d4c_f.data(), ln_u.data(), fw.data(), n, c, oc);
  EXPECT_TRUE(bitwise_equal(d4c_f, d4c_u)) << "gelu_backward_bias dinp";
  EXPECT_TRUE(bitwise_equal(db_f, db_u)) << "gelu_backward_bias dbias";
  EXPECT_TRUE(bitwise_equal(dinp_f, dinp_u) && bitwise_equal(dw_f, dw_u)) << "matmul_backward after it";

  // dres = dx + layernorm_backward(dln): into a temporary then residual_forward, or fused; and
  // once more with dinp over the skip gradient, and once with no skip gradient
  std::vector<T> tmp(nc), dres_u(nc), lw_u(lw.size(), nz::store<T>(0.5)), lbg_u = lw_u;
  std::vector<T> dres_f(nc), lw_f = lw_u, lbg_f = lw_u;
  cpu::layernorm_backward(tmp.data(), lw_u.data(), lbg_u.data(), dln.data(), res_u.data(), lw.data(),
                          mean_u.data(), rstd_u.data(), n, c);
  cpu::residual_forward(dres_u.data(), dskip.data(), tmp.data(), nc);
  cpu::layernorm_backward_residual(dres_f.data(), lw_f.data(), lbg_f.data(), dskip.data(), dln.data(),
                                   res_u.data(), lw.data(), mean_u.data(), rstd_u.data(), n, c);
  EXPECT_TRUE(bitwise_equal(dres_f, dres_u)) << "layernorm_backward_residual dinp";
  EXPECT_TRUE(bitwise_equal(lw_f, lw_u) && bitwise_equal(lbg_f, lbg_u)) << "layernorm_backward_residual dw, db";
  std::vector<T> in_place = dskip;
  cpu::layernorm_backward_residual(in_place.data(), (T*)nullptr, (T*)nullptr, in_place.data(), dln.data(),
                                   res_u.data(), lw.data(), mean_u.data(), rstd_u.data(), n, c);
  EXPECT_TRUE(bitwise_equal(in_place, dres_u)) << "layernorm_backward_residual, dinp over dskip";
  std::vector<T> no_skip(nc);
  cpu::layernorm_backward_residual(no_skip.data(), (T*)nullptr, (T*)nullptr, (const T*)nullptr, dln.data(),
                                   res_u.data(), lw.data(), mean_u.data(), rstd_u.data(), n, c);
  EXPECT_TRUE(bitwise_equal(no_skip, tmp)) << "layernorm_backward_residual without dskip";
}

TEST(Fused, SameBitsAsTheUnfusedOps) {
  for (int threads : {1, 3})
    with_threads(threads, [] {
      fused_same_bits_case<float>("fp32");
      fused_same_bits_case<bf16>("bf16");
      fused_same_bits_case<nz::f16>("fp16");
      fused_same_bits_case<double>("fp64");
    });
}

// The stages compare their models bit for bit, yet they hand the kernels different buffers: stage3
// computes on parameters gathered into a buffer of its own, the others on the flat parameter
// buffer. So the products must give the same bits wherever their operands lie in memory, not only
// for the same shapes: here every operand and result is moved by 1 to 7 floats (off the 32-byte
// alignment a vectorized library may prefer), on a shape with partial blocks everywhere, with 1
// and 3 threads.
TEST(Determinism, SameBitsWhereverTheOperandsLie) {
  Rng rng(21);
  const int n = 61, c = 67, oc = 45, B = 2, Tn = 37, C = 48, NH = 3;
  const std::vector<float> inp = random_f32(rng, size_t(n) * c), w = random_f32(rng, size_t(oc) * c);
  const std::vector<float> bias = random_f32(rng, oc), dout = random_f32(rng, size_t(n) * oc);
  const std::vector<float> dw0 = random_f32(rng, w.size()), db0 = random_f32(rng, oc);
  const std::vector<float> qkv = random_f32(rng, size_t(B) * Tn * 3 * C, -2, 2),
                           aout_d = random_f32(rng, size_t(B) * Tn * C);
  // every result, computed with the operands at offset `shift` floats into their buffers
  auto run = [&](int shift) {
    auto at = [shift](const std::vector<float>& v) {
      std::vector<float> buf(v.size() + 8, NAN);
      std::copy(v.begin(), v.end(), buf.begin() + shift);
      return buf;
    };
    std::vector<float> x = at(inp), wv = at(w), bv = at(bias), d = at(dout), dw = at(dw0), db = at(db0);
    std::vector<float> q = at(qkv), ad = at(aout_d);
    std::vector<float> out(size_t(n) * oc + 8), dinp(inp.size() + 8);
    std::vector<float> att(size_t(B) * NH * Tn * Tn + 8), aout(size_t(B) * Tn * C + 8), dqkv(qkv.size() + 8);
    const int s = shift;
    cpu::matmul_forward(out.data() + s, x.data() + s, wv.data() + s, bv.data() + s, n, c, oc);
    cpu::matmul_backward(dinp.data() + s, dw.data() + s, db.data() + s, d.data() + s, x.data() + s,
                         wv.data() + s, n, c, oc);
    cpu::attention_forward(aout.data() + s, att.data() + s, q.data() + s, B, Tn, C, NH);
    cpu::attention_backward(dqkv.data() + s, ad.data() + s, q.data() + s, att.data() + s, aout.data() + s, B, Tn,
                            C, NH);
    std::vector<std::vector<float>> r;
    for (const auto* v : {&out, &dinp, &dw, &db, &att, &aout, &dqkv})
      r.emplace_back(v->begin() + s, v->end() - 8 + s);
    return r;
  };
  const char* names[] = {"matmul out", "matmul dinp", "matmul dw", "matmul dbias", "attention att",
                         "attention out", "attention dqkv"};
  std::vector<std::vector<float>> first;
  with_threads(1, [&] { first = run(0); });
  for (int threads : {1, 3})
    for (int shift = 1; shift < 8; shift++)
      with_threads(threads, [&] {
        const auto r = run(shift);
        for (size_t i = 0; i < r.size(); i++)
          EXPECT_TRUE(bitwise_equal(r[i], first[i])) << names[i] << ", " << threads << " threads, shift " << shift;
      });
}

// bf16 products on the CPU's bf16 instructions (oneDNN), in the three layouts the matmul kernels
// use: against the exact product of the same bf16 operands (in double: every product of two bf16
// values is exact), within the bound of an fp32 sum of K exact products, |err| <= gamma_K sum|a||b|
// with gamma_K = K u / (1 - K u), u = 2^-24 (in any order of summation); and the same bits again on
// a second call. Where this CPU has no bf16 instructions, bf16_gemm must decline and touch nothing.
TEST(Bf16Gemm, HardwareProductsWithinTheFp32SumBound) {
  Rng rng(23);
  const bool hw = nz::cpu::bf16_gemm_available();
  printf("[ bf16   ] bf16 products on this CPU's bf16 instructions: %s\n", hw ? "yes" : "no (widened + sgemm)");
  struct Case { bool ta, tb; int M, N, K; };
  for (const Case cs : {Case{false, true, 69, 80, 96}, Case{false, false, 69, 96, 80}, Case{true, false, 80, 96, 69},
                        Case{false, true, 256, 384, 1536}}) {
    const int M = cs.M, N = cs.N, K = cs.K;
    const int lda = cs.ta ? M : K, ldb = cs.tb ? K : N;  // rows of a and b as stored
    std::vector<bf16> a(size_t(M) * K), b(size_t(K) * N);
    for (auto& x : a) x = nz::f32_to_bf16(float(rng.uniform(-2, 2)));
    for (auto& x : b) x = nz::f32_to_bf16(float(rng.uniform(-2, 2)));
    auto A = [&](int i, int k) { return double(nz::bf16_to_f32(cs.ta ? a[size_t(k) * lda + i] : a[size_t(i) * lda + k])); };
    auto B = [&](int k, int j) { return double(nz::bf16_to_f32(cs.tb ? b[size_t(j) * ldb + k] : b[size_t(k) * ldb + j])); };
    std::vector<float> c(size_t(M) * N, 7.0f), again(size_t(M) * N, 8.0f);
    const bool ran = nz::cpu::bf16_gemm(cs.ta, cs.tb, M, N, K, a.data(), lda, b.data(), ldb, c.data(), N);
    EXPECT_EQ(ran, hw) << "bf16_gemm ran on one shape and not on another";
    if (!ran) {
      for (float x : c) ASSERT_EQ(x, 7.0f) << "bf16_gemm declined but wrote its output";
      continue;
    }
    const double u = 0x1p-24, gamma = K * u / (1 - K * u);
    double worst = 0;
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double exact = 0, mag = 0;
        for (int k = 0; k < K; k++) {
          exact += A(i, k) * B(k, j);
          mag += std::fabs(A(i, k) * B(k, j));
        }
        const double err = std::fabs(double(c[size_t(i) * N + j]) - exact);
        ASSERT_LE(err, gamma * mag) << "(" << i << "," << j << ") of " << M << "x" << N << "x" << K;
        if (mag > 0) worst = std::max(worst, err / (gamma * mag));
      }
    nz::cpu::bf16_gemm(cs.ta, cs.tb, M, N, K, a.data(), lda, b.data(), ldb, again.data(), N);
    EXPECT_EQ(std::memcmp(c.data(), again.data(), c.size() * sizeof(float)), 0) << "not the same bits on a second call";
    printf("[ bf16   ] %c%c %4dx%4dx%4d: worst error %.3f of its bound\n", cs.ta ? 'T' : 'N', cs.tb ? 'T' : 'N', M, N, K, worst);
  }
  if (!hw)
    GTEST_SKIP() << "this CPU has no bf16 instructions oneDNN can use (" << nz::cpu::bf16_gemm_path()
                 << "): the hardware products were not checked here, only that every shape was declined untouched";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Fp16: the CPU conversions (dtype.h: the bit recipe, and f32_to_f16 / f16_to_f32, which use F16C
// where the CPU has it) against two independent references:
//   - a derivation from the definition: an fp16 with bits (s, e, m) is (-1)^s 2^(e-15) (1 + m/1024),
//     or 2^-14 m/1024 when e = 0; rounding to nearest-even is then a search over the sorted
//     positive values, comparing exact distances in double;
//   - the hardware's own conversion (x86 F16C: vcvtps2ph / vcvtph2ps), when the build has it.

namespace {
namespace fp16_ref {
// The value of an fp16 bit pattern, from the definition (NaN for e = 31, m != 0).
double value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m / 1024.0, -14) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1 + m / 1024.0, e - 15);
  return s ? -v : v;
}
// Round-to-nearest-even of a finite or infinite fp32, by search: the positive finite fp16 are
// patterns 0x0000..0x7BFF, increasing with the pattern.
uint16_t round(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(double(x));
  if (a >= 65520.0) return sign | 0x7C00;  // halfway between 65504 and 2^16, or beyond: inf
  uint16_t lo = 0, hi = 0x7BFF;           // the largest pattern whose value is <= a
  while (lo < hi) {
    const uint16_t mid = uint16_t((lo + hi + 1) / 2);
    if (value(mid) <= a) lo = mid;
    else hi = uint16_t(mid - 1);
  }
  if (lo == 0x7BFF) return sign | lo;  // between 65504 and 65520: down
  const double below = a - value(lo), above = value(uint16_t(lo + 1)) - a;
  const uint16_t r = below < above ? lo : above < below ? uint16_t(lo + 1) : (lo & 1) ? uint16_t(lo + 1) : lo;
  return sign | r;
}
}  // namespace fp16_ref

float f32_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The fp32 values where rounding to fp16 is decided: for every pair of neighbouring fp16 values
// (subnormals, normals, and the last finite one against the overflow threshold 65520), the exact
// midpoint and its fp32 neighbours on either side; each fp16 value itself; both signs; and the
// zero/subnormal edge (2^-25, the half of the smallest subnormal).
std::vector<float> fp16_rounding_boundaries() {
  std::vector<float> xs;
  auto add3 = [&](float m) {
    xs.push_back(m);
    xs.push_back(std::nextafter(m, 0.0f));
    xs.push_back(std::nextafter(m, INFINITY));
  };
  for (uint32_t h = 0; h < 0x7BFF; h++) {
    const double a = fp16_ref::value(uint16_t(h)), b = fp16_ref::value(uint16_t(h + 1));
    add3(float((a + b) / 2));  // exact: 12 significant bits
    add3(float(a));
  }
  add3(65504.0f);
  add3(65520.0f);
  add3(0x1p-25f);
  xs.push_back(std::numeric_limits<float>::max());
  xs.push_back(INFINITY);
  xs.push_back(std::numeric_limits<float>::denorm_min());
  const size_t n = xs.size();
  for (size_t i = 0; i < n; i++) xs.push_back(-xs[i]);
  return xs;
}
}  // namespace

TEST(Fp16, WideningIsExactForAll65536Values) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const float got = nz::f16_to_f32(nz::f16{uint16_t(h)}), soft = nz::f16_to_f32_soft(nz::f16{uint16_t(h)});
    const double want = fp16_ref::value(uint16_t(h));
    if (std::isnan(want)) {
      mismatches += !std::isnan(got) + !std::isnan(soft);
      continue;
    }
    mismatches += double(got) != want || std::signbit(got) != std::signbit(want);
    mismatches += bits_of_f32(soft) != bits_of_f32(got);
#if defined(HARDWARE_FP16)
    mismatches += bits_of_f32(got) != bits_of_f32(hardware_f16_to_f32(uint16_t(h)));  // the hardware agrees
#endif
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp16, RoundTripOfAll65536Values) {
  // every fp16 survives fp16 -> fp32 -> fp16 unchanged; NaNs stay NaN (quiet)
  std::vector<nz::f16> all(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i].bits = uint16_t(i);
  std::vector<float> f(all.size());
  cpu::cast(f.data(), all.data(), all.size());
  std::vector<nz::f16> back(all.size());
  cpu::cast(back.data(), f.data(), f.size());
  int mismatches = 0, nans = 0;
  for (uint32_t i = 0; i < 65536; i++) {
    if (std::isnan(f[i])) {
      nans++;
      mismatches += (back[i].bits & 0x7C00) != 0x7C00 || (back[i].bits & 0x3FF) == 0;
      continue;
    }
    mismatches += back[i].bits != all[i].bits;
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp16, RoundsToNearestEvenAtEveryBoundary) {
  const std::vector<float> xs = fp16_rounding_boundaries();
  ASSERT_GT(xs.size(), 6u * 0x7BFF);
  int mismatches = 0, hardware_mismatches = 0;
  for (float x : xs) {
    const uint16_t got = nz::f32_to_f16(x).bits, soft = nz::f32_to_f16_soft(x).bits, want = fp16_ref::round(x);
    if ((got != want || soft != want) && mismatches++ < 5)
      ADD_FAILURE() << "fp32 " << x << " (0x" << std::hex << bits_of_f32(x) << "): got 0x" << got << " (bit recipe 0x"
                    << soft << "), want 0x" << want;
#if defined(HARDWARE_FP16)
    hardware_mismatches += got != hardware_f32_to_f16(x);
#endif
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(hardware_mismatches, 0);
  // and a few by hand, to read
  EXPECT_EQ(nz::f32_to_f16(1.0f).bits, 0x3C00);
  EXPECT_EQ(nz::f32_to_f16(1.0f + 0x1p-11f).bits, 0x3C00);              // halfway, 0x3C00 even: down
  EXPECT_EQ(nz::f32_to_f16(1.0f + 3 * 0x1p-11f).bits, 0x3C02);          // halfway, 0x3C01 odd: up
  EXPECT_EQ(nz::f32_to_f16(65504.0f).bits, 0x7BFF);                     // the largest finite
  EXPECT_EQ(nz::f32_to_f16(65519.996f).bits, 0x7BFF);                   // just below halfway to 2^16
  EXPECT_EQ(nz::f32_to_f16(65520.0f).bits, 0x7C00);                     // halfway: to even, i.e. inf
  EXPECT_EQ(nz::f32_to_f16(0x1p-24f).bits, 0x0001);                     // the smallest subnormal
  EXPECT_EQ(nz::f32_to_f16(0x1p-25f).bits, 0x0000);                     // half of it: to even zero
  EXPECT_EQ(nz::f32_to_f16(std::nextafter(0x1p-25f, 1.0f)).bits, 0x0001);
  EXPECT_EQ(nz::f32_to_f16(-0.0f).bits, 0x8000);
}

TEST(Fp16, RandomValuesAgreeWithTheReferences) {
  Rng rng(19);
  int mismatches = 0;
  for (int i = 0; i < 200000; i++) {  // random bit patterns: every exponent, NaNs skipped
    const float x = f32_of_bits(uint32_t(rng.next() >> 32));
    if (std::isnan(x)) continue;
    mismatches += nz::f32_to_f16(x).bits != fp16_ref::round(x);
    mismatches += nz::f32_to_f16_soft(x).bits != fp16_ref::round(x);
#if defined(HARDWARE_FP16)
    mismatches += nz::f32_to_f16_soft(x).bits != hardware_f32_to_f16(x);
#endif
  }
  EXPECT_EQ(mismatches, 0);
  // NaN in, NaN out (quiet), whatever the payload
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7FA00000u}) {
    EXPECT_EQ(nz::f32_to_f16(f32_of_bits(u)).bits & 0x7E00, 0x7E00) << std::hex << u;
    EXPECT_EQ(nz::f32_to_f16_soft(f32_of_bits(u)).bits & 0x7E00, 0x7E00) << std::hex << u;
  }
}
