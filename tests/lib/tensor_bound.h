// tensor_bound.h — the tensor rung against stage0_ddp: the relative bound on every step's loss and
// gradient norm that tests/tensor/test_tensor.cpp derives (Stage0DdpWithinTheDerivedBound), shared
// by the CPU suite and the GPU's (tests/cuda/test_cuda_stages.cpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "harness.h"        // step_values, Json
#include "layout.h"         // nz::param_count_formula
#include "model.h"          // nz::GPTConfig

namespace nzt {

// (4L + 2) γ_V (1 + s · lr · 0.5 · √Ψ) after s steps, with u = 2^-24 (fp32) and the suites' lr 3e-3
inline double tensor_ddp_bound(const nz::GPTConfig& c, size_t s) {
  const double u = std::ldexp(1.0, -24), n = c.vocab, gamma = n * u / (1 - n * u), terms = 4 * c.layers + 2;
  const double psi = double(nz::param_count_formula(c)), lr = 3e-3;
  return terms * gamma * (1 + double(s) * lr * 0.5 * std::sqrt(psi));
}

// Every step's loss and norm in `run` within the bound of `ref`'s (stage0_ddp's); `what` names the
// run in a failure. Returns the largest difference as a fraction of its bound.
inline double expect_tensor_within_ddp_bound(const nz::GPTConfig& c, const Json& ref, const Json& run,
                                             const std::string& what) {
  const std::vector<double> l0 = step_values(ref, "loss"), l = step_values(run, "loss");
  const std::vector<double> n0 = step_values(ref, "grad_norm"), nn = step_values(run, "grad_norm");
  EXPECT_EQ(l.size(), l0.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < std::min(l.size(), l0.size()); s++) {
    const double bound = tensor_ddp_bound(c, s);
    const double dl = std::fabs(l[s] - l0[s]) / l0[s], dn = std::fabs(nn[s] - n0[s]) / n0[s];
    worst = std::max({worst, dl / bound, dn / bound});
    EXPECT_LE(dl, bound) << what << " step " << s + 1 << ": loss " << l[s] << " vs stage0_ddp " << l0[s];
    EXPECT_LE(dn, bound) << what << " step " << s + 1 << ": norm " << nn[s] << " vs stage0_ddp " << n0[s];
  }
  return worst;
}

}  // namespace nzt
