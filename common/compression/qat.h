// qat.h — quantization-aware training (--qat int8|int4, docs/compression.md): every unit computes
// with weights that went through the project's block quantizer and back (kernels/quantize.h,
// "fake-quantized"), while the optimizer keeps updating the full-precision weights. The model
// (model.h, GPT::set_qat) does it for every trainer, so no stage file changes: it is not a ZeRO idea.
//
// Which numbers: each unit's Ψ_u parameters (its padding left out, so the blocks are the same at
// any N), cut into blocks of `block` values counted from the unit's first element; the last block
// of a unit that is not a multiple of `block` is a shorter one with its own scale (no padding).
// Every unit is quantized, the layer norms and biases inside a block's unit too (as inference's
// --weights-int8 stores them); --qat-skip embedding keeps the tied embedding (the lookup and the
// LM head) exact.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "layout.h"

namespace nz {

struct QatConfig {
  int bits = 0;             // 8 or 4; 0: off
  size_t block = 64;        // values per fp32 scale (a power of two, kernels/quantize.h)
  bool skip_embed = false;  // --qat-skip embedding
  bool on() const { return bits != 0; }
  // whether unit u computes with fake-quantized parameters
  bool quantizes(const Layout& L, int u) const { return on() && !(skip_embed && u == L.embed_unit()); }
};

// out = dequantize(quantize(x)): n values of storage type dt (host memory), blocks counted from
// x[0], the last one partial; out and x may not overlap (the master is never overwritten).
void fake_quantize(const QatConfig& q, DType dt, const void* x, size_t n, void* out);

}  // namespace nz
