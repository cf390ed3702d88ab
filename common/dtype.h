// dtype.h — storage types: fp32, bf16 (16-bit storage, fp32 arithmetic), and the accumulator trait.
#pragma once
#include <cstdint>
#include <cstring>
#include <cstddef>

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

// Load/store any storage type through its arithmetic type.
NZ_HD inline float load(float x) { return x; }
NZ_HD inline double load(double x) { return x; }
NZ_HD inline float load(bf16 x) { return bf16_to_f32(x); }
template <class T> NZ_HD inline T store(float x);
template <> NZ_HD inline float store<float>(float x) { return x; }
template <> NZ_HD inline bf16 store<bf16>(float x) { return f32_to_bf16(x); }
template <class T> NZ_HD inline T store(double x);
template <> NZ_HD inline double store<double>(double x) { return x; }
template <> NZ_HD inline float store<float>(double x) { return float(x); }
template <> NZ_HD inline bf16 store<bf16>(double x) { return f32_to_bf16(float(x)); }

// Arithmetic type: fp32 for fp32 and bf16 storage, double for the double-precision test build.
template <class T> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };
template <class T> using acc_t = typename acc_type<T>::type;

// The run-time choice of storage type for params, grads and activations (--precision fp32|bf16).
// F64 exists only for the CPU finite-difference tests of the whole model.
enum class DType { F32, BF16, F64 };
inline size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : d == DType::BF16 ? 2 : 8; }
inline const char* dtype_name(DType d) { return d == DType::F32 ? "fp32" : d == DType::BF16 ? "bf16" : "fp64"; }

}  // namespace nz
