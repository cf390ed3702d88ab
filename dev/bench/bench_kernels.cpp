// bench_kernels — times the CPU kernels (nz::cpu, or nz::ref with --kernels reference) on the
// shapes of one training step, adds them up into the kernel time of a step, sums that by op
// (matmul, attention, layernorm, GELU, ...), and sets the matmuls' rate beside the BLAS's own sgemm
// on the model's largest product, measured in the same run.
//
//   build/bin/bench_kernels [--preset small] [--layers L --dim C --heads H] [--batch 4] [--seq 64]
//                           [--threads 1] [--reps 20] [--precision fp32|bf16] [--kernels fast|reference]
//
// The defaults are one rank of `make run` (small preset, batch 4 x seq 64, one OpenMP thread per
// rank with 4 ranks on 2 cores). Each kernel is run --reps times and the fastest run is kept: on a
// shared machine the fastest run is the one least disturbed by other processes. `make bench`
// (scripts/bench.sh) runs it on the two shapes.
#include <cblas.h>  // cblas_sgemm: the library's own rate
#include <omp.h>    // omp_set_num_threads

#include <algorithm>   // std::min, std::max
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // printf
#include <cstdlib>     // strtol
#include <functional>  // std::function
#include <map>         // time per op
#include <string>
#include <vector>

#include "runtime/check.h"      // user_error
#include "kernels/gemm_bf16.h"  // bf16_gemm_path
#include "kernels/kernels.h"    // nz::cpu::*, nz::ref::*
#include "model.h"      // preset_config, make_layout

using namespace nz;

namespace {

struct Bench {
  std::string op;    // the op it counts towards in the breakdown
  std::string name;  // kernel and shape
  int calls;         // calls per training step
  double flops;      // floating-point operations per call (0: not a flop-bound kernel)
  std::function<void()> run;
};

// The fastest of reps runs, in seconds.
double time_min(const std::function<void()>& fn, int reps) {
  fn();  // warm-up: caches, page faults, scratch buffers
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count());
  }
  return best;
}

template <class T>
std::vector<T> random_vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
  static uint64_t s = 12345;
  std::vector<T> v(n);
  for (T& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;  // an LCG: enough for timing
    x = store<T>(lo + (hi - lo) * float(s >> 40) * 0x1p-24f);
  }
  return v;
}

// out (M,N) = a (M,K) @ b (N,K)^T through the BLAS directly: the rate the library reaches alone.
double sgemm_gflops(int M, int N, int K, int reps) {
  std::vector<float> a = random_vec<float>(size_t(M) * K), b = random_vec<float>(size_t(N) * K),
                     c(size_t(M) * N);
  const double t = time_min([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f,
                c.data(), N);
  }, reps);
  return 2.0 * M * N * K / t * 1e-9;
}

// Which kernels: nz::cpu (fast) or nz::ref (reference). The same names in both namespaces.
#define NZ_K(f) (fast ? cpu::f<T> : ref::f<T>)

template <class T>
void bench(const GPTConfig& cfg, int B, int Tn, int reps, bool fast) {
  using A = acc_t<T>;
  const int C = cfg.dim, NH = cfg.heads, V = cfg.vocab, L = cfg.layers, BT = B * Tn;
  const size_t P = make_layout(cfg, 1).num_params;
  // activations wide enough for any layer (4C for the MLP, V for the logits), reused by every kernel
  const size_t act = size_t(BT) * std::max(4 * C, V);
  std::vector<T> x = random_vec<T>(act), y(act), dy = random_vec<T>(act), dx(act);
  std::vector<T> w = random_vec<T>(size_t(4) * C * C), dw(w.size());
  std::vector<T> bias = random_vec<T>(4 * C), dbias(4 * C);
  std::vector<T> wte = random_vec<T>(size_t(V) * C), dwte(wte.size()), wpe = random_vec<T>(size_t(Tn) * C);
  std::vector<T> qkv = random_vec<T>(size_t(BT) * 3 * C, -2, 2), att(size_t(B) * NH * Tn * Tn);
  std::vector<T> logits = random_vec<T>(size_t(BT) * V, -4, 4), g = random_vec<T>(P);
  std::vector<A> mean(BT), rstd(BT), losses(BT);
  std::vector<float> p(P, 0.01f), m(P), v(P);
  std::vector<int> tokens(BT);
  for (int i = 0; i < BT; i++) tokens[i] = (i * 37) % V;
  cpu::attention_forward(y.data(), att.data(), qkv.data(), B, Tn, C, NH);  // a real att for the backward
  const auto matmul_forward = NZ_K(matmul_forward);
  const auto matmul_backward = NZ_K(matmul_backward);

  std::vector<Bench> benches;
  auto add = [&](std::string name, int calls, double flops, std::function<void()> run) {
    const std::string first = name.substr(0, name.find_first_of("_ "));
    const std::string op = first == "softmax" ? "loss" : first == "sum" ? "adamw" : first;
    benches.push_back({op, std::move(name), calls, flops, std::move(run)});
  };
  // the four linear layers of a block, and the LM head (weights tied to wte, no bias)
  struct Linear { const char* name; int in, out, calls; };
  for (Linear l : {Linear{"qkv", C, 3 * C, L}, Linear{"attproj", C, C, L}, Linear{"fc", C, 4 * C, L},
                   Linear{"fcproj", 4 * C, C, L}, Linear{"lm head", C, V, 1}}) {
    const bool head = l.calls == 1;
    char shape[64];
    snprintf(shape, sizeof shape, " (%d,%d)->%d %s", BT, l.in, l.out, l.name);
    const double f = 2.0 * BT * l.in * l.out;  // one product
    const T* wl = head ? wte.data() : w.data();
    const T* bl = head ? nullptr : bias.data();
    add(std::string("matmul_forward  ") + shape, l.calls, f,
        [&, wl, bl, l] { matmul_forward(y.data(), x.data(), wl, bl, BT, l.in, l.out); });
    if (!head) {  // dinp and dw (+ dbias): two products
      add(std::string("matmul_backward ") + shape, l.calls, 2 * f, [&, l] {
        matmul_backward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), BT, l.in,
                             l.out);
      });
    } else {  // the trainer asks for dinp and dwte separately (the tied gradient is summed later)
      add(std::string("matmul_bwd dinp ") + shape, 1, f, [&, l] {
        matmul_backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), wte.data(), BT, l.in,
                                l.out);
      });
      add(std::string("matmul_bwd dw   ") + shape, 1, f, [&, l] {
        matmul_backward(nullptr, dwte.data(), nullptr, dy.data(), x.data(), nullptr, BT, l.in, l.out);
      });
    }
  }
  // (query, key) pairs at or below the diagonal, times the head size: the multiply-adds of one product
  const double att_macs = double(B) * NH * (C / NH) * Tn * (Tn + 1) / 2;
  add("attention_forward", L, 2 * 2 * att_macs,  // S = Q K^T, out = P V
      [&] { NZ_K(attention_forward)(y.data(), att.data(), qkv.data(), B, Tn, C, NH); });
  add("attention_backward", L, 4 * 2 * att_macs,  // dV, dP, dQ, dK
      [&] { NZ_K(attention_backward)(dx.data(), dy.data(), qkv.data(), att.data(), y.data(), B, Tn, C, NH); });
  add("layernorm_forward", 2 * L + 1, 0, [&] {
    NZ_K(layernorm_forward)(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), BT, C);
  });
  add("layernorm_backward", 2 * L + 1, 0, [&] {
    NZ_K(layernorm_backward)(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), BT, C);
  });
  const size_t n4 = size_t(BT) * 4 * C, n1 = size_t(BT) * C;
  add("gelu_forward", L, 0, [&] { NZ_K(gelu_forward)(y.data(), x.data(), n4); });
  add("gelu_backward", L, 0, [&] { NZ_K(gelu_backward)(dx.data(), x.data(), dy.data(), n4); });
  add("residual_forward", 4 * L, 0, [&] { NZ_K(residual_forward)(y.data(), x.data(), dy.data(), n1); });
  add("softmax_xent_forward", 1, 0,
      [&] { NZ_K(softmax_xent_forward)(losses.data(), y.data(), logits.data(), tokens.data(), BT, V); });
  add("softmax_xent_backward", 1, 0,
      [&] { NZ_K(softmax_xent_backward)(dx.data(), y.data(), tokens.data(), 1.0f / BT, BT, V); });
  add("embedding_forward", 1, 0,
      [&] { NZ_K(embedding_forward)(y.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C); });
  add("embedding_backward", 1, 0,
      [&] { NZ_K(embedding_backward)(dwte.data(), dx.data(), dy.data(), tokens.data(), B, Tn, C); });
  add("adamw_update (all params)", 1, 0, [&] {
    NZ_K(adamw_update)(p.data(), m.data(), v.data(), g.data(), P, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1);
  });
  add("sum_squares (all grads)", 1, 0, [&] {
    volatile double s = NZ_K(sum_squares)(g.data(), P);
    (void)s;
  });

  printf("%-44s %6s %10s %9s %10s\n", "kernel (rows,in)->out", "calls", "us/call", "GFLOP/s", "ms/step");
  double total = 0.0, mm_flops = 0.0, all_flops = 0.0;
  std::map<std::string, double> per_op;  // seconds per step
  std::vector<std::string> order;
  for (const Bench& b : benches) {
    const double t = time_min(b.run, reps);
    total += t * b.calls;
    if (!per_op.count(b.op)) order.push_back(b.op);
    per_op[b.op] += t * b.calls;
    if (b.op == "matmul") mm_flops += b.flops * b.calls;
    all_flops += b.flops * b.calls;
    char gf[16] = "-";
    if (b.flops > 0) snprintf(gf, sizeof gf, "%.2f", b.flops / t * 1e-9);
    printf("%-44s %6d %10.1f %9s %10.2f\n", b.name.c_str(), b.calls, t * 1e6, gf, t * b.calls * 1e3);
  }
  printf("kernel time per step (sum of the above): %.1f ms = %.0f tokens/s, %.1f GFLOP/s\n", total * 1e3,
         B * Tn / total, all_flops / total * 1e-9);
  printf("by op:");
  for (const std::string& op : order) printf("  %s %.1f ms (%.0f%%)", op.c_str(), per_op[op] * 1e3, 100 * per_op[op] / total);
  printf("\n");
  // the library alone, on the largest product of the model (the MLP's first layer)
  const double peak = sgemm_gflops(BT, 4 * C, C, reps);
  const double mm = mm_flops / per_op["matmul"] * 1e-9;
  printf("matmuls: %.1f GFLOP/s | the BLAS's sgemm alone on (%d,%d)->%d: %.1f GFLOP/s | %.0f%%\n", mm, BT, C,
         4 * C, peak, 100 * mm / peak);
  printf("BENCH tokens_per_s=%.1f gflops=%.2f matmul_gflops=%.2f sgemm_gflops=%.2f", B * Tn / total,
         all_flops / total * 1e-9, mm, peak);
  for (const std::string& op : order) printf(" ms_%s=%.3f", op.c_str(), per_op[op] * 1e3);
  printf("\n");
}
#undef NZ_K

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "small", precision = "fp32", kernels = "fast";
  int batch = 4, seq = 0, threads = 1, reps = 20;  // seq 0: 64, or the preset's context if shorter
  int layers = 0, dim = 0, heads = 0;              // 0: the preset's
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      printf("usage: bench_kernels [--preset NAME] [--layers L --dim C --heads H] [--batch B] [--seq T]\n"
             "                     [--threads N] [--reps R] [--precision fp32|bf16] [--kernels fast|reference]\n");
      return 0;
    }
    int* number = a == "--batch" ? &batch : a == "--seq" ? &seq : a == "--threads" ? &threads
                : a == "--reps"  ? &reps  : a == "--layers" ? &layers : a == "--dim" ? &dim
                : a == "--heads" ? &heads : nullptr;
    if (!number && a != "--preset" && a != "--precision" && a != "--kernels")
      user_error("unknown option %s; see bench_kernels --help", a.c_str());
    if (i + 1 >= argc) user_error("%s needs a value; see bench_kernels --help", a.c_str());
    const std::string val = argv[++i];
    if (a == "--preset") preset = val;
    if (a == "--precision") precision = val;
    if (a == "--kernels") kernels = val;
    if (number) {
      char* end;
      const long x = strtol(val.c_str(), &end, 10);
      if (*end || x <= 0 || x > (1 << 20))
        user_error("%s %s: expected a positive whole number", a.c_str(), val.c_str());
      *number = int(x);
    }
  }
  GPTConfig cfg;
  if (!preset_config(preset, &cfg))
    user_error("--preset %s: expected one of %s", preset.c_str(), preset_names());
  if (layers) cfg.layers = layers;
  if (dim) cfg.dim = dim;
  if (heads) cfg.heads = heads;
  if (cfg.dim % cfg.heads != 0)
    user_error("--dim %d is not a multiple of --heads %d", cfg.dim, cfg.heads);
  if (kernels != "fast" && kernels != "reference")
    user_error("--kernels %s: expected fast or reference", kernels.c_str());
  if (seq == 0) seq = std::min(64, cfg.ctx);
  if (seq > cfg.ctx)
    user_error("--seq %d: longer than the preset's context %d; use --seq %d or less", seq, cfg.ctx, cfg.ctx);
  if (precision != "fp32" && precision != "bf16")
    user_error("--precision %s: expected fp32 or bf16", precision.c_str());
  omp_set_num_threads(threads);
  printf("bench_kernels | %d layers, width %d, %d heads, vocab %d | batch %d x seq %d | %s | %s kernels | "
         "%d threads | best of %d\n", cfg.layers, cfg.dim, cfg.heads, cfg.vocab, batch, seq,
         precision.c_str(), kernels.c_str(), threads, reps);
  if (precision == "bf16")  // the matmuls' path: the CPU's bf16 instructions, or widened to fp32 for sgemm
    printf("bf16 products: %s\n", nz::cpu::bf16_gemm_path());
  if (precision == "fp32") bench<float>(cfg, batch, seq, reps, kernels == "fast");
  else bench<bf16>(cfg, batch, seq, reps, kernels == "fast");
  return 0;
}
