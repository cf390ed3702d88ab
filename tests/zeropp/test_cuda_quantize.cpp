// test_cuda_quantize.cpp — the block quantizer's CUDA kernels (common/kernels/cuda/kernels_quantize.cu)
// against the CPU quantizer (common/kernels/quantize.cpp, itself held to the rule written out in
// test_quantize.cpp) BIT FOR BIT: every packed byte (codes and scales), the count of NaN blocks, and
// every dequantized value (a NaN only as a NaN: its payload is the hardware's), for int8 and int4, fp32, bf16 and fp16 inputs, on the cases where a
// quantizer goes wrong: ties at .5 (rintf rounds them to even, roundf would not), all zeros, one huge
// value, the largest finite value of the type, subnormals, NaN and infinities, a shorter last block
// (odd lengths too), blocks of 8 to 4096 values. Through the untyped calls the trainer uses
// (quantize_packed(q, dt, ...) on device memory), and to_f32/from_f32 on the device.
//
// Runs on the CUDA emulator (tests/cuda/emu_check.sh; tests/zeropp/zeropp.mk builds it into
// build/emu/tests) and on a GPU where built with nvcc (the GPU bundle's quantize row); without
// the CUDA backend or a visible GPU it skips with one line.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/quantize.h"
#include "ledger.h"          // Buffer
#include "runtime/device.h"  // select_device, copy_bytes

using namespace nz;

namespace {

bool gpu_visible() {
#ifdef NZ_HAVE_CUDA
  return cuda_rt::device_count() > 0;
#else
  return false;
#endif
}

// The first element of n (of type dt) whose bits differ, unless both are NaN; n if none. A NaN's bits
// are the hardware's own: x86 passes an operand's NaN on (0 x a NaN scale keeps its sign and payload,
// F16C keeps the payload's top bits), an NVIDIA GPU writes its canonical NaN (fp32 0x7FFFFFFF, fp16
// 0x7FFF; seen on an H200). A NaN must stay a NaN on both; every other value must be the same bits.
size_t first_difference(const void* a, const void* b, size_t n, DType dt) {
  const size_t e = dtype_bytes(dt);
  auto is_nan = [&](const unsigned char* p) {
    if (e == 4) { uint32_t u; memcpy(&u, p, 4); return (u & 0x7FFFFFFFu) > 0x7F800000u; }
    uint16_t u;
    memcpy(&u, p, 2);
    return dt == DType::BF16 ? (u & 0x7FFF) > 0x7F80 : (u & 0x7FFF) > 0x7C00;
  };
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; i++, pa += e, pb += e)
    if (memcmp(pa, pb, e) != 0 && !(is_nan(pa) && is_nan(pb))) return i;
  return n;
}

template <class T> DType dtype_of();
template <> DType dtype_of<float>() { return DType::F32; }
template <> DType dtype_of<bf16>() { return DType::BF16; }
template <> DType dtype_of<f16>() { return DType::F16; }

// Quantizes x with q on the CPU and on the GPU, dequantizes both packed forms on their own backend,
// and requires the same bytes, the same NaN-block count and the same values.
template <class T>
void expect_same_bits(const BlockQuant& q, const std::vector<float>& xf, const std::string& what) {
  const DType dt = dtype_of<T>();
  const size_t n = xf.size(), e = sizeof(T), bytes = q.packed_bytes(n);
  std::vector<T> x(n);
  for (size_t i = 0; i < n; i++) x[i] = store<T>(xf[i]);
  const std::string where = what + ", int" + std::to_string(q.bits) + ", blocks of " +
                            std::to_string(q.block) + ", " + dtype_name(dt) + ", n = " + std::to_string(n);
  // the CPU: the packed buffer starts zeroed, so the unused high nibble of an odd int4 length is 0
  select_device("cpu", 0, false);
  std::vector<uint8_t> want(bytes, 0), got(bytes, 0xAB);
  const size_t want_bad = quantize_packed(q, dt, x.data(), n, want.data());
  std::vector<T> want_back(n), got_back(n);
  dequantize_packed(q, want.data(), n, dt, want_back.data());
  // the GPU, from device memory; the output buffers start poisoned (0xAB)
  select_device("cuda", 0, false);
  size_t got_bad = 0;
  {
    Buffer dx(Category::Scratch, Location::Device, n * e, "x"), dp(Category::Scratch, Location::Device, bytes, "packed");
    Buffer dback(Category::Scratch, Location::Device, n * e, "back");
    copy_bytes(dx.data(), Location::Device, x.data(), Location::Host, n * e);
    copy_bytes(dp.data(), Location::Device, got.data(), Location::Host, bytes);
    got_bad = quantize_packed(q, dt, dx.data(), n, dp.data());
    dequantize_packed(q, dp.data(), n, dt, dback.data());
    copy_bytes(got.data(), Location::Host, dp.data(), Location::Device, bytes);
    copy_bytes(got_back.data(), Location::Host, dback.data(), Location::Device, n * e);
  }
  select_device("cpu", 0, false);
  EXPECT_EQ(got_bad, want_bad) << where;
  size_t first = 0;
  while (first < bytes && got[first] == want[first]) first++;
  EXPECT_EQ(first, bytes) << where << ": packed byte " << first << " (" << (first < q.code_bytes(n) ? "codes" : "scales")
                          << ") differs: gpu " << int(got[first]) << ", cpu " << int(want[first]);
  EXPECT_EQ(first_difference(got_back.data(), want_back.data(), n, dt), n) << where << ": the dequantized values differ";
}

// Each case at every storage type, both widths and a few block sizes.
template <class T>
void expect_same_bits_everywhere(const std::vector<float>& xf, const std::string& what, std::vector<size_t> blocks) {
  for (int bits : {8, 4})
    for (size_t block : blocks) expect_same_bits<T>(BlockQuant{bits, block}, xf, what);
}

// The largest finite value of a storage type: FLT_MAX, bf16's 0x7F7F, fp16's 65504.
template <class T> float largest();
template <> float largest<float>() { return FLT_MAX; }
template <> float largest<bf16>() { return bf16_to_f32(bf16{0x7F7F}); }
template <> float largest<f16>() { return 65504.0f; }

template <class T>
void all_cases() {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto normal = [&](size_t n, float sd) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng) * sd;
    return v;
  };
  // random values, a shorter last block, an outlier every 97
  std::vector<float> x = normal(64 * 37 + 24, 1.0f);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 50;
  expect_same_bits_everywhere<T>(x, "random", {8, 64, 256});
  expect_same_bits_everywhere<T>(normal(4096 * 3, 0.02f), "random, large blocks", {4096});
  // ties: absmax = qmax makes the scale exactly 1, so x / scale = x lands on .5 exactly
  for (float qmax : {127.0f, 7.0f}) {
    std::vector<float> t = {qmax, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.5f, -qmax, 4.5f, -5.5f, 6.5f, -6.5f,
                            qmax - 0.5f, 0.49999997f, -0.50000006f};
    expect_same_bits_everywhere<T>(t, "ties at .5 (qmax " + std::to_string(int(qmax)) + ")", {8, 16});
  }
  expect_same_bits_everywhere<T>(std::vector<float>(40, 0.0f), "all zeros", {8, 16});
  std::vector<float> z(24, 0.0f);
  z[3] = -0.0f;
  expect_same_bits_everywhere<T>(z, "zeros and -0", {8});
  // one huge value flushes the small ones of its block only
  std::vector<float> h = normal(64, 1.0f);
  h[5] = 1e4f;
  expect_same_bits_everywhere<T>(h, "one huge value", {8, 64});
  // the largest finite value: qmax * (max / qmax) overflows in fp32 only for FLT_MAX; the scale steps down
  const float big = largest<T>();
  std::vector<float> m = {big, -big, 1.0f, big / 2, -3.0f, 0.0f, big / 3, 2.0f};
  expect_same_bits_everywhere<T>(m, "the largest finite value", {8});
  // subnormals (fp32 only keeps them as they are; bf16 keeps fp32's range)
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> s = {178 * tiny, -50 * tiny, 2 * tiny, -tiny, FLT_MIN, -FLT_MIN / 3, 3 * tiny, tiny,
                          1e-40f, -2e-41f, 5e-39f, 0.0f, 1e-45f, -1e-44f, 7e-42f, 1e-38f};
  expect_same_bits_everywhere<T>(s, "subnormals", {8});
  // NaN and infinities: their block gets scale NaN and codes 0, and is counted
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> b = normal(48, 1.0f);
    b[9] = bad;
    b[47] = bad;  // in the last block
    expect_same_bits_everywhere<T>(b, "non-finite " + std::to_string(bad), {8, 16});
  }
  // odd lengths: a last block of 1, 3 and 7 values (int4: a last byte with one value)
  for (size_t n : {size_t(1), size_t(3), size_t(8 * 5 + 7), size_t(64 + 1)})
    expect_same_bits_everywhere<T>(normal(n, 1.0f), "odd length", {8, 64});
}

}  // namespace

TEST(CudaQuantize, Fp32IsTheCpusBitForBit) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA quantizer tests";
  all_cases<float>();
}

TEST(CudaQuantize, Bf16IsTheCpusBitForBit) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA quantizer tests";
  all_cases<bf16>();
}

TEST(CudaQuantize, Fp16IsTheCpusBitForBit) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA quantizer tests";
  all_cases<f16>();
}

// The conversions qgZ's sum goes through, on the device: the CPU's bits.
TEST(CudaQuantize, ConversionsToAndFromFp32AreTheCpus) {
  if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the CUDA quantizer tests";
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const size_t n = 1000;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  x[0] = NAN, x[1] = 1e6f, x[2] = -1e-30f;  // a NaN, an fp16 overflow, an fp16 underflow
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const size_t e = dtype_bytes(dt);
    std::vector<char> want_t(n * e), got_t(n * e);
    std::vector<float> want_f(n), got_f(n);
    select_device("cpu", 0, false);
    from_f32(dt, x.data(), n, want_t.data());
    to_f32(dt, want_t.data(), n, want_f.data());
    select_device("cuda", 0, false);
    {
      Buffer dx(Category::Scratch, Location::Device, n * 4, "x"), dt_buf(Category::Scratch, Location::Device, n * e, "t");
      Buffer df(Category::Scratch, Location::Device, n * 4, "f");
      copy_bytes(dx.data(), Location::Device, x.data(), Location::Host, n * 4);
      from_f32(dt, dx.as<float>(), n, dt_buf.data());
      to_f32(dt, dt_buf.data(), n, df.as<float>());
      copy_bytes(got_t.data(), Location::Host, dt_buf.data(), Location::Device, n * e);
      copy_bytes(got_f.data(), Location::Host, df.data(), Location::Device, n * 4);
    }
    select_device("cpu", 0, false);
    EXPECT_EQ(first_difference(got_t.data(), want_t.data(), n, dt), n) << dtype_name(dt);
    EXPECT_EQ(first_difference(got_f.data(), want_f.data(), n, DType::F32), n) << dtype_name(dt);
    EXPECT_TRUE(std::isnan(got_f[0]) && std::isnan(want_f[0])) << dtype_name(dt) << ": NaN stays NaN";
  }
}
