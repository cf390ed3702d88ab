// quant.cpp — int8 block quantisation (quant.h).
#include "inference/quant.h"

#include <cmath>
#include <vector>

#include "runtime/device.h"

namespace nz {

void quantize_int8(const float* w, size_t n, int8_t* q, float* scales) {
  for (size_t b0 = 0; b0 < n; b0 += kQuantBlock) {
    const size_t b1 = std::min(n, b0 + kQuantBlock);
    float amax = 0.0f;
    for (size_t i = b0; i < b1; i++) amax = std::max(amax, std::fabs(w[i]));
    const float scale = amax / 127.0f;  // the largest |w| maps to ±127
    scales[b0 / kQuantBlock] = scale;
    for (size_t i = b0; i < b1; i++)
      q[i] = scale > 0 ? int8_t(std::lrint(std::min(127.0f, std::max(-127.0f, w[i] / scale)))) : int8_t(0);
  }
}

template <class T>
void dequantize_int8(T* out, const int8_t* q, const float* scales, size_t n) {
#ifdef NZ_HAVE_CUDA
  if (current_device() == Device::CUDA) return decode_cuda::dequantize_int8<T>(out, q, scales, n);
#endif
  for (size_t i = 0; i < n; i++) out[i] = store<T>(float(q[i]) * scales[i / kQuantBlock]);
}
template void dequantize_int8<float>(float*, const int8_t*, const float*, size_t);
template void dequantize_int8<bf16>(bf16*, const int8_t*, const float*, size_t);

void int8_roundtrip(const Layout& L, std::vector<float>* params, bool keep_embed) {
  for (int u = 0; u < L.num_units(); u++) {
    if (keep_embed && u == L.embed_unit()) continue;
    const size_t n = L.units[u].padded;
    float* w = params->data() + L.units[u].offset;
    std::vector<int8_t> q(n);
    std::vector<float> s((n + kQuantBlock - 1) / kQuantBlock);
    quantize_int8(w, n, q.data(), s.data());
    for (size_t i = 0; i < n; i++) w[i] = float(q[i]) * s[i / kQuantBlock];  // the CPU dequantisation
  }
}

void int4_roundtrip(const Layout& L, std::vector<float>* params, bool keep_embed, size_t block) {
  const BlockQuant q = int4_quant(block);
  for (int u = 0; u < L.num_units(); u++) {
    if (keep_embed && u == L.embed_unit()) continue;
    const size_t n = L.units[u].padded;
    float* w = params->data() + L.units[u].offset;
    std::vector<uint8_t> packed(q.packed_bytes(n));
    quantize_finite(q, w, n, packed.data(), ("int4 weights, unit " + L.units[u].name).c_str());
    dequantize_packed(q, packed.data(), n, w);
  }
}

}  // namespace nz
