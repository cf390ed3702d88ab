// qat.cpp — the fake quantization of quantization-aware training (qat.h).
#include "compression/qat.h"

#include <algorithm>
#include <vector>

#include "kernels/quantize.h"  // the project's one quantizer
#include "runtime/check.h"

namespace nz {

namespace {

template <class T>
void fake_quantize_t(const BlockQuant& bq, const T* x, size_t n, T* out) {
  // A run of whole blocks at a time through a small scratch (the codes of about 4096 values and
  // their scales: a few KiB, outside the ledger like the kernels' own temporaries), so the only
  // buffer of unit size is `out`. Chunks start on block boundaries, so the blocks are the unit's.
  const size_t chunk = std::max<size_t>(1, 4096 / bq.block) * bq.block;
  std::vector<uint8_t> codes(bq.code_bytes(chunk));
  std::vector<float> scales(bq.blocks(chunk));
  for (size_t i = 0; i < n; i += chunk) {
    const size_t m = std::min(chunk, n - i);
    quantize_blocks(bq, x + i, m, codes.data(), scales.data());
    dequantize_blocks(bq, codes.data(), scales.data(), m, out + i);
  }
}

}  // namespace

void fake_quantize(const QatConfig& q, DType dt, const void* x, size_t n, void* out) {
  NZ_CHECK(q.bits == 8 || q.bits == 4, "fake_quantize: %d bits", q.bits);
  NZ_CHECK(x != out, "fake_quantize: in place would quantize the master");
  const BlockQuant bq{q.bits, q.block};
  NZ_DISPATCH_TRAIN_DTYPE(dt, fake_quantize_t<T>(bq, (const T*)x, n, (T*)out));
}

}  // namespace nz
