// quantize.cpp — the block quantizer (quantize.h): the rule written out there, as plain loops.
#include "kernels/quantize.h"

#include <cfloat>   // FLT_MAX
#include <cmath>    // std::nearbyint, std::isfinite, std::nextafter
#include <cstring>  // memcpy
#include <algorithm>  // std::min
#include <vector>

#include "kernels/ops.h"      // ops::cast: the conversions on the run's backend
#include "runtime/check.h"
#include "runtime/device.h"  // current_device, copy_bytes

namespace nz {

bool valid_quant_block(long block) { return block >= 8 && block <= 65536 && (block & (block - 1)) == 0; }

// begin exercise: zeropp_block_quantizer
// The scale of one block (quantize.h): absmax / qmax, stepped down one ulp if qmax * scale would
// overflow; NaN when the block holds a NaN or an infinity.
template <class T>
static float block_scale(const T* x, size_t n, int qmax) {
  float absmax = 0;
  for (size_t i = 0; i < n; i++) {
    const float v = load(x[i]);
    if (!std::isfinite(v)) return NAN;
    absmax = std::fmax(absmax, std::fabs(v));
  }
  float scale = absmax / float(qmax);
  if (float(qmax) * scale > FLT_MAX) scale = std::nextafter(scale, 0.0f);
  return scale;
}

// One value's code: clamp(round_half_even(x / scale), -qmax, qmax); 0 when the scale is 0 or NaN.
static int code_of(float x, float scale, int qmax) {
  if (!(scale > 0)) return 0;
  const float r = std::nearbyint(x / scale);  // the default rounding mode: ties to even
  return int(std::fmin(float(qmax), std::fmax(-float(qmax), r)));
}
// end exercise: zeropp_block_quantizer

static void put_code(uint8_t* codes, int bits, size_t i, int q) {
  if (bits == 8) {
    codes[i] = uint8_t(int8_t(q));
  } else {  // int4: value 2k in the low nibble of byte k, value 2k+1 in the high nibble
    const uint8_t nib = uint8_t(q) & 0xF;
    uint8_t& b = codes[i / 2];
    b = (i % 2 == 0) ? uint8_t((b & 0xF0) | nib) : uint8_t((b & 0x0F) | (nib << 4));
  }
}

static int get_code(const uint8_t* codes, int bits, size_t i) {
  if (bits == 8) return int8_t(codes[i]);
  const uint8_t nib = (i % 2 == 0) ? (codes[i / 2] & 0xF) : (codes[i / 2] >> 4);
  return int8_t(uint8_t(nib << 4)) >> 4;  // sign-extend the nibble
}

template <class T>
size_t quantize_blocks(const BlockQuant& q, const T* x, size_t n, uint8_t* codes, float* scales) {
  NZ_CHECK(q.bits == 8 || q.bits == 4, "quantize: %d bits, expected 8 or 4", q.bits);
  NZ_CHECK(q.block >= 1, "quantize: a block of 0 values");
  // begin exercise: zeropp_block_quantizer
  const size_t nb = q.blocks(n);
  const int qmax = q.qmax();
  size_t bad = 0;
  // blocks are independent, and int4 blocks start on a whole byte when the block is even
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n > (1 << 16) && q.block % 2 == 0)
  for (size_t b = 0; b < nb; b++) {
    const size_t begin = b * q.block, end = std::min(n, begin + q.block);
    const float scale = block_scale(x + begin, end - begin, qmax);
    scales[b] = scale;
    bad += std::isnan(scale) ? 1 : 0;
    for (size_t i = begin; i < end; i++) put_code(codes, q.bits, i, code_of(load(x[i]), scale, qmax));
  }
  return bad;
  // end exercise: zeropp_block_quantizer
}

template <class T>
void dequantize_blocks(const BlockQuant& q, const uint8_t* codes, const float* scales, size_t n, T* out) {
  NZ_CHECK(q.bits == 8 || q.bits == 4, "dequantize: %d bits, expected 8 or 4", q.bits);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (size_t i = 0; i < n; i++) out[i] = store<T>(float(get_code(codes, q.bits, i)) * scales[i / q.block]);
}

template <class T>
size_t quantize_packed(const BlockQuant& q, const T* x, size_t n, void* packed) {
  uint8_t* codes = static_cast<uint8_t*>(packed);
  std::vector<float> scales(q.blocks(n));
  const size_t bad = quantize_blocks(q, x, n, codes, scales.data());
  memcpy(codes + q.code_bytes(n), scales.data(), 4 * scales.size());  // the scales follow the codes
  return bad;
}

template <class T>
void dequantize_packed(const BlockQuant& q, const void* packed, size_t n, T* out) {
  const uint8_t* codes = static_cast<const uint8_t*>(packed);
  std::vector<float> scales(q.blocks(n));
  memcpy(scales.data(), codes + q.code_bytes(n), 4 * scales.size());
  dequantize_blocks(q, codes, scales.data(), n, out);
}

// x (host memory) holds a NaN or an infinity: one line naming `what` and the first bad element.
template <class T>
[[noreturn]] static void report_non_finite(const BlockQuant& q, const T* x, size_t n, const char* what) {
  size_t i = 0;
  while (i < n && std::isfinite(load(x[i]))) i++;
  job_error("%s: element %zu is %s, expected finite values to quantize to int%d; the run diverged: lower --lr "
            "or resume from an earlier checkpoint", what, i, std::isnan(load(x[i])) ? "NaN" : "infinite", q.bits);
}

template <class T>
void quantize_finite(const BlockQuant& q, const T* x, size_t n, void* packed, const char* what) {
  if (quantize_packed(q, x, n, packed) == 0) return;
  report_non_finite(q, x, n, what);
}

// On the run's storage type: one switch, so that no caller reads one type's bits as another's.
#define NZ_ON_DTYPE(dt, ...)                                                      \
  switch (dt) {                                                                   \
    case DType::F32: { using T = float; __VA_ARGS__; } break;                     \
    case DType::BF16: { using T = bf16; __VA_ARGS__; } break;                     \
    case DType::F16: { using T = f16; __VA_ARGS__; } break;                       \
    default: NZ_CHECK(false, "quantize: storage type %s", dtype_name(dt));        \
  }

// On CUDA the buffers are device memory: the kernels of cuda/kernels_quantize.cu and the casts.
static bool on_gpu() { return current_device() == Device::CUDA; }

size_t quantize_packed(const BlockQuant& q, DType dt, const void* x, size_t n, void* packed) {
  size_t bad = 0;
#ifdef NZ_HAVE_CUDA
  if (on_gpu()) {
    NZ_ON_DTYPE(dt, bad = quant_cuda::quantize_packed(q, static_cast<const T*>(x), n, packed));
    return bad;
  }
#endif
  NZ_ON_DTYPE(dt, bad = quantize_packed(q, static_cast<const T*>(x), n, packed));
  return bad;
}
void dequantize_packed(const BlockQuant& q, const void* packed, size_t n, DType dt, void* out) {
#ifdef NZ_HAVE_CUDA
  if (on_gpu()) {
    NZ_ON_DTYPE(dt, quant_cuda::dequantize_packed(q, packed, n, static_cast<T*>(out)));
    return;
  }
#endif
  NZ_ON_DTYPE(dt, dequantize_packed(q, packed, n, static_cast<T*>(out)));
}
void quantize_finite(const BlockQuant& q, DType dt, const void* x, size_t n, void* packed, const char* what) {
  if (quantize_packed(q, dt, x, n, packed) == 0) return;
  std::vector<char> host(n * dtype_bytes(dt));  // the bad element is looked for on the host
  copy_bytes(host.data(), Location::Host, x, on_gpu() ? Location::Device : Location::Host, host.size());
  NZ_ON_DTYPE(dt, report_non_finite(q, reinterpret_cast<const T*>(host.data()), n, what));
}
void to_f32(DType dt, const void* x, size_t n, float* out) {
  if (on_gpu()) {
    NZ_ON_DTYPE(dt, ops::cast<float, T>(out, static_cast<const T*>(x), n));
    return;
  }
  NZ_ON_DTYPE(dt, for (size_t i = 0; i < n; i++) out[i] = load(static_cast<const T*>(x)[i]));
}
void from_f32(DType dt, const float* x, size_t n, void* out) {
  if (on_gpu()) {
    NZ_ON_DTYPE(dt, ops::cast<T, float>(static_cast<T*>(out), x, n));
    return;
  }
  NZ_ON_DTYPE(dt, for (size_t i = 0; i < n; i++) static_cast<T*>(out)[i] = store<T>(x[i]));
}

#define NZ_QUANTIZE_INSTANTIATE(T)                                                                        \
  template size_t quantize_blocks<T>(const BlockQuant&, const T*, size_t, uint8_t*, float*);             \
  template void dequantize_blocks<T>(const BlockQuant&, const uint8_t*, const float*, size_t, T*);       \
  template size_t quantize_packed<T>(const BlockQuant&, const T*, size_t, void*);                        \
  template void dequantize_packed<T>(const BlockQuant&, const void*, size_t, T*);                        \
  template void quantize_finite<T>(const BlockQuant&, const T*, size_t, void*, const char*);
NZ_QUANTIZE_INSTANTIATE(float)
NZ_QUANTIZE_INSTANTIATE(bf16)
NZ_QUANTIZE_INSTANTIATE(f16)

}  // namespace nz
