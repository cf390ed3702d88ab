// quantize.h — the project's one block quantizer: symmetric, int8 or int4, one fp32 scale per
// block. ZeRO++ (zeropp/train.cpp) moves parameters as int8 (qwZ) and gradients as int4 (qgZ)
// with it; quantization-aware training and the inference weights can use the same rule.
//
// The rule, for n values x (any storage type, read as fp32) cut into blocks of `block` values
// counted from x[0] (the caller passes a unit, or a slice that starts on a block boundary; the last
// block may be shorter), with qmax = 2^(bits-1) - 1 (127 for int8, 7 for int4):
//   absmax = max |x_i| over the block (fp32)
//   scale  = absmax / qmax, one fp32 division rounded to nearest. If qmax * scale would overflow
//            (absmax within an ulp of FLT_MAX) scale is the next fp32 below, so the largest code
//            still dequantizes to a finite number.
//   q_i    = clamp(round_half_even(x_i / scale), -qmax, qmax): symmetric, -128 (or -8) never used.
//            The division is one fp32 division; ties go to the even integer (nearbyintf in the
//            default rounding mode). The clamp matters only where scale was rounded down: a
//            subnormal scale, or the stepped-down one above.
//   scale == 0 (a block of zeros, or one so small that absmax / qmax underflows to 0): every q_i = 0.
//   dequantized x_i = float(q_i) * scale, one fp32 product, then stored in the output type.
// A block holding a NaN or an infinity has no scale: it gets scale NaN and codes 0, so it
// dequantizes to NaN (an fp16 gradient overflow stays visible to the step's overflow check), and
// quantize_blocks counts it. Callers for which that is an error say so (quantize_finite).
//
// Codes: int8 one byte per value (two's complement); int4 two values per byte, value 2k in the
// low nibble of byte k and value 2k+1 in the high nibble (two's complement nibbles).
// The packed form (what goes on the wire): the codes, then the scales: packed_bytes(n) bytes.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace nz {

struct BlockQuant {
  int bits = 8;        // 8 or 4
  size_t block = 256;  // values per scale
  int qmax() const { return (1 << (bits - 1)) - 1; }
  size_t blocks(size_t n) const { return (n + block - 1) / block; }
  size_t code_bytes(size_t n) const { return (n * size_t(bits) + 7) / 8; }
  // n values as codes followed by their fp32 scales: bits n / 8 + 4 ceil(n / block) bytes
  size_t packed_bytes(size_t n) const { return code_bytes(n) + 4 * blocks(n); }
};

// x (n values of T: float, bf16, f16) -> codes (code_bytes(n)) and scales (blocks(n) floats),
// host memory. Returns the number of blocks that held a NaN or an infinity (see above).
template <class T>
size_t quantize_blocks(const BlockQuant& q, const T* x, size_t n, uint8_t* codes, float* scales);
// out (n values of T: float, bf16, f16) = float(q_i) * scale of its block, stored in T.
template <class T>
void dequantize_blocks(const BlockQuant& q, const uint8_t* codes, const float* scales, size_t n, T* out);

// The packed form: codes then scales in one buffer of q.packed_bytes(n) bytes.
template <class T>
size_t quantize_packed(const BlockQuant& q, const T* x, size_t n, void* packed);
template <class T>
void dequantize_packed(const BlockQuant& q, const void* packed, size_t n, T* out);

// Quantizing values that must be finite (parameters): a NaN or an infinity stops the job with one
// line naming `what` and the first bad element.
template <class T>
void quantize_finite(const BlockQuant& q, const T* x, size_t n, void* packed, const char* what);

// The same on a run's storage type (dt: F32, BF16, F16), for callers that hold untyped buffers, on
// the run's backend: host memory on the CPU, device memory on CUDA (the kernels below).
size_t quantize_packed(const BlockQuant& q, DType dt, const void* x, size_t n, void* packed);
void dequantize_packed(const BlockQuant& q, const void* packed, size_t n, DType dt, void* out);
void quantize_finite(const BlockQuant& q, DType dt, const void* x, size_t n, void* packed, const char* what);
// n values of storage type dt to fp32 and back (store<T>: round to nearest even), on the run's backend.
void to_f32(DType dt, const void* x, size_t n, float* out);
void from_f32(DType dt, const float* x, size_t n, void* out);

// The packed form on device memory: the same rule, layout and bits as the loops above
// (cuda/kernels_quantize.cu; int4 blocks of an even number of values). quantize_packed returns the
// count of NaN blocks, as on the CPU (it waits for the GPU to know it).
namespace quant_cuda {
template <class T>
size_t quantize_packed(const BlockQuant& q, const T* x, size_t n, void* packed);
template <class T>
void dequantize_packed(const BlockQuant& q, const void* packed, size_t n, T* out);
}  // namespace quant_cuda

// Whether a block size is one this project accepts: a power of two from 8 to 65536 (whole bytes of
// int4 codes in every block).
bool valid_quant_block(long block);

}  // namespace nz
