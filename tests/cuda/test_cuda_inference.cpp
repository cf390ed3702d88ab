// test_cuda_inference.cpp — the CUDA decode path (inference/decoder.cpp on the CUDA backend, the
// kernels of inference/kernels_decode.cu) against the CPU decoder, which tests/inference/test_inference.cpp
// checks against the full forward to the bit.
//
// Tolerance on the probabilities, |cuda - cpu| <= 1e-4 in fp32 and 2e-2 in bf16 (absolute; every
// probability is in [0, 1]): the backends do the same fp32 arithmetic in another order (warp sums,
// fused multiply-adds), a few hundred roundings through 2 blocks, as in test_cuda_kernels.cpp; in
// bf16 a stored activation may round to the other side of a boundary (2^-8 relative), which the
// next ops carry along. The int8 dequantisation is one multiply per element: the same bits.
//
// Without the CUDA backend, or without a visible GPU, every test skips with one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "inference/decoder.h"
#include "runtime/device.h"
#include "kernels/kernels.h"
#include "model.h"
#include "kernels/ops.h"
#include "inference/quant.h"
#include "runtime/rng.h"

using namespace nz;

namespace {

bool gpu_visible() {
#ifdef NZ_HAVE_CUDA
  return cuda_rt::device_count() > 0;
#else
  return false;
#endif
}

// Probabilities (B, T, V), one position per step, on the device selected now. With full: the full
// forward over the whole sequence instead (GPT), the decoder's reference.
std::vector<float> decode(const Layout& L, DType dt, const std::vector<float>& f, const std::vector<int>& tokens,
                          int B, bool full) {
  const int T = L.cfg.ctx, V = L.cfg.vocab;
  const size_t e = dtype_bytes(dt);
  std::vector<char> host(f.size() * e);
  if (dt == DType::BF16) cpu::cast<bf16, float>(reinterpret_cast<bf16*>(host.data()), f.data(), f.size());
  else memcpy(host.data(), f.data(), host.size());
  Buffer p(Category::Params, Location::Device, host.size(), "params");
  copy_bytes(p.data(), Location::Device, host.data(), Location::Host, host.size());
  const char* P = p.as<char>();
  std::vector<float> out(size_t(B) * T * V);
  if (full) {
    GPT m(L, dt, B, T);
    std::vector<int> targets(tokens.size(), 0);
    m.set_batch(tokens.data(), targets.data(), B);
    for (int u = 0; u < L.num_units(); u++) m.forward(u, P + L.units[u].offset * e);
    m.head_forward(P);
    for (int r = 0; r < B * T; r++) m.probs_row(r, out.data() + size_t(r) * V);
    return out;
  }
  Decoder d(L, dt, B);
  std::vector<int> step(B);
  for (int s = 0; s < T; s++) {
    for (int b = 0; b < B; b++) step[b] = tokens[size_t(b) * T + s];
    d.set_step(step.data(), s, B);
    for (int u = 0; u < L.num_units(); u++) d.forward(u, P + L.units[u].offset * e);
    d.head_forward(P);
    for (int b = 0; b < B; b++) d.probs_row(b, out.data() + (size_t(b) * T + s) * V);
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

struct Case {
  GPTConfig c{256, 20, 2, 48, 3};  // head size 16 (half a warp), context 20
  Layout L = make_layout(c, 1);
  std::vector<float> f;
  std::vector<int> tokens;
  static constexpr int B = 3;
  Case() {
    f.assign(L.padded_total, 0.0f);
    for (int u = 0; u < L.num_units(); u++) init_unit(L, u, 21, f.data() + L.units[u].offset);
    for (float& x : f) x *= 8.0f;  // attention far from uniform
    Rng rng(4);
    for (int i = 0; i < B * c.ctx; i++) tokens.push_back(int(rng.next() % 256));
  }
};

}  // namespace

TEST(CudaDecoder, MatchesTheCpuDecoderAtEveryPosition) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA decode tests";
  Case s;
  for (Kernels k : {Kernels::Reference, Kernels::Fast})
    for (DType dt : {DType::F32, DType::BF16}) {
      set_kernels(k);
      select_device("cpu", 0, false);
      const std::vector<float> cpu_probs = decode(s.L, dt, s.f, s.tokens, s.B, false);
      select_device("cuda", 0, false);
      const std::vector<float> gpu_probs = decode(s.L, dt, s.f, s.tokens, s.B, false);
      const double worst = max_diff(cpu_probs, gpu_probs);
      EXPECT_LE(worst, dt == DType::F32 ? 1e-4 : 2e-2) << kernels_name(k) << " " << dtype_name(dt);
      printf("%s kernels, %s: largest |cuda - cpu| probability difference %.3g\n", kernels_name(k), dtype_name(dt),
             worst);
      select_device("cpu", 0, false);
    }
  set_kernels(Kernels::Fast);
}

// On the GPU itself, the cache against the full forward (the CUDA attention kernel's rows).
TEST(CudaDecoder, MatchesTheFullForwardOnTheGpu) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA decode tests";
  Case s;
  set_kernels(Kernels::Reference);
  select_device("cuda", 0, false);
  const double worst = max_diff(decode(s.L, DType::F32, s.f, s.tokens, s.B, true),
                                decode(s.L, DType::F32, s.f, s.tokens, s.B, false));
  EXPECT_LE(worst, 1e-4);
  printf("cuda, reference kernels: largest |cache - full forward| probability difference %.3g\n", worst);
  select_device("cpu", 0, false);
  set_kernels(Kernels::Fast);
}

TEST(CudaDecoder, Int8DequantisationIsTheCpusBitForBit) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA decode tests";
  const size_t n = 1000;  // not a multiple of the block
  Rng rng(8);
  std::vector<float> w(n), want(n), got(n);
  for (float& x : w) x = rng.normal();
  std::vector<int8_t> q(n);
  std::vector<float> sc((n + 63) / 64);
  quantize_int8(w.data(), n, q.data(), sc.data());
  select_device("cpu", 0, false);
  dequantize_int8<float>(want.data(), q.data(), sc.data(), n);
  select_device("cuda", 0, false);
  {
    Buffer dq(Category::Scratch, Location::Device, n, "q"), ds(Category::Scratch, Location::Device, sc.size() * 4, "s");
    Buffer dout(Category::Scratch, Location::Device, n * 4, "out");
    copy_bytes(dq.data(), Location::Device, q.data(), Location::Host, n);
    copy_bytes(ds.data(), Location::Device, sc.data(), Location::Host, sc.size() * 4);
    dequantize_int8<float>(dout.as<float>(), dq.as<int8_t>(), ds.as<float>(), n);
    copy_bytes(got.data(), Location::Host, dout.data(), Location::Device, n * 4);
  }
  select_device("cpu", 0, false);
  EXPECT_EQ(memcmp(want.data(), got.data(), n * 4), 0);
}
