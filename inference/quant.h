// quant.h — int8 weights: symmetric, block-wise, one fp32 scale per block of 64 (generate and
// gpt_eval --weights-int8).
//
// A block's scale is max|w| / 127 and its weights are round(w / scale), so w ≈ q · scale with
// |w - q·scale| <= scale / 2 for every element. Blocks start at each unit's first element (a unit
// is quantised, moved and dequantised on its own); the last block of a unit may be shorter.
// A unit of n weights takes n bytes plus 4·ceil(n/64) for the scales: 4/(1 + 4/64) = 3.76 times
// fewer bytes than fp32, 1.88 times fewer than bf16.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/quantize.h"  // BlockQuant: the one block quantizer (int4)
#include "layout.h"

namespace nz {

constexpr int kQuantBlock = 64;

// Bytes of one unit of n weights as int8: the weights, padded to 4 bytes, then the fp32 scales.
inline size_t int8_unit_bytes(size_t n) {
  return (n + 3) / 4 * 4 + 4 * ((n + kQuantBlock - 1) / kQuantBlock);
}
// Layout of a quantised unit inside its int8_unit_bytes: q at 0, scales at this offset.
inline size_t int8_scales_offset(size_t n) { return (n + 3) / 4 * 4; }

// n weights (fp32, host) -> q (n int8) and scales (ceil(n/64) floats), host.
void quantize_int8(const float* w, size_t n, int8_t* q, float* scales);
// out (n, storage type T) = q · scale of its block, on this run's device (CPU loop or CUDA kernel).
template <class T>
void dequantize_int8(T* out, const int8_t* q, const float* scales, size_t n);

namespace decode_cuda {  // inference/kernels_decode.cu
template <class T>
void dequantize_int8(T* out, const int8_t* q, const float* scales, size_t n);
}

// The padded model (N = 1, fp32, host) with every unit quantised and dequantised again, except the
// tied embedding when keep_embed: what --weights-int8 runs, for gpt_eval's loss.
void int8_roundtrip(const Layout& L, std::vector<float>* params, bool keep_embed);

// ---- int4 weights (generate and gpt_eval --weights-int4) ----
// The project's one block quantizer (kernels/quantize.h: symmetric, scale absmax / 7, round half
// to even, codes in -7..7), two codes per byte, one fp32 scale per block of --int4-block values
// (a power of two from 8 to 65536; default kInt4Block). Blocks start at each unit's first element;
// a unit whose size is not a multiple of the block ends in a shorter block (nothing is padded).
// A unit of n weights: ceil(n/2) bytes of codes, then 4 ceil(n/B) of scales (quantize.h's packed
// form): 4/(1/2 + 4/64) = 7.1 times fewer bytes than fp32 at B = 64. The tied embedding (also the
// LM head) stays in the storage type by default: int4 there costs +0.14 nats on a trained `small`.
// The default block is --qat's (qat.h): a model trained with --qat int4 --qat-skip embedding is
// served on exactly the grid it was trained on (the same quantizer, blocks from each unit's start).
constexpr size_t kInt4Block = 64;
inline BlockQuant int4_quant(size_t block) { return BlockQuant{4, block}; }
inline size_t int4_unit_bytes(size_t n, size_t block) { return int4_quant(block).packed_bytes(n); }
// What --weights-int4 runs (generate dequantises the same codes on the CPU), for gpt_eval's loss.
void int4_roundtrip(const Layout& L, std::vector<float>* params, bool keep_embed, size_t block);

}  // namespace nz
