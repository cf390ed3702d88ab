// dtype.h — storage types: fp32, bf16 and fp16 (16-bit storage, fp32 arithmetic), and the
// accumulator trait.
#pragma once
#include <cstdint>
#include <cstring>
#include <cstddef>
#if defined(__CUDA_ARCH__)
#include <cuda_fp16.h>  // __half: the GPU's own conversion instructions
#elif defined(__F16C__)
#include <immintrin.h>  // _cvtsh_ss, _cvtss_sh: the CPU's own (x86 F16C)
#endif
// (64-bit ARM needs no header: every ARMv8 CPU converts fp16 <-> fp32 itself, FCVT, through GCC's
// __fp16 storage type, which is IEEE binary16 there.)

#if defined(__CUDACC__)
#define NZ_HD __host__ __device__
#else
#define NZ_HD
#endif

namespace nz {

// bf16: the top 16 bits of an IEEE fp32. Same layout as CUDA's __nv_bfloat16.
struct bf16 {
  uint16_t bits;
};

NZ_HD inline float bf16_to_f32(bf16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even (NaN stays NaN).
NZ_HD inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// fp16: IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits; largest finite 65504, smallest
// normal 2^-14, subnormals down to 2^-24). Same layout as CUDA's __half. Its range is why fp16
// training needs loss scaling (loss_scale.h); bf16 keeps fp32's range and does not.
struct f16 {
  uint16_t bits;
};

// The conversions in bits, for a CPU without F16C (and as the lesson); f16_to_f32 and f32_to_f16
// below use the hardware's instructions where there are some (x86 with F16C, every 64-bit ARM): the
// same results (tests/test_kernels checks both against a derivation from the definition, on all
// 65536 values and every rounding boundary).
// Exact: every fp16 is an fp32.
NZ_HD inline float f16_to_f32_soft(f16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16, exp = (x.bits >> 10) & 0x1fu, mant = x.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf, or NaN with its payload
  } else if (exp == 0) {                    // zero or subnormal: mant * 2^-24, exact in fp32
    float f = float(mant) * 5.9604644775390625e-08f;
    memcpy(&u, &f, 4);
    u |= sign;
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);  // rebias the exponent: 127 - 15 = 112
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even: overflow (|x| >= 65520) becomes inf, tiny values become fp16
// subnormals or zero, NaN stays NaN (quiet).
NZ_HD inline f16 f32_to_f16_soft(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN, made quiet
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // 65520 and up: halfway to 2^16 or more
  if (a >= 0x38800000u) {  // a normal fp16 (2^-14 and up): drop 13 mantissa bits, rounding
    uint32_t h = (a - 0x38000000u) >> 13, rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // a carry moves into the exponent
    return f16{uint16_t(sign | h)};
  }
  if (a <= 0x33000000u) return f16{sign};  // 2^-25 and less: to zero (2^-25 itself is a tie, to even 0)
  // subnormal: the value in units of 2^-24 is mant * 2^(e - 126), e = fp32 biased exponent 102..112
  const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) h++;
  return f16{uint16_t(sign | h)};
}

NZ_HD inline float f16_to_f32(f16 x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(x.bits));
#elif defined(__F16C__)
  return _cvtsh_ss(x.bits);
#elif defined(__aarch64__)
  __fp16 h;
  memcpy(&h, &x.bits, 2);
  return float(h);
#else
  return f16_to_f32_soft(x);
#endif
}
NZ_HD inline f16 f32_to_f16(float f) {
#if defined(__CUDA_ARCH__)
  return f16{__half_as_ushort(__float2half_rn(f))};
#elif defined(__F16C__)
  return f16{uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#elif defined(__aarch64__)  // FCVT rounds as the FPCR says: to nearest even, Linux's default
  const __fp16 h = __fp16(f);
  f16 r;
  memcpy(&r.bits, &h, 2);
  return r;
#else
  return f32_to_f16_soft(f);
#endif
}

// Load/store any storage type through its arithmetic type.
NZ_HD inline float load(float x) { return x; }
NZ_HD inline double load(double x) { return x; }
NZ_HD inline float load(bf16 x) { return bf16_to_f32(x); }
NZ_HD inline float load(f16 x) { return f16_to_f32(x); }
template <class T> NZ_HD inline T store(float x);
template <> NZ_HD inline float store<float>(float x) { return x; }
template <> NZ_HD inline bf16 store<bf16>(float x) { return f32_to_bf16(x); }
template <> NZ_HD inline f16 store<f16>(float x) { return f32_to_f16(x); }
template <class T> NZ_HD inline T store(double x);
template <> NZ_HD inline double store<double>(double x) { return x; }
template <> NZ_HD inline float store<float>(double x) { return float(x); }
template <> NZ_HD inline bf16 store<bf16>(double x) { return f32_to_bf16(float(x)); }
template <> NZ_HD inline f16 store<f16>(double x) { return f32_to_f16(float(x)); }

// Arithmetic type: fp32 for fp32, bf16 and fp16 storage, double for the double-precision test build.
template <class T> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };
template <class T> using acc_t = typename acc_type<T>::type;

// The run-time choice of storage type for params, grads and activations (--precision
// fp32|bf16|fp16). F64 exists only for the CPU finite-difference tests of the whole model.
enum class DType { F32, BF16, F64, F16 };
inline size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : d == DType::F64 ? 8 : 2; }
inline const char* dtype_name(DType d) {
  return d == DType::F32 ? "fp32" : d == DType::BF16 ? "bf16" : d == DType::F16 ? "fp16" : "fp64";
}

// Runs the statements with T bound to the storage type of dt: NZ_DISPATCH_DTYPE(dt, f<T>(x)).
#define NZ_DISPATCH_DTYPE(dt, ...)                                 \
  switch (dt) {                                                    \
    case ::nz::DType::F32: { using T = float; __VA_ARGS__; break; }  \
    case ::nz::DType::BF16: { using T = ::nz::bf16; __VA_ARGS__; break; } \
    case ::nz::DType::F16: { using T = ::nz::f16; __VA_ARGS__; break; }   \
    case ::nz::DType::F64: { using T = double; __VA_ARGS__; break; }      \
  }
// The same for the training types only (fp32, bf16, fp16): the host-side code paths that have no
// double instantiation (checkpoints, the optimizer, the host AdamW).
#define NZ_DISPATCH_TRAIN_DTYPE(dt, ...)                           \
  switch (dt) {                                                    \
    case ::nz::DType::F32: { using T = float; __VA_ARGS__; break; }  \
    case ::nz::DType::BF16: { using T = ::nz::bf16; __VA_ARGS__; break; } \
    case ::nz::DType::F16: { using T = ::nz::f16; __VA_ARGS__; break; }   \
    case ::nz::DType::F64: NZ_CHECK(false, "fp64 is only for the finite-difference tests"); break; \
  }

}  // namespace nz
