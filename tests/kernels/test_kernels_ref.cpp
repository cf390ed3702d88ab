// test_kernels_ref.cpp — the fast CPU kernels (nz::cpu, kernels_cpu.cpp) against the textbook loops
// (nz::ref, kernels_ref.cpp): every kernel, fp32 and bf16, on shapes that leave partial blocks.
//
// Where the two sum the same terms in the same order they must give the same bits. Where they do
// not (the matrix products through the BLAS, the exp inside the softmaxes and GELU, the lanes of
// sum_squares) every element must lie within a bound derived from the unit roundoff, the number of
// terms and the exp's stated error; each derivation is written above the check that uses it. Each check prints the largest
// difference it saw.
//
// Notation. u = 2^-24 (fp32 unit roundoff); gamma_n(k) = k u / (1 - k u) bounds k roundings
// together: a product of k factors (1 + d)^(+-1), |d| <= u, lies within 1 +- gamma_n(k).
#include <gtest/gtest.h>  // TEST, EXPECT_*, ADD_FAILURE

#include <algorithm>    // std::max, std::min
#include <cmath>        // std::exp, std::log, std::log1p, std::fabs
#include <cstdint>      // uint32_t, uint64_t
#include <cstdio>       // printf
#include <cstring>      // std::memcmp
#include <string>       // the names of the checks
#include <type_traits>  // std::is_same_v
#include <vector>

#include "kernels/dtype.h"    // bf16, load, store, acc_t
#include "kernels/kernels.h"  // nz::cpu::*, nz::ref::*
#include "runtime/rng.h"      // nz::Rng

namespace {

using nz::bf16;
using nz::load;
using nz::store;
namespace cpu = nz::cpu;
namespace ref = nz::ref;

// ---------------------------------------------------------------------------------------------
// rounding constants

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
double gamma_n(int k) { return k * kU / (1 - k * kU); }

// The exps. nz::cpu's float exp is stated (kernels_cpu.cpp, exp_vec) to be within 2 ulp of the
// true value, i.e. a relative error of at most 2 * 2^-23; nz::ref calls the C library's expf and
// logf, within 1 ulp (glibc's documented bound), i.e. 2^-23. RefExp.StatedErrorsHold measures
// all three against std::exp / std::log in double.
constexpr double kExpFast = 0x1p-22;
constexpr double kLibm = 0x1p-23;
// The two exps of the same float argument a then differ by a relative
//   |e_fast / e_ref - 1| <= (kExpFast + kLibm) / (1 - kLibm) = eta.
const double kEta = (kExpFast + kLibm) / (1 - kLibm);

// Rounding to the storage type T: none for fp32 (the outputs are the fp32 values), 2^-8 for bf16.
template <class T>
constexpr double storage_roundoff() {
  return std::is_same_v<T, bf16> ? 0x1p-8 : 0.0;
}
template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, bf16> ? "bf16" : "fp64";
}

// If the fp32 values of the two kernels differ by at most d, the stored values R = y (1 + r),
// |r| <= uT, differ by at most d + uT (|y_fast| + |y_ref|) <= d + uT / (1 - uT) (|R_fast| + |R_ref|).
double stored_bound(double d, double r_fast, double r_ref, double uT) {
  return d + uT / (1 - uT) * (std::fabs(r_fast) + std::fabs(r_ref));
}

// ---------------------------------------------------------------------------------------------
// inputs and shapes

template <class T>
double val(T x) {
  return double(load(x));
}

// n values uniform in [lo, hi), rounded to T: both kernels read exactly the same inputs.
template <class T>
std::vector<T> random_t(nz::Rng& rng, size_t n, double lo, double hi) {
  std::vector<T> v(n);
  for (T& x : v) x = store<T>(lo + (hi - lo) * double(rng.uniform()));
  return v;
}

std::vector<int> random_ints(nz::Rng& rng, size_t n, int below) {
  std::vector<int> v(n);
  for (int& x : v) x = int(rng.next() % uint64_t(below));
  return v;
}

// Odd sizes everywhere (no multiple of a BLAS's blocks or of attention's 32-row blocks but T = 33,
// one full block and a row), odd channel counts, T of every kind.
struct Shape {
  int B, T, C, NH, OC, V;
  int N() const { return B * T; }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH) + " OC=" + std::to_string(OC) + " V=" + std::to_string(V);
  }
};
const Shape kShapes[] = {
    {1, 1, 3, 1, 1, 2},       // one of everything
    {2, 7, 15, 3, 17, 19},    // head size 5, every tile partial
    {3, 23, 51, 3, 37, 61},   // head size 17: one full 16-wide tile and a column of 1
    {1, 33, 99, 9, 65, 257},  // 8 full row tiles and a row of 1; OC = 4 full tiles + 1
};

// ---------------------------------------------------------------------------------------------
// comparisons

// One comparison (a kernel's output, in one type) over all shapes: fails on the first element out
// of bounds in each call; print() says how it went, with the largest difference seen.
class Check {
 public:
  Check(std::string what, const char* type) : what_(what + " " + type) {}
  void print() const {
    if (bitwise_)
      printf("[   ref    ] %-34s bitwise equal          (%zu elements)\n", what_.c_str(), elems_);
    else
      printf("[   ref    ] %-34s max |diff| %.2e = %.2g of its bound (%zu elements)\n", what_.c_str(),
             max_diff_, max_ratio_, elems_);
  }

  template <class T>
  void same_bits(const std::vector<T>& fast, const std::vector<T>& want, const std::string& where) {
    ASSERT_EQ(fast.size(), want.size()) << what_;
    elems_ += fast.size();
    for (size_t i = 0; i < fast.size(); i++) {
      if (std::memcmp(&fast[i], &want[i], sizeof(T)) == 0) continue;
      ADD_FAILURE() << what_ << " (" << where << "): element " << i << " is " << val(fast[i])
                    << " in nz::cpu, " << val(want[i]) << " in nz::ref (bitwise equality expected)";
      return;
    }
  }

  // |fast[i] - want[i]| <= bound(i, fast[i], want[i]) for every i
  template <class T, class Bound>
  void within(const std::vector<T>& fast, const std::vector<T>& want, const std::string& where, Bound bound) {
    ASSERT_EQ(fast.size(), want.size()) << what_;
    bitwise_ = false;
    elems_ += fast.size();
    bool failed = false;
    for (size_t i = 0; i < fast.size(); i++) {
      const double f = val(fast[i]), r = val(want[i]);
      const double diff = std::fabs(f - r), allowed = bound(i, f, r);
      max_diff_ = std::max(max_diff_, diff);
      if (allowed > 0) max_ratio_ = std::max(max_ratio_, diff / allowed);
      if (!(diff <= allowed) && !failed) {
        ADD_FAILURE() << what_ << " (" << where << "): element " << i << " is " << f << " in nz::cpu, " << r
                      << " in nz::ref; |diff| " << diff << " > bound " << allowed;
        failed = true;
      }
    }
  }

 private:
  std::string what_;
  bool bitwise_ = true;
  size_t elems_ = 0;
  double max_diff_ = 0.0, max_ratio_ = 0.0;
};

// ---------------------------------------------------------------------------------------------
// The exps' stated errors, measured against double precision. nz::cpu's exp is private to
// kernels_cpu.cpp, so it is read back through two kernels, with the roundings in between known:
//  - exp(a), a <= 0: softmax of the row [0, a] (exp(0) = 1 exactly) gives p0 = fl(1/s) and
//    p1 = fl(e fl(1/s)), so p1 / p0 = e (1 + d), |d| <= u: at most u added to the error;
//  - exp(a), a > 0 (GELU of x < 0, whose argument a = -2 s (x + k x^3) is recomputed here with the
//    kernel's float operations): y = fl(x fl(1 / fl(1 + e))), so x / y - 1 = e + (1 + e) theta,
//    |theta| <= gamma_n(3): at most gamma_n(3) (1 + e) / e added.
// Plus 2^-50 for the double arithmetic of the read-back.

const float kGeluS = float(0.7978845608028654), kGeluK = float(0.044715);  // as the kernels' A(...)
float gelu_exp_arg(float x) { return -2.0f * (kGeluS * (x + kGeluK * x * x * x)); }

TEST(RefExp, StatedErrorsHold) {
  nz::Rng rng(1);
  const int n = 20000;
  double fast_neg = 0.0, fast_pos = 0.0, libm_exp = 0.0, libm_log = 0.0;
  // a in [-86, 0]: all results normal floats
  std::vector<float> logits(2 * size_t(n)), probs(2 * size_t(n)), losses(n);
  for (int i = 0; i < n; i++) logits[2 * i + 1] = -86.0f * rng.uniform();
  const std::vector<int> zeros(n, 0);
  cpu::softmax_xent_forward(losses.data(), probs.data(), logits.data(), zeros.data(), n, 2);
  for (int i = 0; i < n; i++) {
    const double e = double(probs[2 * i + 1]) / probs[2 * i], want = std::exp(double(logits[2 * i + 1]));
    fast_neg = std::max(fast_neg, std::fabs(e / want - 1));
    EXPECT_LE(std::fabs(e / want - 1), kExpFast + kU + 0x1p-50) << "exp(" << logits[2 * i + 1] << ")";
  }
  // a in [3, 86] (x in [-9.9, -1.5])
  std::vector<float> x(n), y(n);
  for (float& xi : x) xi = -1.5f - 8.4f * rng.uniform();
  cpu::gelu_forward(y.data(), x.data(), n);
  for (int i = 0; i < n; i++) {
    const double a = gelu_exp_arg(x[i]);
    if (a < 3 || a > 86) continue;
    const double e = double(x[i]) / y[i] - 1, want = std::exp(a);
    fast_pos = std::max(fast_pos, std::fabs(e / want - 1));
    EXPECT_LE(std::fabs(e / want - 1), kExpFast + gamma_n(3) * (1 + want) / want + 0x1p-50)
        << "exp(" << a << ")";
  }
  // the library's expf on [-86, 86] and logf on [1, 600] (the sums of a softmax row)
  for (int i = 0; i < n; i++) {
    const float a = -86.0f + 172.0f * rng.uniform(), s = 1.0f + 599.0f * rng.uniform();
    libm_exp = std::max(libm_exp, std::fabs(std::exp(a) / std::exp(double(a)) - 1));
    if (s > 1.0f) libm_log = std::max(libm_log, std::fabs(std::log(s) / std::log(double(s)) - 1));
  }
  EXPECT_LE(libm_exp, kLibm);
  EXPECT_LE(libm_log, kLibm);
  printf("[   ref    ] max relative error: nz::cpu exp %.2e (a <= 0), %.2e (a > 0), stated %.2e\n", fast_neg,
         fast_pos, kExpFast);
  printf("[   ref    ] max relative error: expf %.2e, logf %.2e, stated %.2e\n", libm_exp, libm_log, kLibm);
}

// ---------------------------------------------------------------------------------------------
// Kernels whose every sum has the same terms in the same order: bitwise equal.
// The accumulating gradients start from random values (so that += is tested), the overwritten
// ones from NaN in both (so that a skipped element shows).

template <class T>
std::vector<T> nans(size_t n) {
  return std::vector<T>(n, store<T>(double(NAN)));
}

template <class T>
void embedding_case() {
  Check fwd("embedding_forward", type_name<T>()), dwte_c("embedding_backward dwte", type_name<T>()),
      dwpe_c("embedding_backward dwpe", type_name<T>());
  nz::Rng rng(2);
  for (const Shape& s : kShapes) {
    const int V = std::max(2, s.V / 4);  // few tokens, so that they repeat
    const std::vector<int> tokens = random_ints(rng, s.N(), V);
    const auto wte = random_t<T>(rng, size_t(V) * s.C, -1, 1),
               wpe = random_t<T>(rng, size_t(s.T) * s.C, -1, 1);
    std::vector<T> out_f = nans<T>(size_t(s.N()) * s.C), out_r = out_f;
    cpu::embedding_forward(out_f.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    ref::embedding_forward(out_r.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    fwd.same_bits(out_f, out_r, s.str());
    const auto dout = random_t<T>(rng, out_f.size(), -1, 1);
    std::vector<T> dwte_f = random_t<T>(rng, wte.size(), -1, 1), dwte_r = dwte_f;
    std::vector<T> dwpe_f = random_t<T>(rng, wpe.size(), -1, 1), dwpe_r = dwpe_f;
    cpu::embedding_backward(dwte_f.data(), dwpe_f.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    ref::embedding_backward(dwte_r.data(), dwpe_r.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    dwte_c.same_bits(dwte_f, dwte_r, s.str());
    dwpe_c.same_bits(dwpe_f, dwpe_r, s.str());
  }
  for (const Check* c : {&fwd, &dwte_c, &dwpe_c}) c->print();
}
TEST(FastVsRef, Embedding) {
  embedding_case<float>();
  embedding_case<bf16>();
}

template <class T>
void layernorm_case() {
  using A = nz::acc_t<T>;
  Check fwd("layernorm_forward", type_name<T>()), stats("layernorm_forward mean,rstd", type_name<T>()),
      dinp_c("layernorm_backward dinp", type_name<T>()), dw_c("layernorm_backward dw", type_name<T>()),
      db_c("layernorm_backward db", type_name<T>());
  nz::Rng rng(3);
  for (const Shape& s : kShapes) {
    const int N = s.N(), C = s.C;
    std::vector<T> inp(size_t(N) * C);  // rows with different offsets and spreads
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++)
        inp[size_t(n) * C + c] = store<T>(0.3 * n - 2 + (0.5 + 0.1 * n) * (2 * rng.uniform() - 1));
    const auto w = random_t<T>(rng, C, 0.5, 1.5), b = random_t<T>(rng, C, -1, 1),
               dout = random_t<T>(rng, inp.size(), -1, 1);
    for (const T* bias : {b.data(), static_cast<const T*>(nullptr)}) {
      std::vector<T> out_f = nans<T>(inp.size()), out_r = out_f;
      std::vector<A> mean_f(N), rstd_f(N), mean_r(N), rstd_r(N);
      cpu::layernorm_forward(out_f.data(), mean_f.data(), rstd_f.data(), inp.data(), w.data(), bias, N, C);
      ref::layernorm_forward(out_r.data(), mean_r.data(), rstd_r.data(), inp.data(), w.data(), bias, N, C);
      fwd.same_bits(out_f, out_r, s.str());
      stats.same_bits(mean_f, mean_r, s.str());
      stats.same_bits(rstd_f, rstd_r, s.str());
      std::vector<T> dinp_f = nans<T>(inp.size()), dinp_r = dinp_f;
      std::vector<T> dw_f = random_t<T>(rng, C, -1, 1), dw_r = dw_f, db_f = random_t<T>(rng, C, -1, 1),
                     db_r = db_f;
      T* db_fast = bias ? db_f.data() : nullptr;  // and once without db
      T* db_ref = bias ? db_r.data() : nullptr;
      cpu::layernorm_backward(dinp_f.data(), dw_f.data(), db_fast, dout.data(), inp.data(), w.data(),
                              mean_r.data(), rstd_r.data(), N, C);
      ref::layernorm_backward(dinp_r.data(), dw_r.data(), db_ref, dout.data(), inp.data(), w.data(),
                              mean_r.data(), rstd_r.data(), N, C);
      dinp_c.same_bits(dinp_f, dinp_r, s.str());
      dw_c.same_bits(dw_f, dw_r, s.str());
      db_c.same_bits(db_f, db_r, s.str());
    }
  }
  for (const Check* c : {&fwd, &stats, &dinp_c, &dw_c, &db_c}) c->print();
}
TEST(FastVsRef, LayerNorm) {
  layernorm_case<float>();
  layernorm_case<bf16>();
}

// Matmul. The BLAS sums each element's terms in its own order (blocked, vectorized, perhaps with
// fused multiply-adds), nz::ref in the plain order k = 0, 1, ... Any order of summing n products,
// plus one more addition (the bias, or the old gradient), passes each product through at most
// n + 1 roundings: the computed value is within gamma_n(n + 1) sum|terms| of the exact one (a fused
// multiply-add only rounds less). Both kernels are, so
//   out:  |fast - ref| <= 2 gamma_n(C + 1)  (sum_k |inp[n,k] w[o,k]| + |bias[o]|)
//   dinp: |fast - ref| <= 2 gamma_n(OC)      sum_o |dout[n,o] w[o,k]|
//   dw:   |fast - ref| <= 2 gamma_n(N + 1)  (sum_n |dout[n,o] inp[n,k]| + |dw_before[o,k]|)
// in fp32 arithmetic (bf16 operands are widened exactly), and stored_bound() adds bf16's final
// rounding. dbias is the same loop in both: bitwise.
template <class T>
void matmul_case() {
  Check fwd("matmul_forward", type_name<T>()), dinp_c("matmul_backward dinp", type_name<T>()),
      dw_c("matmul_backward dw", type_name<T>()), db_c("matmul_backward dbias", type_name<T>());
  constexpr double uT = storage_roundoff<T>();
  nz::Rng rng(4);
  for (const Shape& s : kShapes) {
    const int N = s.N(), C = s.C, OC = s.OC;
    const auto inp = random_t<T>(rng, size_t(N) * C, -2, 2), w = random_t<T>(rng, size_t(OC) * C, -1, 1);
    const auto bias = random_t<T>(rng, OC, -1, 1), dout = random_t<T>(rng, size_t(N) * OC, -1, 1);
    for (bool with_all : {true, false}) {  // false: null bias, dinp and dbias
      std::vector<T> out_f = nans<T>(size_t(N) * OC), out_r = out_f;
      cpu::matmul_forward(out_f.data(), inp.data(), w.data(), with_all ? bias.data() : nullptr, N, C, OC);
      ref::matmul_forward(out_r.data(), inp.data(), w.data(), with_all ? bias.data() : nullptr, N, C, OC);
      fwd.within(out_f, out_r, s.str(), [&](size_t i, double f, double r) {
        const int n = int(i / OC), o = int(i % OC);
        double mag = with_all ? std::fabs(val(bias[o])) : 0.0;
        for (int k = 0; k < C; k++) mag += std::fabs(val(inp[size_t(n) * C + k]) * val(w[size_t(o) * C + k]));
        return stored_bound(2 * gamma_n(C + 1) * mag, f, r, uT);
      });
      std::vector<T> dinp_f = nans<T>(inp.size()), dinp_r = dinp_f;
      const std::vector<T> dw0 = random_t<T>(rng, w.size(), -1, 1);
      std::vector<T> dw_f = dw0, dw_r = dw0, db_f = random_t<T>(rng, OC, -1, 1), db_r = db_f;
      cpu::matmul_backward(with_all ? dinp_f.data() : nullptr, dw_f.data(), with_all ? db_f.data() : nullptr,
                           dout.data(), inp.data(), w.data(), N, C, OC);
      ref::matmul_backward(with_all ? dinp_r.data() : nullptr, dw_r.data(), with_all ? db_r.data() : nullptr,
                           dout.data(), inp.data(), w.data(), N, C, OC);
      if (with_all)  // (else both left it alone: NaN)
        dinp_c.within(dinp_f, dinp_r, s.str(), [&](size_t i, double f, double r) {
          const int n = int(i / C), k = int(i % C);
          double mag = 0.0;
          for (int o = 0; o < OC; o++) mag += std::fabs(val(dout[size_t(n) * OC + o]) * val(w[size_t(o) * C + k]));
          return stored_bound(2 * gamma_n(OC) * mag, f, r, uT);
        });
      dw_c.within(dw_f, dw_r, s.str(), [&](size_t i, double f, double r) {
        const int o = int(i / C), k = int(i % C);
        double mag = std::fabs(val(dw0[i]));
        for (int n = 0; n < N; n++) mag += std::fabs(val(dout[size_t(n) * OC + o]) * val(inp[size_t(n) * C + k]));
        return stored_bound(2 * gamma_n(N + 1) * mag, f, r, uT);
      });
      db_c.same_bits(db_f, db_r, s.str());
    }
  }
  for (const Check* c : {&fwd, &dinp_c, &dw_c, &db_c}) c->print();
}
TEST(FastVsRef, Matmul) {
  matmul_case<float>();
  matmul_case<bf16>();
}

template <class T>
void elementwise_case() {
  Check res("residual_forward", type_name<T>()), xent_b("softmax_xent_backward", type_name<T>()),
      acc1("accumulate first", type_name<T>()), acc2("accumulate", type_name<T>()),
      adam("adamw_update p,m,v", type_name<T>());
  nz::Rng rng(5);
  for (const Shape& s : kShapes) {
    const size_t n = size_t(s.N()) * s.V;
    const auto a = random_t<T>(rng, n, -1, 1), b = random_t<T>(rng, n, -1, 1);
    std::vector<T> out_f = nans<T>(n), out_r = out_f;
    cpu::residual_forward(out_f.data(), a.data(), b.data(), n);
    ref::residual_forward(out_r.data(), a.data(), b.data(), n);
    res.same_bits(out_f, out_r, s.str());

    const auto probs = random_t<T>(rng, n, 0, 1);
    const std::vector<int> targets = random_ints(rng, s.N(), s.V);
    std::vector<T> d_f = nans<T>(n), d_r = d_f;
    cpu::softmax_xent_backward(d_f.data(), probs.data(), targets.data(), 1.0f / s.N(), s.N(), s.V);
    ref::softmax_xent_backward(d_r.data(), probs.data(), targets.data(), 1.0f / s.N(), s.N(), s.V);
    xent_b.same_bits(d_f, d_r, s.str());

    std::vector<T> g_f = nans<T>(n), g_r = g_f;
    cpu::accumulate(g_f.data(), a.data(), n, 0.37f, true);
    ref::accumulate(g_r.data(), a.data(), n, 0.37f, true);
    acc1.same_bits(g_f, g_r, s.str());
    cpu::accumulate(g_f.data(), b.data(), n, 0.37f, false);
    ref::accumulate(g_r.data(), b.data(), n, 0.37f, false);
    acc2.same_bits(g_f, g_r, s.str());

    // two steps (t = 1, then t = 9), with decay and a clipping scale
    std::vector<float> p_f(n), m_f(n), v_f(n);
    for (size_t i = 0; i < n; i++) {
      p_f[i] = 2 * rng.uniform() - 1;
      m_f[i] = 0.1f * (2 * rng.uniform() - 1);
      v_f[i] = 0.01f * rng.uniform();
    }
    std::vector<float> p_r = p_f, m_r = m_f, v_r = v_f;
    for (int t : {1, 9}) {
      cpu::adamw_update(p_f.data(), m_f.data(), v_f.data(), a.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                        0.7f, t);
      ref::adamw_update(p_r.data(), m_r.data(), v_r.data(), a.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                        0.7f, t);
      adam.same_bits(p_f, p_r, s.str() + " p");
      adam.same_bits(m_f, m_r, s.str() + " m");
      adam.same_bits(v_f, v_r, s.str() + " v");
    }
  }
  for (const Check* c : {&res, &xent_b, &acc1, &acc2, &adam}) c->print();
}
TEST(FastVsRef, ElementwiseAndOptimizer) {
  elementwise_case<float>();
  elementwise_case<bf16>();
}

// Every cast, on random values and the awkward ones: signed zeros, infinities, NaN, subnormals,
// exact ties of the bf16 rounding (to even, up and down), the largest float (rounds to inf).
TEST(FastVsRef, Cast) {
  nz::Rng rng(6);
  std::vector<float> f = random_t<float>(rng, 1001, -3, 3);
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-45f, 3.0e38f, 3.4028235e38f})
    f.push_back(x);
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80c000u}) {
    float x;
    std::memcpy(&x, &bits, 4);
    f.push_back(x);
  }
  auto check = [](const auto& fast, const auto& want, const char* what) {
    Check c(what, "");
    c.same_bits(fast, want, "");
    c.print();
  };
  const size_t n = f.size();
  std::vector<bf16> h_f(n), h_r(n);
  cpu::cast(h_f.data(), f.data(), n);
  ref::cast(h_r.data(), f.data(), n);
  check(h_f, h_r, "cast fp32 -> bf16");
  std::vector<float> f_f(n), f_r(n);
  cpu::cast(f_f.data(), h_r.data(), n);
  ref::cast(f_r.data(), h_r.data(), n);
  check(f_f, f_r, "cast bf16 -> fp32");
  cpu::cast(f_f.data(), f.data(), n);
  ref::cast(f_r.data(), f.data(), n);
  check(f_f, f_r, "cast fp32 -> fp32");
  std::vector<bf16> hh_f(n), hh_r(n);
  cpu::cast(hh_f.data(), h_r.data(), n);
  ref::cast(hh_r.data(), h_r.data(), n);
  check(hh_f, hh_r, "cast bf16 -> bf16");
  const std::vector<double> d(f.begin(), f.end());
  std::vector<double> d_f(n), d_r(n);
  cpu::cast(d_f.data(), d.data(), n);
  ref::cast(d_r.data(), d.data(), n);
  check(d_f, d_r, "cast fp64 -> fp64");
}

// ---------------------------------------------------------------------------------------------
// Attention. Both kernels compute the same functions; the products sum in different orders (the
// BLAS against the plain loops) and the exps differ. With u the unit roundoff of the arithmetic
// (2^-24 in fp32 and bf16, 2^-53 in fp64) and gamma(k) = k u / (1 - k u), per kernel:
//
// Forward, row t, L = t + 1 visible positions, s_j the exact scaled scores (the float scale is the
// same number in both kernels):
//  - each computed score is within sigma_j = gamma(hs + 1) scale sum_i |q_i k_ji| of s_j (hs
//    products summed, then scaled);
//  - its exp's argument a_j = fl(s^_j - max) is off by at most u |s^_j - max| <= u (m - s_j + 2 sigma),
//    m = max_j s_j, sigma = max_j sigma_j; the exp itself has relative error E (kExpFast or kLibm);
//  - so e^_j = exp(s_j) * c * theta_j, c the same for the whole row (exp(-max)), with
//    |log theta_j| <= lambda_j = sigma_j + u (m - s_j + 2 sigma) - log(1 - E);
//  - the normalized e^_j / sum e^ is p_j times a factor within exp(+-2 Lambda), Lambda = max_j
//    lambda_j, and the sum, division and product add gamma(L + 1) (as before):
//      |p^_j / p_j - 1| <= beta = exp(2 Lambda) (1 + gamma(L + 1)) - 1.
//    Between the kernels: |p^_fast - p^_ref| <= (beta_fast + beta_ref) p_j, p_j <= p^_ref / (1 - beta_ref).
//  - out = sum_j p^_j v_j over L terms (the masked zeros add exactly nothing): within
//    (beta + gamma(L) (1 + beta)) sum_j p_j |v_j| of the exact sum_j p_j v_j.
//
// Backward, from the same saved att P (an input to both): every result is a sum of products of
// inputs, through at most m roundings on any path, so it is within gamma(m) times the same
// expression evaluated on absolute values ("~"), in any summation order:
//   dP = dO V^T         ~: sum_i |dO_ti| |V_ji|                        hs roundings
//   c_t = sum_j P dP    ~: sum_j P_tj dP~_tj                           hs + L
//   dS = P (dP - c) sc  ~: P_tj (dP~_tj + c~_t) sc                     hs + L + 3
//   dQ = dS K, dK = dS^T Q   (~ with |K|, |Q|)                          <= hs + 2T + 3
//   dV = P^T dO              (~ with |dO|)                             <= T
// so |fast - ref| <= 2 gamma(hs + 2T + 3) * ~ for dQ and dK, 2 gamma(T) * ~ for dV.
// stored_bound() adds bf16's rounding of each stored result.
template <class T>
void attention_case() {
  using A = nz::acc_t<T>;
  Check att_c("attention_forward att", type_name<T>()), out_c("attention_forward out", type_name<T>()),
      back("attention_backward dqkv", type_name<T>());
  constexpr double uT = storage_roundoff<T>();
  constexpr bool fp64 = std::is_same_v<A, double>;
  const double u = fp64 ? 0x1p-53 : kU;
  auto gamma = [u](int k) { return k * u / (1 - k * u); };
  const double e_fast = fp64 ? 0x1p-52 : kExpFast, e_ref = fp64 ? 0x1p-52 : kLibm;  // std::exp: 1 ulp
  nz::Rng rng(7);
  for (const Shape& s : kShapes) {
    const int B = s.B, Tn = s.T, C = s.C, NH = s.NH, hs = C / NH;
    const double scale = double(A(1) / std::sqrt(A(hs)));
    // scores up to 9 sqrt(hs) ~ 37: the softmax is nearly one-hot in places, exp's arguments >= -75
    const auto qkv = random_t<T>(rng, size_t(B) * Tn * 3 * C, -3, 3);
    auto Q = [&](int b, int t, int part, int h, int i) {
      return val(qkv[(size_t(b) * Tn + t) * 3 * C + size_t(part) * C + size_t(h) * hs + i]);
    };
    std::vector<T> out_f = nans<T>(size_t(B) * Tn * C), out_r = out_f;
    std::vector<T> att_f = nans<T>(size_t(B) * NH * Tn * Tn), att_r = att_f;
    cpu::attention_forward(out_f.data(), att_f.data(), qkv.data(), B, Tn, C, NH);
    ref::attention_forward(out_r.data(), att_r.data(), qkv.data(), B, Tn, C, NH);
    // beta_fast and beta_ref of every row (b, h, t), from the scores in double
    std::vector<double> beta_f(size_t(B) * NH * Tn), beta_r(beta_f.size());
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++)
        for (int t = 0; t < Tn; t++) {
          std::vector<double> sc(t + 1), sig(t + 1);
          for (int j = 0; j <= t; j++) {
            double dot = 0, mag = 0;
            for (int i = 0; i < hs; i++) {
              dot += Q(b, t, 0, h, i) * Q(b, j, 1, h, i);
              mag += std::fabs(Q(b, t, 0, h, i) * Q(b, j, 1, h, i));
            }
            sc[j] = dot * scale;
            sig[j] = gamma(hs + 1) * scale * mag * (1 + 0x1p-40);  // (slack for this double arithmetic)
          }
          const double m = *std::max_element(sc.begin(), sc.end());
          const double sigma = *std::max_element(sig.begin(), sig.end());
          double lam = 0;  // Lambda without the exp's own error
          for (int j = 0; j <= t; j++) lam = std::max(lam, sig[j] + u * (m - sc[j] + 2 * sigma));
          const size_t row = (size_t(b) * NH + h) * Tn + t;
          beta_f[row] = std::exp(2 * (lam - std::log1p(-e_fast))) * (1 + gamma(t + 2)) - 1;
          beta_r[row] = std::exp(2 * (lam - std::log1p(-e_ref))) * (1 + gamma(t + 2)) - 1;
        }
    att_c.within(att_f, att_r, s.str(), [&](size_t i, double f, double r) {
      const size_t row = i / Tn;
      const double bf = beta_f[row], br = beta_r[row];
      return stored_bound((bf + br) * std::fabs(r) / (1 - uT) / (1 - br), f, r, uT);
    });
    out_c.within(out_f, out_r, s.str(), [&](size_t i, double f, double r) {
      const int b = int(i / (size_t(Tn) * C)), t = int(i / C % Tn), h = int(i % C) / hs, j = int(i % C) % hs;
      const size_t row = (size_t(b) * NH + h) * Tn + t;
      const double bf = beta_f[row], br = beta_r[row];
      double pv = 0.0;  // sum_t2 p[t2] |v[t2,j]|, p from the ref's att
      for (int t2 = 0; t2 <= t; t2++)
        pv += val(att_r[row * Tn + t2]) / (1 - uT) / (1 - br) * std::fabs(Q(b, t2, 2, h, j));
      return stored_bound((bf + br + gamma(t + 1) * (2 + bf + br)) * pv, f, r, uT);
    });

    const auto dout = random_t<T>(rng, out_r.size(), -1, 1);
    std::vector<T> dqkv_f = nans<T>(qkv.size()), dqkv_r = dqkv_f;
    cpu::attention_backward(dqkv_f.data(), dout.data(), qkv.data(), att_r.data(), out_r.data(), B, Tn, C, NH);
    ref::attention_backward(dqkv_r.data(), dout.data(), qkv.data(), att_r.data(), out_r.data(), B, Tn, C, NH);
    // the absolute-value evaluation "~" of every element of dqkv
    std::vector<double> mag(qkv.size(), 0.0);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++) {
        auto P = [&](int t, int j) { return val(att_r[((size_t(b) * NH + h) * Tn + t) * Tn + j]); };
        auto dO = [&](int t, int i) { return std::fabs(val(dout[(size_t(b) * Tn + t) * C + size_t(h) * hs + i])); };
        std::vector<double> ds(size_t(Tn) * Tn, 0.0);  // dS~
        for (int t = 0; t < Tn; t++) {
          std::vector<double> dp(t + 1);
          double c = 0;
          for (int j = 0; j <= t; j++) {
            dp[j] = 0;
            for (int i = 0; i < hs; i++) dp[j] += dO(t, i) * std::fabs(Q(b, j, 2, h, i));
            c += P(t, j) * dp[j];
          }
          for (int j = 0; j <= t; j++) ds[size_t(t) * Tn + j] = P(t, j) * (dp[j] + c) * scale;
        }
        for (int t = 0; t < Tn; t++)
          for (int i = 0; i < hs; i++) {
            double dq = 0, dk = 0, dv = 0;
            for (int j = 0; j <= t; j++) dq += ds[size_t(t) * Tn + j] * std::fabs(Q(b, j, 1, h, i));
            for (int t3 = t; t3 < Tn; t3++) {
              dk += ds[size_t(t3) * Tn + t] * std::fabs(Q(b, t3, 0, h, i));
              dv += P(t3, t) * dO(t3, i);
            }
            const size_t at = (size_t(b) * Tn + t) * 3 * C + size_t(h) * hs + i;
            mag[at] = 2 * gamma(hs + 2 * Tn + 3) * dq;
            mag[at + C] = 2 * gamma(hs + 2 * Tn + 3) * dk;
            mag[at + 2 * size_t(C)] = 2 * gamma(Tn) * dv;
          }
      }
    back.within(dqkv_f, dqkv_r, s.str(), [&](size_t i, double f, double r) {
      return stored_bound(mag[i] * (1 + 0x1p-40), f, r, uT);
    });
  }
  for (const Check* c : {&att_c, &out_c, &back}) c->print();
}
TEST(FastVsRef, Attention) {
  attention_case<float>();
  attention_case<bf16>();
  attention_case<double>();
}

// ---------------------------------------------------------------------------------------------
// GELU, y = x sig, sig = 1 / (1 + e), e = exp(a), a = -2 s (x + k x^3) the same float in both
// kernels (s = sqrt(2/pi), k = 0.044715).
//
// Forward. With e_fast = e_ref (1 + eps), |eps| <= eta, the exact sigmoids differ by a factor
// 1 / (1 + eps e / (1 + e)), i.e. a relative eta / (1 - eta); each kernel then rounds three
// times (1 + e, the division, the product with x). So
//   |y_fast / y_ref - 1| <= (1 + gamma_n(6)) / (1 - eta) - 1.
//
// Backward. dinp = g(sig) dout with g(sig) = sig + Q sig (1 - sig), Q = 2 x s c, where
// c = fl(1 + 3 k x^2) is the same float in both kernels. Then
//   |g(sig_f) - g(sig_r)| = |sig_f - sig_r| |1 + Q (1 - sig_f - sig_r)| <= |sig_f - sig_r| (1 + |Q|),
//   |sig_f - sig_r| <= beta_s sig_hi,   beta_s = (1 + gamma_n(4)) / (1 - eta) - 1   (as above, without x)
// and each kernel's own roundings (5 in Q sig (1 - sig), the sum, the product with dout) add at most
// |dout| (gamma_n(2) sig + gamma_n(7) |Q| sig (1 - sig)). sig_hi bounds both computed sigmoids: from
// sig_d = 1 / (1 + exp(a)) in double, sig_hi = sig_d (1 + gamma_n(3)) / (1 - kExpFast); and
// sig (1 - sig) <= min(sig_hi, 1/4). Altogether
//   |dinp_f - dinp_r| <= |dout| (beta_s sig_hi (1 + |Q|) + 2 gamma_n(2) sig_hi
//                                + 2 gamma_n(7) |Q| min(sig_hi, 1/4)).

template <class T>
void gelu_case() {
  Check fwd("gelu_forward", type_name<T>()), bwd("gelu_backward", type_name<T>());
  constexpr double uT = storage_roundoff<T>();
  constexpr bool same_exp = std::is_same_v<T, double>;
  const double beta_y = (1 + gamma_n(6)) / (1 - kEta) - 1, beta_s = (1 + gamma_n(4)) / (1 - kEta) - 1;
  nz::Rng rng(8);
  for (const Shape& s : kShapes) {
    const size_t n = size_t(s.N()) * 4 * s.C;  // the MLP's hidden layer
    // x in [-9.5, 9.5]: exp's arguments within +-77, every sigmoid a normal float
    const auto x = random_t<T>(rng, n, -9.5, 9.5), dout = random_t<T>(rng, n, -1, 1);
    std::vector<T> y_f = nans<T>(n), y_r = y_f, dx_f = nans<T>(n), dx_r = dx_f;
    cpu::gelu_forward(y_f.data(), x.data(), n);
    ref::gelu_forward(y_r.data(), x.data(), n);
    cpu::gelu_backward(dx_f.data(), x.data(), dout.data(), n);
    ref::gelu_backward(dx_r.data(), x.data(), dout.data(), n);
    if (same_exp) {
      fwd.same_bits(y_f, y_r, s.str());
      bwd.same_bits(dx_f, dx_r, s.str());
      continue;
    }
    fwd.within(y_f, y_r, s.str(), [&](size_t, double f, double r) {
      return stored_bound(beta_y * std::fabs(r) / (1 - uT), f, r, uT);
    });
    bwd.within(dx_f, dx_r, s.str(), [&](size_t i, double f, double r) {
      const float xi = float(val(x[i]));
      const float c = 1.0f + 3.0f * kGeluK * xi * xi;  // as the kernels compute it
      const double q = 2 * std::fabs(double(xi)) * kGeluS * c;
      const double sig_hi = 1 / (1 + std::exp(double(gelu_exp_arg(xi)))) * (1 + gamma_n(3)) / (1 - kExpFast);
      const double d = std::fabs(val(dout[i])) * (beta_s * sig_hi * (1 + q) + 2 * gamma_n(2) * sig_hi +
                                                  2 * gamma_n(7) * q * std::min(sig_hi, 0.25));
      return stored_bound(d, f, r, uT);
    });
  }
  for (const Check* c : {&fwd, &bwd}) c->print();
}
TEST(FastVsRef, Gelu) {
  gelu_case<float>();
  gelu_case<bf16>();
  gelu_case<double>();
}

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy over rows of V logits.
// probs: the same logits, their max and the exps' arguments are the same bits in both kernels, so
// only the exps differ. Per row of L = V entries each kernel computes p^ = fl(e fl(1 / s^)), s^ =
// the sum of the L exps = s (1 + theta), |theta| <= gamma_n(L - 1), so p^ = (e / s)(1 + theta'),
// |theta'| <= gamma_n(L + 1). The exact ratios e/s of the two kernels differ by
// (1 + eps_j)/(1 + mean eps), |eps| <= eta, i.e. by at most 2 eta / (1 - eta). Hence
//   |p_fast / p_ref - 1| <= (1 + 2 eta / (1 - eta)) (1 + gamma_n(2L + 2)) - 1 = beta_p(L).
// losses = log(s^) - (x[target] - max), the subtraction the same in both. The sums of the two
// kernels differ by a factor (1 + eps)(1 + theta), |eps| <= eta, |theta| <= gamma_n(2V - 2), so
// their logs by at most lambda = -log(1 - eta) - log(1 - gamma_n(2V - 2)); each logf adds at most
// kLibm log(s^), with log(s^) <= log(V (1 + gamma_n(V - 1))(1 + kExpFast)) (every exp <= 1, one
// of them exactly 1: s^ >= 1); the final subtraction rounds once in each:
//   |loss_f - loss_r| <= lambda + 2 kLibm log_s_hi + u (|loss_f| + |loss_r|).

double beta_p(int L) { return (1 + 2 * kEta / (1 - kEta)) * (1 + gamma_n(2 * L + 2)) - 1; }

template <class T>
void softmax_xent_case() {
  using A = nz::acc_t<T>;
  Check probs_c("softmax_xent_forward probs", type_name<T>()),
      loss_c("softmax_xent_forward losses", type_name<T>());
  constexpr double uT = storage_roundoff<T>();
  constexpr bool same_exp = std::is_same_v<T, double>;
  nz::Rng rng(9);
  for (const Shape& s : kShapes) {
    const int BT = s.N(), V = s.V;
    // logits in [-40, 40]: exp's arguments >= -80, every probability a normal float
    const auto logits = random_t<T>(rng, size_t(BT) * V, -40, 40);
    const std::vector<int> targets = random_ints(rng, BT, V);
    std::vector<T> p_f = nans<T>(logits.size()), p_r = p_f;
    std::vector<A> l_f(BT), l_r(BT);
    cpu::softmax_xent_forward(l_f.data(), p_f.data(), logits.data(), targets.data(), BT, V);
    ref::softmax_xent_forward(l_r.data(), p_r.data(), logits.data(), targets.data(), BT, V);
    if (same_exp) {
      probs_c.same_bits(p_f, p_r, s.str());
      loss_c.same_bits(l_f, l_r, s.str());
      continue;
    }
    probs_c.within(p_f, p_r, s.str(), [&](size_t, double f, double r) {
      return stored_bound(beta_p(V) * std::fabs(r) / (1 - uT), f, r, uT);
    });
    const double lambda = -std::log1p(-kEta) - std::log1p(-gamma_n(2 * V - 2));
    const double log_s_hi = std::log(double(V)) + std::log1p(gamma_n(V - 1)) + std::log1p(kExpFast);
    loss_c.within(l_f, l_r, s.str(), [&](size_t, double f, double r) {
      return lambda + 2 * kLibm * log_s_hi + kU * (std::fabs(f) + std::fabs(r));
    });
  }
  for (const Check* c : {&probs_c, &loss_c}) c->print();
}
TEST(FastVsRef, SoftmaxXent) {
  softmax_xent_case<float>();
  softmax_xent_case<bf16>();
  softmax_xent_case<double>();
}

// ---------------------------------------------------------------------------------------------
// The fused ops of nz::ref give the bits of the unfused ones they replace in the model, in place as
// the model calls them (tests/kernels/test_kernels.cpp checks the same of nz::cpu's; with the checks above,
// fused fast and fused reference then agree as the unfused ones do).

template <class T>
void fused_case() {
  using A = nz::acc_t<T>;
  Check check("fused = unfused (nz::ref)", type_name<T>());
  nz::Rng rng(11);
  for (const Shape& s : kShapes) {
    const int N = s.N(), C = s.C, OC = 4 * s.C;
    const size_t nc = size_t(N) * C, noc = size_t(N) * OC;
    const auto x = random_t<T>(rng, nc, -2, 3), att = random_t<T>(rng, nc, -1, 1),
               w = random_t<T>(rng, C, 0.5, 1.5), b = random_t<T>(rng, C, -1, 1),
               fw = random_t<T>(rng, size_t(OC) * C, -1, 1), fb = random_t<T>(rng, OC, -1, 1),
               dln = random_t<T>(rng, nc, -1, 1), dskip = random_t<T>(rng, nc, -1, 1),
               dfc = random_t<T>(rng, noc, -1, 1), g0 = random_t<T>(rng, OC, -1, 1),
               g1 = random_t<T>(rng, C, -1, 1);
    // residual + layer norm, res over its second input
    std::vector<T> res_u = att, ln_u = nans<T>(nc), res_f = att, ln_f = nans<T>(nc);
    std::vector<A> mean_u(N), rstd_u(N), mean_f(N), rstd_f(N);
    ref::residual_forward(res_u.data(), x.data(), res_u.data(), nc);
    ref::layernorm_forward(ln_u.data(), mean_u.data(), rstd_u.data(), res_u.data(), w.data(), b.data(), N, C);
    ref::residual_layernorm_forward(res_f.data(), ln_f.data(), mean_f.data(), rstd_f.data(), x.data(),
                                    res_f.data(), w.data(), b.data(), N, C);
    check.same_bits(res_f, res_u, s.str());
    check.same_bits(ln_f, ln_u, s.str());
    check.same_bits(mean_f, mean_u, s.str());
    check.same_bits(rstd_f, rstd_u, s.str());
    // linear layer + GELU
    std::vector<T> fc_u = nans<T>(noc), fcg_u = fc_u, fc_f = fc_u, fcg_f = fc_u;
    ref::matmul_forward(fc_u.data(), ln_u.data(), fw.data(), fb.data(), N, C, OC);
    ref::gelu_forward(fcg_u.data(), fc_u.data(), noc);
    ref::matmul_bias_gelu_forward(fc_f.data(), fcg_f.data(), ln_u.data(), fw.data(), fb.data(), N, C, OC);
    check.same_bits(fc_f, fc_u, s.str());
    check.same_bits(fcg_f, fcg_u, s.str());
    // GELU backward + the bias gradient, in place
    std::vector<T> d_u = dfc, d_f = dfc, db_u = g0, db_f = g0;
    ref::gelu_backward(d_u.data(), fc_u.data(), d_u.data(), noc);
    ref::matmul_backward((T*)nullptr, (T*)nullptr, db_u.data(), d_u.data(), ln_u.data(), fw.data(), N, C, OC);
    ref::gelu_backward_bias(d_f.data(), db_f.data(), fc_u.data(), d_f.data(), N, OC);
    check.same_bits(d_f, d_u, s.str());
    check.same_bits(db_f, db_u, s.str());
    // layer norm backward + the skip path, dinp over dskip
    std::vector<T> tmp = nans<T>(nc), dres_u = nans<T>(nc), dres_f = dskip;
    std::vector<T> dw_u = g1, dbn_u = g1, dw_f = g1, dbn_f = g1;
    ref::layernorm_backward(tmp.data(), dw_u.data(), dbn_u.data(), dln.data(), res_u.data(), w.data(),
                            mean_u.data(), rstd_u.data(), N, C);
    ref::residual_forward(dres_u.data(), dskip.data(), tmp.data(), nc);
    ref::layernorm_backward_residual(dres_f.data(), dw_f.data(), dbn_f.data(), dres_f.data(), dln.data(),
                                     res_u.data(), w.data(), mean_u.data(), rstd_u.data(), N, C);
    check.same_bits(dres_f, dres_u, s.str());
    check.same_bits(dw_f, dw_u, s.str());
    check.same_bits(dbn_f, dbn_u, s.str());
  }
  check.print();
}
TEST(Fused, RefSameBitsAsTheUnfusedOps) {
  fused_case<float>();
  fused_case<bf16>();
  fused_case<double>();
}

// ---------------------------------------------------------------------------------------------
// sum_squares: nz::cpu adds in the CUDA kernel's order (65,536 running sums, then trees), nz::ref
// one running sum. Any order of summing n terms
// x_i^2 >= 0 in double (unit roundoff 2^-53) is within gamma_d(n) S of the exact sum S (the
// squares of fp32 and bf16 values are exact in double; gamma_d(n) also covers the rounding of a
// fp64 square). So |fast - ref| <= 2 gamma_d(n) S <= 2 gamma_d(n) / (1 - gamma_d(n)) |ref|.

template <class T>
void sum_squares_case() {
  Check c("sum_squares", type_name<T>());
  nz::Rng rng(10);
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(63), size_t(1000), size_t(100003)}) {
    const auto x = random_t<T>(rng, n, -3, 3);
    const std::vector<double> f = {cpu::sum_squares(x.data(), n)}, r = {ref::sum_squares(x.data(), n)};
    const double g = n * 0x1p-53 / (1 - n * 0x1p-53);
    c.within(f, r, "n=" + std::to_string(n),
             [&](size_t, double, double rv) { return 2 * g / (1 - g) * std::fabs(rv); });
  }
  c.print();
}
TEST(FastVsRef, SumSquares) {
  sum_squares_case<float>();
  sum_squares_case<bf16>();
  sum_squares_case<double>();
}

}  // namespace
