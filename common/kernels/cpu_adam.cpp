// cpu_adam.cpp — the fast host AdamW (cpu_adam.h).
//
// What makes it fast, and why each choice keeps the bits of nz::cpu::adamw_update:
//  - SIMD: W elements at a time in GCC vector types (8 floats with AVX, 16 with AVX-512, 4 with SSE
//    or with 64-bit ARM's NEON, where GCC turns the lane loop of sqrt_lanes into one FSQRT). +, -, *,
//    / and sqrt are correctly rounded IEEE operations in every lane, so lane i computes exactly what
//    the scalar loop computes for element i. The per-element formula below is ONE template used for
//    both the vector body and the scalar tail, so the two cannot drift apart.
//  - No fused multiply-add (the build has -ffp-contract=off; an FMA rounds once where the
//    reference rounds twice) and no reciprocal estimates: mi / bc1 stays a division.
//  - One pass: p, m, v and g are read once and p, m, v (and the storage-type copy of p for the
//    device) written once. The update is memory-bound, so a second pass would cost a second update.
//  - Threads: the elements are split into one contiguous block per OpenMP thread (aligned to W),
//    but only when there is enough work to pay for waking them.
#include "kernels/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>  // _mm*_sqrt_ps
#endif

namespace nz::cpu_adam {

#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif
typedef float vf __attribute__((vector_size(4 * W)));       // W floats
typedef uint32_t vu32 __attribute__((vector_size(4 * W)));  // the same W floats as bits
typedef uint16_t vu16 __attribute__((vector_size(2 * W)));  // W bf16

int lanes() { return W; }

static inline float sqrt_lanes(float x) { return std::sqrt(x); }
static inline vf sqrt_lanes(vf x) {
#if defined(__AVX512F__)
// GCC 12's own _mm512_sqrt_ps reads an "undefined" vector it then masks away entirely, and warns
// about it where it is inlined (a false alarm in the compiler's header, not here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  return _mm512_sqrt_ps(x);
#pragma GCC diagnostic pop
#elif defined(__AVX__)
  return _mm256_sqrt_ps(x);
#elif defined(__SSE__)
  return _mm_sqrt_ps(x);
#else
  for (int i = 0; i < W; i++) x[i] = std::sqrt(x[i]);
  return x;
#endif
}

// Loads and stores of W elements (unaligned). bf16 -> fp32 is exact (the bits move up 16); fp32 ->
// bf16 rounds to nearest even with NaN kept quiet, the same bit recipe as f32_to_bf16 (dtype.h).
static inline vf load_lanes(const float* x) { vf r; memcpy(&r, x, sizeof r); return r; }
static inline vf load_lanes(const bf16* x) {
  vu16 h;
  memcpy(&h, x, sizeof h);
  return (vf)(__builtin_convertvector(h, vu32) << 16);
}
static inline void store_lanes(float* dst, vf x) { memcpy(dst, &x, sizeof x); }
static inline void store_lanes(bf16* dst, vf x) {
  const vu32 u = (vu32)x;
  const vu32 is_nan = (vu32)((u & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
  const vu32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const vu32 quiet_nan = (u >> 16) | 0x40u;
  const vu16 h = __builtin_convertvector((quiet_nan & is_nan) | (rounded & ~is_nan), vu16);
  memcpy(dst, &h, sizeof h);
}

// fp16: lane by lane through dtype.h's conversions (the same recipe as every other fp16 store).
static inline vf load_lanes(const f16* x) {
  vf r = {};
  for (int i = 0; i < W; i++) r[i] = f16_to_f32(x[i]);
  return r;
}
static inline void store_lanes(f16* dst, vf x) {
  for (int i = 0; i < W; i++) dst[i] = f32_to_f16(x[i]);
}

struct Hyper {
  float lr, b1, b2, one_b1, one_b2, bc1, bc2, eps, wd, gs;
};

// The AdamW update of one element (V = float) or of W elements (V = vf), written exactly as the
// reference writes it: the same operations, the same order, the same roundings.
template <class V>
static inline void adamw_lanes(V& p, V& m, V& v, V g, const Hyper& h) {
  const V gi = g * h.gs;
  const V mi = h.b1 * m + h.one_b1 * gi;
  const V vi = h.b2 * v + h.one_b2 * gi * gi;
  const V mhat = mi / h.bc1;
  const V vhat = vi / h.bc2;
  p = p - h.lr * (mhat / (sqrt_lanes(vhat) + h.eps) + h.wd * p);
  m = mi;
  v = vi;
}

// Elements [begin, end): the vector body, then the scalar tail. h by value: a local copy cannot
// alias p, m or v, so the compiler keeps the constants in registers instead of reloading them
// after every store.
template <class T>
static void update_block(float* p, float* m, float* v, const T* g, T* p_out, size_t begin, size_t end,
                         const Hyper h) {
  size_t i = begin;
  for (; i + W <= end; i += W) {
    vf pi = load_lanes(p + i), mi = load_lanes(m + i), vi = load_lanes(v + i);
    adamw_lanes(pi, mi, vi, load_lanes(g + i), h);  // g[i..] is read before p_out[i..] is written
    store_lanes(p + i, pi);
    store_lanes(m + i, mi);
    store_lanes(v + i, vi);
    if (p_out) store_lanes(p_out + i, pi);
  }
  for (; i < end; i++) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_lanes(pi, mi, vi, load(g[i]), h);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p_out) p_out[i] = store<T>(pi);
  }
}

template <class T>
void adamw_update(float* p, float* m, float* v, const T* g, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t, T* p_out) {
  // The bias corrections, computed once per call as the reference does.
  const float bc1 = 1.0f - powf(beta1, float(t));
  const float bc2 = 1.0f - powf(beta2, float(t));
  const Hyper h{lr, beta1, beta2, 1.0f - beta1, 1.0f - beta2, bc1, bc2, eps, weight_decay, grad_scale};
  // Waking a thread costs microseconds: below 32K elements per thread, fewer threads.
  const size_t min_per_thread = size_t(1) << 15;
  const int threads = int(std::max<size_t>(1, std::min<size_t>(omp_get_max_threads(), n / min_per_thread)));
  if (threads == 1) return update_block(p, m, v, g, p_out, 0, n, h);
#pragma omp parallel num_threads(threads)
  {
    const size_t nt = size_t(omp_get_num_threads()), id = size_t(omp_get_thread_num());
    const size_t block = (n / nt + W - 1) / W * W;  // whole vectors per thread, the last takes the rest
    const size_t begin = std::min(n, id * block), end = id + 1 == nt ? n : std::min(n, begin + block);
    update_block(p, m, v, g, p_out, begin, end, h);
  }
}

template void adamw_update<float>(float*, float*, float*, const float*, size_t, float, float, float, float, float,
                                  float, int, float*);
template void adamw_update<bf16>(float*, float*, float*, const bf16*, size_t, float, float, float, float, float,
                                 float, int, bf16*);
template void adamw_update<f16>(float*, float*, float*, const f16*, size_t, float, float, float, float, float,
                                float, int, f16*);

}  // namespace nz::cpu_adam
