// bench_adam — how fast the host AdamW of ZeRO-Offload runs (`make bench-adam`).
//
//   build/bin/bench_adam [--max M] [--reps R]
//
// For 10M, 30M and 100M parameters (those up to --max M million, and M), elements per second of
//   scalar:    the textbook loop, one element at a time on one thread (not vectorized);
//   reference: nz::cpu::adamw_update, the readable kernel of the CPU backend (kernels_cpu.cpp);
//   fast:      nz::cpu_adam::adamw_update (cpu_adam.h), the one offload runs, bitwise equal to
//              the reference (tests/kernels/test_cpu_adam.cpp),
// with fp32 and with bf16 gradients; best of R repetitions. One update reads p, m, v, g and writes
// p, m, v (28 bytes per element with fp32 gradients): the memory bandwidth it implies is printed too.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/check.h"     // user_error
#include "kernels/cpu_adam.h"  // nz::cpu_adam::adamw_update
#include "kernels/kernels.h"   // nz::cpu::adamw_update

using namespace nz;

// One element at a time, as a first version would be written; kept scalar on purpose.
template <class T>
__attribute__((optimize("no-tree-vectorize"))) static void adamw_scalar(float* p, float* m, float* v, const T* g,
                                                                       size_t n, float lr, float beta1,
                                                                       float beta2, float eps, float wd,
                                                                       float gs, int t) {
  const float bc1 = 1.0f - powf(beta1, float(t)), bc2 = 1.0f - powf(beta2, float(t));
  for (size_t i = 0; i < n; i++) {
    const float gi = load(g[i]) * gs;
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] = p[i] - lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

int main(int argc, char** argv) {
  long max_m = 100, reps = 3;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      printf("usage: bench_adam [--max M (million elements, default 100)] [--reps R (default 3)]\n");
      return 0;
    }
    if ((a != "--max" && a != "--reps") || i + 1 >= argc)
      user_error("%s: unknown flag or missing value; usage: bench_adam [--max M] [--reps R]", a.c_str());
    char* end = nullptr;
    long x = strtol(argv[++i], &end, 10);
    if (*end || x < 1) user_error("%s %s: expected a positive whole number", a.c_str(), argv[i]);
    (a == "--max" ? max_m : reps) = x;
  }
  std::vector<size_t> sizes;
  for (long s : {10L, 30L, 100L})
    if (s <= max_m) sizes.push_back(size_t(s) * 1000000);
  if (sizes.empty() || sizes.back() != size_t(max_m) * 1000000) sizes.push_back(size_t(max_m) * 1000000);
  printf("AdamW on the host: %d threads, %d SIMD lanes, best of %ld\n", omp_get_max_threads(), cpu_adam::lanes(),
         reps);
  printf("%5s %12s %16s %16s %16s %12s %10s\n", "grads", "elements", "scalar elem/s", "reference elem/s",
         "fast elem/s", "fast/scalar", "fast GB/s");
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  int t = 1;
  for (bool bf16_grads : {false, true}) {
    for (size_t n : sizes) {
      // Fresh arrays of exactly n elements, first-touched by the threads that use them.
      std::vector<float> p(n), m(n), v(n), g(n);
      std::vector<bf16> g16(bf16_grads ? n : 0);
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; i++) {
        p[i] = 0.02f * float(int(i % 1999) - 999) / 999.0f;
        g[i] = 0.001f * float(int(i % 997) - 498) / 498.0f;
        if (bf16_grads) g16[i] = f32_to_bf16(g[i]);
        m[i] = v[i] = 0.0f;
      }
      auto bench = [&](const auto* grads) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(grads)>>;
        auto elems_per_s = [&](auto&& update) {
          double best = 1e30;
          for (int r = 0; r < reps; r++, t++) {
            auto t0 = std::chrono::steady_clock::now();
            update();
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          return double(n) / best;
        };
        float *P = p.data(), *M = m.data(), *V = v.data();
        double scalar = elems_per_s([&] { adamw_scalar<T>(P, M, V, grads, n, lr, b1, b2, eps, wd, gs, t); });
        double ref = elems_per_s([&] { cpu::adamw_update<T>(P, M, V, grads, n, lr, b1, b2, eps, wd, gs, t); });
        double fast = elems_per_s([&] { cpu_adam::adamw_update<T>(P, M, V, grads, n, lr, b1, b2, eps, wd, gs, t); });
        const double bytes = 24.0 + sizeof(T);  // p, m, v read and written, g read
        printf("%5s %12zu %16.3e %16.3e %16.3e %11.2fx %10.1f\n", bf16_grads ? "bf16" : "fp32", n, scalar, ref, fast,
               fast / scalar, fast * bytes / 1e9);
        fflush(stdout);
      };
      if (bf16_grads) bench(g16.data());
      else bench(g.data());
    }
  }
  return 0;
}
