// test_muon.cpp — Muon's Newton–Schulz against its definition, and Muon's bookkeeping of which
// matrices the slices cut (common/muon.h).
//
// Newton–Schulz, quintic, 5 steps: X = U S V^T (rows x cols, rank s = min(rows, cols)) is normalised
// to X / ||X||_F, whose singular values are s_i / ||s||, and each step maps every singular value by
// p(x) = a x + b x^3 + c x^5 (a, b, c = 3.4445, -4.7750, 2.0315) while keeping U and V: the result is
// U p^5(S / ||S||) V^T. The test builds X from chosen U, S, V (random orthonormal columns), runs the
// trainer's newton_schulz (fp32, the kernel table's matrix products, CPU fast and reference kernels),
// and measures the result independently: its singular values from the eigenvalues of O^T O (or O O^T,
// the short side) by Jacobi's method in double, and the whole matrix against U p^5(S') V^T.
// The band: for every x in [0.002, 1], p^5(x) lies in [0.6818, 1.2024] (a scan of the scalar map; for
// x >= 0.01 the top is 1.1344): the inputs here keep every normalised singular value >= 0.002.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "muon.h"

using namespace nz;

namespace {

// Columns of a rows x k matrix (row-major) made orthonormal by modified Gram–Schmidt, in double.
std::vector<double> orthonormal_columns(int rows, int k, std::mt19937& rng) {
  std::normal_distribution<double> g;
  std::vector<double> q(size_t(rows) * k);
  for (double& x : q) x = g(rng);
  for (int j = 0; j < k; j++) {
    for (int i = 0; i < j; i++) {
      double d = 0;
      for (int r = 0; r < rows; r++) d += q[r * k + i] * q[r * k + j];
      for (int r = 0; r < rows; r++) q[r * k + j] -= d * q[r * k + i];
    }
    double n = 0;
    for (int r = 0; r < rows; r++) n += q[r * k + j] * q[r * k + j];
    n = std::sqrt(n);
    for (int r = 0; r < rows; r++) q[r * k + j] /= n;
  }
  return q;
}

// Eigenvalues of a symmetric n x n matrix (double), cyclic Jacobi rotations until the off-diagonal is ~0.
std::vector<double> jacobi_eigenvalues(std::vector<double> a, int n) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j < n; j++) off += a[i * n + j] * a[i * n + j];
    if (off < 1e-26) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        if (std::fabs(a[p * n + q]) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; k++) {  // A <- A J (columns p, q)
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq, a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; k++) {  // A <- J^T A (rows p, q)
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk, a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> e(n);
  for (int i = 0; i < n; i++) e[i] = a[i * n + i];
  return e;
}

// Singular values of a rows x cols float matrix, largest first: sqrt of the eigenvalues of the short
// side's Gram matrix, formed in double.
std::vector<double> singular_values(const std::vector<float>& o, int rows, int cols) {
  const bool short_rows = rows <= cols;
  const int s = std::min(rows, cols), l = std::max(rows, cols);
  auto at = [&](int i, int k) { return double(short_rows ? o[size_t(i) * cols + k] : o[size_t(k) * cols + i]); };
  std::vector<double> g(size_t(s) * s);
  for (int i = 0; i < s; i++)
    for (int j = 0; j < s; j++) {
      double d = 0;
      for (int k = 0; k < l; k++) d += at(i, k) * at(j, k);
      g[i * s + j] = d;
    }
  std::vector<double> e = jacobi_eigenvalues(g, s);
  for (double& x : e) x = std::sqrt(std::max(x, 0.0));
  std::sort(e.rbegin(), e.rend());
  return e;
}

// The published coefficients (Keller Jordan's Muon), written here rather than taken from muon.h, rounded
// to float as the trainer's are.
double quintic5(double x) {
  const double a = 3.4445f, b = -4.7750f, c = 2.0315f;
  for (int k = 0; k < 5; k++) x = a * x + b * x * x * x + c * x * x * x * x * x;
  return x;
}

struct NsOutcome {
  double worst_sv = 0, worst_entry = 0, lo = 1e9, hi = 0;
};

// X = U diag(sv) V^T, Newton–Schulz, then the measurements above.
NsOutcome run_case(int rows, int cols, const std::vector<double>& sv, std::mt19937& rng) {
  const int s = std::min(rows, cols);
  const std::vector<double> U = orthonormal_columns(rows, s, rng), V = orthonormal_columns(cols, s, rng);
  std::vector<float> X(size_t(rows) * cols);
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      double x = 0;
      for (int k = 0; k < s; k++) x += U[i * s + k] * sv[k] * V[j * s + k];
      X[size_t(i) * cols + j] = float(x);
    }
  // the singular values of the fp32 X (its rounding moves them by ~1e-7), normalised as the iteration does
  std::vector<double> in = singular_values(X, rows, cols);
  double fro = 0;
  for (float x : X) fro += double(x) * x;
  fro = std::sqrt(fro);
  std::vector<float> work(ns_work_elems(rows, cols) - size_t(rows) * cols);
  newton_schulz(X.data(), rows, cols, work.data(), 5);
  NsOutcome r;
  const std::vector<double> out = singular_values(X, rows, cols);
  // p^5 is not monotonic: the mapped values, sorted, against the measured ones, sorted
  std::vector<double> want(s);
  for (int k = 0; k < s; k++) want[k] = quintic5(in[k] / (fro + kNsEps));
  std::sort(want.rbegin(), want.rend());
  for (int k = 0; k < s; k++) {
    r.worst_sv = std::max(r.worst_sv, std::fabs(out[k] - want[k]));
    r.lo = std::min(r.lo, out[k]), r.hi = std::max(r.hi, out[k]);
  }
  // the whole matrix: U p^5(S') V^T, with S' the chosen values normalised (the fp32 rounding of X aside)
  double norm = 0;
  for (double x : sv) norm += x * x;
  norm = std::sqrt(norm);
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      double o = 0;
      for (int k = 0; k < s; k++) o += U[i * s + k] * quintic5(sv[k] / norm) * V[j * s + k];
      r.worst_entry = std::max(r.worst_entry, std::fabs(o - X[size_t(i) * cols + j]));
    }
  return r;
}

}  // namespace

TEST(NewtonSchulz, OrthogonalisesAsTheQuinticMapSays) {
  std::mt19937 rng(43);
  struct Shape { int rows, cols; };
  // the tiny model's four shapes (C = 32) and two more: wide, tall, square
  const Shape shapes[] = {{96, 32}, {32, 32}, {128, 32}, {32, 128}, {24, 40}, {40, 24}};
  for (Kernels k : {Kernels::Fast, Kernels::Reference}) {
    set_kernels(k);
    for (Shape sh : shapes) {
      const int s = std::min(sh.rows, sh.cols);
      // singular values spread over (0, 1]: one at 1, the smallest small but >= 0.002 once normalised
      std::uniform_real_distribution<double> u(0.02, 1.0);
      std::vector<double> sv(s);
      for (double& x : sv) x = u(rng);
      sv[0] = 1.0, sv[s - 1] = 0.02;
      const NsOutcome r = run_case(sh.rows, sh.cols, sv, rng);
      printf("%s kernels, %3d x %-3d: singular values in [%.4f, %.4f]; worst |sv - p^5(sv')| %.2e, worst entry vs "
             "U p^5(S') V^T %.2e\n", kernels_name(k), sh.rows, sh.cols, r.lo, r.hi, r.worst_sv, r.worst_entry);
      EXPECT_LT(r.worst_sv, 1e-4) << sh.rows << "x" << sh.cols;
      EXPECT_LT(r.worst_entry, 1e-4) << sh.rows << "x" << sh.cols;
      EXPECT_GE(r.lo, 0.68) << "below the quintic iteration's band";
      EXPECT_LE(r.hi, 1.21) << "above the quintic iteration's band";
    }
  }
  set_kernels(Kernels::Fast);
}

// The tall branch (X^T X) and the wide branch (X X^T) compute the same map: NS(X^T) = NS(X)^T.
TEST(NewtonSchulz, TallAndWideAgree) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  const int rows = 48, cols = 20;
  std::vector<float> X(rows * cols), XT(rows * cols);
  for (float& x : X) x = g(rng);
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) XT[j * rows + i] = X[i * cols + j];
  std::vector<float> work(ns_work_elems(rows, cols));
  newton_schulz(X.data(), rows, cols, work.data());
  newton_schulz(XT.data(), cols, rows, work.data());
  double worst = 0;
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) worst = std::max(worst, double(std::fabs(X[i * cols + j] - XT[j * rows + i])));
  printf("NS(X^T) vs NS(X)^T, %d x %d: worst |diff| %.2e\n", rows, cols, worst);
  EXPECT_LT(worst, 1e-4);
}

// Which ranks own which matrix, against the slices written out: the tiny model (C = 32) at N = 4 has
// block units of 12704 elements, slices of 3176. A block: ln1 64, qkv_w 3072, qkv_b 96, attproj_w
// 1024, attproj_b 32, ln2 64, fc_w 4096, fc_b 128, fcproj_w 4096, fcproj_b 32; so fc_w is elements
// [4352, 8448), cut at 6352 (ranks 1, 2), and fcproj_w [8576, 12672), cut at 9528 (ranks 2, 3).
TEST(MuonLayout, CutMatricesAndTheirOwners) {
  GPTConfig tiny;
  ASSERT_TRUE(preset_config("tiny", &tiny));
  const Layout L = make_layout(tiny, 4);
  int cut = 0;
  for (const MuonMatrix& m : muon_matrices(L)) {
    if (m.name.find("fc_w") != std::string::npos) {
      EXPECT_EQ(m.begin, 4352u);
      EXPECT_EQ(m.first_rank, 1);
      EXPECT_EQ(m.last_rank, 2);
    } else if (m.name.find("fcproj_w") != std::string::npos) {
      EXPECT_EQ(m.begin, 8576u);
      EXPECT_EQ(m.first_rank, 2);
      EXPECT_EQ(m.last_rank, 3);
    } else {
      EXPECT_FALSE(m.crosses()) << m.name;
    }
    cut += m.crosses();
  }
  EXPECT_EQ(cut, 2 * tiny.layers);
  // per block: rank 1 sends its part of fc_w (6352 - 4352 = 2000) to rank 2; rank 2 sends its part of
  // fc_w (8448 - 6352 = 2096) to rank 1 and of fcproj_w (9528 - 8576 = 952) to rank 3; rank 3 sends
  // 12672 - 9528 = 3144 to rank 2
  const uint64_t want[] = {0, 2000, 2096 + 952, 3144};
  for (int r = 0; r < 4; r++) EXPECT_EQ(muon_p2p_elems(Stage::Z2, L, r), 2 * want[r]) << "rank " << r;
  // the owned Muon elements partition the Muon matrices
  uint64_t sum = 0;
  for (int r = 0; r < 4; r++) sum += muon_owned_elems(Stage::Z1, L, r);
  EXPECT_EQ(sum, muon_owned_elems(Stage::DDP, L, 0));
  EXPECT_EQ(sum, uint64_t(tiny.layers) * 12 * 32 * 32);
}
