// test_cuda_kernels.cpp — every CUDA kernel (common/kernels/cuda/) against the CPU reference (nz::cpu::*,
// common/kernels/kernels_cpu.cpp), which test_kernels.cpp checks against finite differences.
//
//  - CudaKernels/fp32, CudaKernels/bf16, CudaKernels/fp16: each op on fresh random inputs of awkward sizes (none a
//    multiple of a block, a tile or a warp), identical inputs on both backends, every GPU output
//    poisoned with NaN bytes (0xFF) first so an element a kernel forgets to write fails; weight
//    gradients start from random values so "+=" is checked too; both matmul implementations.
//  - CudaCast: the four casts, bit for bit (special values included); fp16's too, NaN aside (a GPU
//    writes its own NaN pattern: only "NaN stays NaN" is asked of it).
//  - CudaKernels/*.ColumnSumsOverManyRows: the two-pass column sums (bias and layer norm parameter
//    gradients) with 1, 4 and 256 row chunks, against the CPU and bit for bit on a second run.
//  - CudaKernels/*.Fused*: the fused ops (residual + layer norm, bias + GELU and their backwards).
//  - CudaKernels/*.RunToRunBitwise: running a kernel twice gives the same bits (no float atomics),
//    flash attention's tensor-core kernels included.
//  - CudaKernels/*.Vocabulary*: the tensor rung's vocabulary pieces (the lookup of the rows a rank holds,
//    its gradient, the bias add, the ladder's embedding backward with its position part alone) bit for
//    bit; the vocabulary-parallel cross-entropy's kernels bit for bit where they take a max or move one
//    value, within the fp32 tolerance where they add exponentials.
//  - CudaSwapBlocks: ulysses' layout change (kernels/swap_blocks.h) bit for bit the CPU reference, in
//    4-, 2- and 1-byte words, and the reference against the index formula it stands for.
//  - CudaKernels/{bf16,fp16}.FlashAttentionLongSequence: the tensor-core flash kernels at T = 1024
//    (many key and query tiles through the double buffers), head size 64 and 128, within the
//    derived bound, and bit for bit on a second run.
//
// Tolerances (|gpu - cpu| <= rel * |cpu| + floor * max|cpu| over the tensor): the two backends do
// the same fp32 arithmetic in a different order (warp-strided sums, fused multiply-adds), so
//   fp32: rel 1e-4, floor 2e-5   — a few hundred fp32 roundings of headroom;
//   bf16: rel 2e-2, floor 2e-3   — ~2.5 bf16 ulps (2^-7 relative): the fp32 results agree, but the
//         final rounding to bf16 can fall on either side of a rounding boundary;
//   fp16: rel 3e-3, floor 3e-4   — the same ~2.5 ulps at fp16's 2^-10;
//   sum_squares, AdamW and accumulate: bit for bit (the CPU adds and rounds where the kernel does).
//
// Without the CUDA backend (no NZ_HAVE_CUDA), or without a visible GPU at run time, every test
// skips in the fixture's SetUp with one line saying so.
#include <gtest/gtest.h>  // TEST_F, TYPED_TEST, GTEST_SKIP, EXPECT_*

#include <cmath>        // std::fabs, std::isnan, INFINITY, NAN
#include <cstdint>      // uint32_t
#include <cstdio>       // printf
#include <cstring>      // std::memcmp, std::memcpy, std::memset
#include <fstream>      // /proc/self/maps
#include <string>       // std::string (test names)
#include <type_traits>  // std::is_same_v
#include <vector>

#include "runtime/device.h"             // nz::cuda_rt: device memory, device_count
#include "kernels/dtype.h"              // nz::bf16, nz::load, nz::store
#include "kernels/cuda/flash_attention.h"  // nz::cuda::flash_attention_uses_wmma (a header function)
#include "kernels/kernels.h"            // nz::cpu::*, nz::cuda::*, nz::set_kernels
#include "kernels/swap_blocks.h"        // nz::ref::swap_blocks, nz::cuda::swap_blocks (ulysses' layouts)
#include "runtime/rng.h"                // nz::Rng

#ifdef NZ_CUBLAS_DLOPEN
#include <cublas_v2.h>  // cublasGetStatusString
#endif

namespace {

using nz::bf16;
namespace cpu = nz::cpu;
#ifdef NZ_HAVE_CUDA
namespace gpu = nz::cuda;
#else
// Without the CUDA backend there are no nz::cuda kernels to link against. Every test skips in
// SetUp before its body runs; pointing `gpu` at the CPU kernels just keeps the bodies compiling.
namespace gpu = nz::cpu;
#endif
using nz::Kernels;

// --kernels: the hand-written CUDA kernels (reference) and cuBLAS (fast)
const Kernels kKernelChoices[] = {Kernels::Reference, Kernels::Fast};

// ---------------------------------------------------------------------------------------------
// cuBLAS is opened by its first call (common/kernels/cuda/cublas_dlopen.cpp), not mapped when the
// program starts: a CPU run never pays for loading it. Needs no GPU: the status string is host code.

bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublas") != std::string::npos) return true;
  return false;
}

TEST(CublasLoading, OpenedByTheFirstCallNotAtStart) {
#ifdef NZ_CUBLAS_DLOPEN
  EXPECT_FALSE(cublas_mapped()) << "libcublas is mapped before any cuBLAS call: linked, not opened on demand";
  const char* said = cublasGetStatusString(CUBLAS_STATUS_SUCCESS);  // cuBLAS's own words ("success")
  ASSERT_NE(said, nullptr);
  EXPECT_GT(std::string(said).size(), 0u);
  EXPECT_TRUE(cublas_mapped()) << "the first cuBLAS call did not open libcublas";
#else
  GTEST_SKIP() << "cuBLAS is not opened on demand in this build (no CUDA toolkit, the emulator, or the GPU bundle)";
#endif
}

// ---------------------------------------------------------------------------------------------
// fixtures: skip without a GPU

#ifdef NZ_HAVE_CUDA
bool gpu_visible() {
  static const bool visible = nz::cuda_rt::device_count() > 0;
  return visible;
}
#endif

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef NZ_HAVE_CUDA
    GTEST_SKIP() << "no CUDA GPU visible: skipping CUDA kernel tests (CUDA backend not compiled in)";
#else
    if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping CUDA kernel tests";
#endif
  }
};

// The per-dtype tests: CudaKernels/fp32.*, CudaKernels/bf16.* and CudaKernels/fp16.*
template <class T>
class CudaKernels : public CudaTest {};
using StorageTypes = ::testing::Types<float, bf16, nz::f16>;
struct StorageTypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, bf16> ? "bf16" : "fp16";
  }
};
TYPED_TEST_SUITE(CudaKernels, StorageTypes, StorageTypeNames);

using CudaCast = CudaTest;

// ---------------------------------------------------------------------------------------------
// helpers

// A device array of n elements that frees itself. Copies are synchronous (cudaMemcpy on the
// default stream), so a download sees the results of every kernel launched before it.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n)
      : n_(n), p_(static_cast<T*>(nz::cuda_rt::malloc_device(n * sizeof(T)))) {}
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(DeviceArray&& o) noexcept : n_(o.n_), p_(o.p_) { o.p_ = nullptr; }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (p_) nz::cuda_rt::free_device(p_);
  }

  // All bytes 0xFF: NaN in fp32 and in bf16, so an element a kernel does not write is caught.
  static DeviceArray poisoned(size_t n) {
    DeviceArray a(n);
    a.poison();
    return a;
  }

  T* ptr() { return p_; }
  const T* ptr() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    nz::cuda_rt::memcpy_any(p_, host.data(), n_ * sizeof(T));
  }
  void poison() {
    std::vector<unsigned char> ff(n_ * sizeof(T), 0xFF);
    nz::cuda_rt::memcpy_any(p_, ff.data(), ff.size());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    nz::cuda_rt::memcpy_any(host.data(), p_, n_ * sizeof(T));
    return host;
  }

 private:
  size_t n_;
  T* p_;
};

// A host array of n poisoned elements (the CPU reference's outputs start the same way).
template <class T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> v(n);
  std::memset(v.data(), 0xFF, n * sizeof(T));
  return v;
}

// n values uniform in [lo, hi), rounded to T: both backends then read exactly the same inputs.
template <class T>
std::vector<T> random_array(nz::Rng& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<T> v(n);
  for (T& x : v) x = nz::store<T>(lo + (hi - lo) * rng.uniform());
  return v;
}

std::vector<int> random_ints(nz::Rng& rng, size_t n, int below) {
  std::vector<int> v(n);
  for (int& x : v) x = int(rng.next() % uint64_t(below));
  return v;
}

struct Tol {
  double rel;    // relative to the element
  double floor;  // relative to the largest |reference| element (for elements near zero)
};
template <class T>
Tol tol() {
  if (std::is_same_v<T, nz::f16>) return Tol{3e-3, 3e-4};
  return std::is_same_v<T, bf16> ? Tol{2e-2, 2e-3} : Tol{1e-4, 2e-5};
}

template <class T>
double as_double(T x) {
  return double(nz::load(x));
}

// got (GPU) against want (CPU), element by element; reports the first offender and the worst error.
// extra, when given, is a further allowance per element (flash attention's tensor-core rounding).
template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& want,
                  Tol t, const std::vector<double>& extra = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (!extra.empty()) {
    ASSERT_EQ(extra.size(), want.size()) << what;
  }
  double max_abs = 0.0;
  for (const T& w : want) max_abs = std::max(max_abs, std::fabs(as_double(w)));
  size_t bad = 0, first_bad = 0;
  double worst = 0.0;  // the largest |error| / allowed
  for (size_t i = 0; i < got.size(); i++) {
    const double g = as_double(got[i]), w = as_double(want[i]);
    const double allowed = t.rel * std::fabs(w) + t.floor * max_abs + (extra.empty() ? 0.0 : extra[i]);
    const bool ok = std::isnan(w) ? std::isnan(g) : (!std::isnan(g) && std::fabs(g - w) <= allowed);
    if (!std::isnan(g) && !std::isnan(w) && allowed > 0) worst = std::max(worst, std::fabs(g - w) / allowed);
    if (!ok && bad++ == 0) first_bad = i;
  }
  printf("[   cuda   ] %-34s worst error %.3f of tolerance (%zu elements)\n", what.c_str(), worst,
         got.size());
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at ["
                     << first_bad << "]: gpu " << as_double(got[first_bad]) << ", cpu "
                     << as_double(want[first_bad]) << " (rel " << t.rel << ", floor " << t.floor
                     << " x max " << max_abs << ")";
}

template <class T>
void expect_bitwise(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0) << what << ": not bit-identical";
}

// The awkward sizes: nothing is a multiple of 32 (warp, tile) or of a block size.
constexpr int kB = 3, kT = 37, kC = 72, kNH = 6, kV = 257, kOC = 200, kMaxT = 40;

// ---------------------------------------------------------------------------------------------
// embedding

TYPED_TEST(CudaKernels, Embedding) {
  using T = TypeParam;
  nz::Rng rng(101);
  const int BT = kB * kT;
  std::vector<int> tokens = random_ints(rng, BT, kV);
  tokens[5] = tokens[0];  // repeated tokens: their gradients must add up, in order
  tokens[BT - 1] = tokens[0];
  const auto wte = random_array<T>(rng, size_t(kV) * kC), wpe = random_array<T>(rng, size_t(kMaxT) * kC);
  const auto dout = random_array<T>(rng, size_t(BT) * kC);
  const auto dwte0 = random_array<T>(rng, size_t(kV) * kC), dwpe0 = random_array<T>(rng, size_t(kMaxT) * kC);

  auto out = poisoned<T>(size_t(BT) * kC);
  auto dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC);
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kB, kT, kC);

  DeviceArray<int> d_tokens(tokens);
  DeviceArray<T> d_wte(wte), d_wpe(wpe), d_dout(dout), d_dwte(dwte0), d_dwpe(dwpe0);
  auto d_out = DeviceArray<T>::poisoned(out.size());
  gpu::embedding_forward(d_out.ptr(), d_tokens.ptr(), d_wte.ptr(), d_wpe.ptr(), kB, kT, kC);
  gpu::embedding_backward(d_dwte.ptr(), d_dwpe.ptr(), d_dout.ptr(), d_tokens.ptr(), kB, kT, kC);

  expect_close("embedding out", d_out.download(), out, tol<T>());
  expect_close("embedding dwte (+=)", d_dwte.download(), dwte, tol<T>());
  expect_close("embedding dwpe (+=)", d_dwpe.download(), dwpe, tol<T>());
}

// The tensor rung's vocabulary pieces (tensor/tp_model.cpp): this rank holds wte rows [lo, lo + V).
// The lookup and its gradient move or add one value per element in token order, the bias adds one:
// the CPU's bits. The ladder's embedding_backward with no dwte (the tensor rung's position part):
// the same dwpe as with it.
TYPED_TEST(CudaKernels, VocabularyPieceEmbeddingAndBias) {
  using T = TypeParam;
  nz::Rng rng(131);
  const int BT = kB * kT, lo = 100, V = 90;
  std::vector<int> tokens = random_ints(rng, BT, kV);  // some in [lo, lo + V), most not
  tokens[3] = tokens[7] = tokens[BT - 1] = lo + 5;     // a repeated token of mine: its gradients add in order
  tokens[4] = lo, tokens[8] = lo + V - 1, tokens[9] = lo + V, tokens[10] = lo - 1;  // the edges
  const auto wte = random_array<T>(rng, size_t(V) * kC), dout = random_array<T>(rng, size_t(BT) * kC);
  const auto dwte0 = random_array<T>(rng, size_t(V) * kC), y0 = random_array<T>(rng, size_t(BT) * kC);
  const auto bias = random_array<T>(rng, kC), dwpe0 = random_array<T>(rng, size_t(kT) * kC);

  auto out = poisoned<T>(size_t(BT) * kC);
  auto dwte = dwte0, y = y0, dwpe = dwpe0;
  cpu::vocab_embedding_forward(out.data(), tokens.data(), wte.data(), lo, V, BT, kC);
  cpu::vocab_embedding_backward(dwte.data(), dout.data(), tokens.data(), lo, V, BT, kC);
  cpu::add_bias(y.data(), bias.data(), BT, kC);
  cpu::embedding_backward<T>(nullptr, dwpe.data(), dout.data(), tokens.data(), kB, kT, kC);
  // the reference's own truth: a token of mine is its row, another's zeros; the bias added once
  for (int i : {3, 4, 8, 9, 10}) {
    const bool mine = tokens[i] >= lo && tokens[i] < lo + V;
    for (int c = 0; c < kC; c++)
      ASSERT_EQ(as_double(out[size_t(i) * kC + c]), mine ? as_double(wte[size_t(tokens[i] - lo) * kC + c]) : 0.0);
  }
  EXPECT_EQ(as_double(y[kC + 2]), as_double(nz::store<T>(nz::load(y0[kC + 2]) + nz::load(bias[2]))));
  auto dwpe_full = dwpe0;
  auto dwte_scratch = random_array<T>(rng, size_t(kV) * kC);
  cpu::embedding_backward(dwte_scratch.data(), dwpe_full.data(), dout.data(), tokens.data(), kB, kT, kC);
  expect_bitwise("embedding_backward dwpe alone = with dwte", dwpe, dwpe_full);

  DeviceArray<int> d_tokens(tokens);
  DeviceArray<T> d_wte(wte), d_dout(dout), d_dwte(dwte0), d_y(y0), d_bias(bias), d_dwpe(dwpe0);
  auto d_out = DeviceArray<T>::poisoned(out.size());
  gpu::vocab_embedding_forward(d_out.ptr(), d_tokens.ptr(), d_wte.ptr(), lo, V, BT, kC);
  gpu::vocab_embedding_backward(d_dwte.ptr(), d_dout.ptr(), d_tokens.ptr(), lo, V, BT, kC);
  gpu::add_bias(d_y.ptr(), d_bias.ptr(), BT, kC);
  gpu::embedding_backward<T>(nullptr, d_dwpe.ptr(), d_dout.ptr(), d_tokens.ptr(), kB, kT, kC);
  expect_bitwise("vocab_embedding_forward", d_out.download(), out);
  expect_bitwise("vocab_embedding_backward (+=)", d_dwte.download(), dwte);
  expect_bitwise("add_bias", d_y.download(), y);
  expect_bitwise("embedding_backward, dwpe alone (+=)", d_dwpe.download(), dwpe);
}

// The vocabulary-parallel cross-entropy's kernels, one rank of two: my ld = 90 columns of each row,
// the first V = 83 real. The max is exact in any order, the target's logit and the backward are one
// value each: the CPU's bits. The sum of exponentials adds in the block's order and the device's expf
// (cuda_common.cuh): within the fp32 tolerance, and so are the losses and probabilities made from it.
TYPED_TEST(CudaKernels, VocabularyParallelCrossEntropy) {
  using T = TypeParam;
  nz::Rng rng(137);
  const int BT = kB * kT, R = BT + 1, ld = 90, V = 83, lo = 100;  // R: BT rounded up to the 2 ranks
  auto logits = random_array<T>(rng, size_t(BT) * ld, -4.0f, 4.0f);
  for (int i = 0; i < BT; i++)  // padding columns hold what the matmul left there: large, never counted
    for (int j = V; j < ld; j++) logits[size_t(i) * ld + j] = nz::store<T>(50.0f);
  std::vector<int> targets = random_ints(rng, BT, 300);
  targets[0] = lo, targets[1] = lo + V - 1, targets[2] = lo - 1;  // my first and last column, another's
  // every rank's maxima: mine in row 0 (from the kernel), the other rank's in row 1
  std::vector<float> maxes(2 * size_t(R), 0.0f), other = random_array<float>(rng, R, -4.0f, 6.0f);
  std::vector<float> row_max(R, 0.0f), sums(R, 0.0f), target(R, 0.0f), losses(BT);
  cpu::vocab_xent_max(row_max.data(), logits.data(), BT, V, ld);
  for (int i = 0; i < BT; i++) {
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = std::max(m, float(nz::load(logits[size_t(i) * ld + j])));
    ASSERT_EQ(row_max[i], m) << "row " << i;  // the reference against its definition
  }
  std::copy(row_max.begin(), row_max.end(), maxes.begin());
  std::copy(other.begin(), other.end(), maxes.begin() + R);
  cpu::vocab_xent_sums(row_max.data(), sums.data(), target.data(), maxes.data(), 2, R, logits.data(), targets.data(),
                       lo, BT, V, ld);
  EXPECT_EQ(target[0], float(nz::load(logits[0])));
  EXPECT_EQ(target[1], float(nz::load(logits[ld + V - 1])));
  EXPECT_EQ(target[2], 0.0f);
  auto probs = logits;
  cpu::vocab_xent_finish(losses.data(), probs.data(), row_max.data(), sums.data(), target.data(), BT, V, ld);
  auto dlogits = probs;
  const float dloss = 1.0f / BT;
  cpu::vocab_xent_backward(dlogits.data(), targets.data(), lo, dloss, BT, ld);

  DeviceArray<T> d_logits(logits);
  DeviceArray<int> d_targets(targets);
  DeviceArray<float> d_maxes(maxes);
  auto d_row_max = DeviceArray<float>::poisoned(R), d_sums = DeviceArray<float>::poisoned(R);
  auto d_target = DeviceArray<float>::poisoned(R), d_losses = DeviceArray<float>::poisoned(BT);
  gpu::vocab_xent_max(d_row_max.ptr(), d_logits.ptr(), BT, V, ld);
  auto first = [BT](std::vector<float> v) { v.resize(BT); return v; };
  const std::vector<float> my_max(maxes.begin(), maxes.begin() + R);  // the CPU's, before the sums overwrote it
  expect_bitwise("vocab_xent_max", first(d_row_max.download()), first(my_max));
  gpu::vocab_xent_sums(d_row_max.ptr(), d_sums.ptr(), d_target.ptr(), d_maxes.ptr(), 2, R, d_logits.ptr(),
                       d_targets.ptr(), lo, BT, V, ld);
  expect_bitwise("vocab_xent_sums: the global max", first(d_row_max.download()), first(row_max));
  expect_bitwise("vocab_xent_sums: the target's logit", first(d_target.download()), first(target));
  expect_close("vocab_xent_sums: the sum of exponentials", first(d_sums.download()), first(sums), tol<float>());
  DeviceArray<float> d_cpu_sums(sums);  // the finish from the CPU's sums: its own arithmetic alone
  gpu::vocab_xent_finish(d_losses.ptr(), d_logits.ptr(), d_row_max.ptr(), d_cpu_sums.ptr(), d_target.ptr(), BT, V,
                         ld);
  expect_close("vocab_xent_finish losses", d_losses.download(), losses, tol<float>());
  const auto gpu_probs = d_logits.download();
  expect_close("vocab_xent_finish probabilities", gpu_probs, probs, tol<T>());
  for (int i = 0; i < BT; i++)
    for (int j = V; j < ld; j++) ASSERT_EQ(as_double(gpu_probs[size_t(i) * ld + j]), 0.0) << "padding column " << j;
  DeviceArray<T> d_d(probs);  // the backward from the CPU's probabilities
  gpu::vocab_xent_backward(d_d.ptr(), d_targets.ptr(), lo, dloss, BT, ld);
  expect_bitwise("vocab_xent_backward", d_d.download(), dlogits);
}

// ---------------------------------------------------------------------------------------------
// layer norm

TYPED_TEST(CudaKernels, LayerNorm) {
  using T = TypeParam;
  nz::Rng rng(102);
  const int N = kB * kT, C = kC;
  const auto inp = random_array<T>(rng, size_t(N) * C, -2.0f, 3.0f);  // a non-zero mean
  const auto w = random_array<T>(rng, C, 0.5f, 1.5f), b = random_array<T>(rng, C);
  const auto dout = random_array<T>(rng, size_t(N) * C);
  const auto dw0 = random_array<T>(rng, C), db0 = random_array<T>(rng, C);

  auto out = poisoned<T>(size_t(N) * C);
  std::vector<float> mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  auto dinp = poisoned<T>(size_t(N) * C);
  auto dw = dw0, db = db0;
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);

  DeviceArray<T> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_dw(dw0), d_db(db0);
  auto d_out = DeviceArray<T>::poisoned(out.size()), d_dinp = DeviceArray<T>::poisoned(dinp.size());
  auto d_mean = DeviceArray<float>::poisoned(N), d_rstd = DeviceArray<float>::poisoned(N);
  gpu::layernorm_forward(d_out.ptr(), d_mean.ptr(), d_rstd.ptr(), d_inp.ptr(), d_w.ptr(), d_b.ptr(), N, C);
  expect_close("layernorm out", d_out.download(), out, tol<T>());
  expect_close("layernorm mean", d_mean.download(), mean, tol<float>());
  expect_close("layernorm rstd", d_rstd.download(), rstd, tol<float>());

  // The backward reads the CPU's mean and rstd, so it is checked on exactly the same inputs.
  d_mean.upload(mean);
  d_rstd.upload(rstd);
  gpu::layernorm_backward(d_dinp.ptr(), d_dw.ptr(), d_db.ptr(), d_dout.ptr(), d_inp.ptr(), d_w.ptr(),
                          d_mean.ptr(), d_rstd.ptr(), N, C);
  expect_close("layernorm dinp", d_dinp.download(), dinp, tol<T>());
  expect_close("layernorm dw (+=)", d_dw.download(), dw, tol<T>());
  expect_close("layernorm db (+=)", d_db.download(), db, tol<T>());
}

// ---------------------------------------------------------------------------------------------
// matmul: both implementations, with and without bias, two shapes

template <class T>
void check_matmul(int N, int C, int OC, bool with_bias, Kernels impl, uint64_t seed) {
  const std::string tag = std::string(nz::kernels_name(impl)) + " N=" + std::to_string(N) +
                          " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                          (with_bias ? " bias" : " no bias");
  SCOPED_TRACE(tag);
  nz::Rng rng(seed);
  const auto inp = random_array<T>(rng, size_t(N) * C), w = random_array<T>(rng, size_t(OC) * C);
  const auto bias = random_array<T>(rng, OC), dout = random_array<T>(rng, size_t(N) * OC);
  const auto dw0 = random_array<T>(rng, size_t(OC) * C), dbias0 = random_array<T>(rng, OC);
  const T* bias_cpu = with_bias ? bias.data() : nullptr;

  auto out = poisoned<T>(size_t(N) * OC), dinp = poisoned<T>(size_t(N) * C);
  auto dw = dw0, dbias = dbias0;
  cpu::matmul_forward(out.data(), inp.data(), w.data(), bias_cpu, N, C, OC);
  cpu::matmul_backward(dinp.data(), dw.data(), with_bias ? dbias.data() : nullptr, dout.data(),
                       inp.data(), w.data(), N, C, OC);

  nz::set_kernels(impl);
  DeviceArray<T> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_dw(dw0), d_dbias(dbias0);
  auto d_out = DeviceArray<T>::poisoned(out.size()), d_dinp = DeviceArray<T>::poisoned(dinp.size());
  gpu::matmul_forward(d_out.ptr(), d_inp.ptr(), d_w.ptr(), with_bias ? d_bias.ptr() : nullptr, N, C, OC);
  gpu::matmul_backward(d_dinp.ptr(), d_dw.ptr(), with_bias ? d_dbias.ptr() : nullptr, d_dout.ptr(),
                       d_inp.ptr(), d_w.ptr(), N, C, OC);
  expect_close("matmul out " + tag, d_out.download(), out, tol<T>());
  expect_close("matmul dinp " + tag, d_dinp.download(), dinp, tol<T>());
  expect_close("matmul dw (+=) " + tag, d_dw.download(), dw, tol<T>());
  if (with_bias) expect_close("matmul dbias (+=) " + tag, d_dbias.download(), dbias, tol<T>());
  else expect_bitwise("matmul dbias untouched " + tag, d_dbias.download(), dbias0);

  // dinp == null means "no input gradient": dw still accumulates, from where it is now.
  auto dw_twice = dw;
  cpu::matmul_backward((T*)nullptr, dw_twice.data(), (T*)nullptr, dout.data(), inp.data(), w.data(),
                       N, C, OC);
  gpu::matmul_backward((T*)nullptr, d_dw.ptr(), (T*)nullptr, d_dout.ptr(), d_inp.ptr(), d_w.ptr(), N,
                       C, OC);
  expect_close("matmul dw, 2nd call, no dinp " + tag, d_dw.download(), dw_twice, tol<T>());
  nz::set_kernels(Kernels::Fast);  // back to the default
}

TYPED_TEST(CudaKernels, Matmul) {
  using T = TypeParam;
  for (Kernels impl : kKernelChoices) {
    check_matmul<T>(kB * kT, kC, kOC, true, impl, 103);
    check_matmul<T>(kB * kT, kC, kOC, false, impl, 104);
    check_matmul<T>(kT, kOC, kV, true, impl, 105);  // K = 200 and 257: several partial tiles
  }
}

// ---------------------------------------------------------------------------------------------
// attention

template <class T>
void check_attention(int B, int Tn, int C, int NH, uint64_t seed) {
  const std::string tag = "B=" + std::to_string(B) + " T=" + std::to_string(Tn) + " C=" +
                          std::to_string(C) + " NH=" + std::to_string(NH);
  SCOPED_TRACE(tag);
  nz::Rng rng(seed);
  const size_t n_qkv = size_t(B) * Tn * 3 * C, n_out = size_t(B) * Tn * C;
  const size_t n_att = size_t(B) * NH * Tn * Tn;
  const auto qkv = random_array<T>(rng, n_qkv, -2.0f, 2.0f), dout = random_array<T>(rng, n_out);

  auto out = poisoned<T>(n_out), att = poisoned<T>(n_att), dqkv = poisoned<T>(n_qkv);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH);
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), out.data(), B, Tn, C, NH);

  DeviceArray<T> d_qkv(qkv), d_dout(dout);
  auto d_out = DeviceArray<T>::poisoned(n_out), d_att = DeviceArray<T>::poisoned(n_att);
  auto d_dqkv = DeviceArray<T>::poisoned(n_qkv);
  gpu::attention_forward(d_out.ptr(), d_att.ptr(), d_qkv.ptr(), B, Tn, C, NH);
  expect_close("attention out " + tag, d_out.download(), out, tol<T>());
  expect_close("attention att " + tag, d_att.download(), att, tol<T>());

  d_att.upload(att);  // the backward on exactly the CPU's saved probabilities
  gpu::attention_backward(d_dqkv.ptr(), d_dout.ptr(), d_qkv.ptr(), d_att.ptr(), d_out.ptr(), B, Tn, C, NH);
  expect_close("attention dqkv " + tag, d_dqkv.download(), dqkv, tol<T>());
}

// Both implementations: the hand-written kernels (--kernels reference) and batched cuBLAS GEMMs
// around the softmax kernels (--kernels fast).
TYPED_TEST(CudaKernels, Attention) {
  for (Kernels impl : kKernelChoices) {
    SCOPED_TRACE(nz::kernels_name(impl));
    nz::set_kernels(impl);
    check_attention<TypeParam>(kB, kT, kC, kNH, 106);  // head size 12: most lanes idle
    check_attention<TypeParam>(2, 33, 128, 2, 107);    // head size 64: two channels per lane
  }
  nz::set_kernels(Kernels::Fast);
}

// Flash attention (--attention flash, kernels_flash_attention.cu): out and dqkv against the CPU's
// textbook attention, and what it saves in att's place, each row's log-sum-exp of the scores,
// against that sum computed here in double from qkv. att is given only the (B,NH,T) floats the
// model allocates for it (model.cpp ActLayout), so a write past them is caught. The reference runs
// in fp32 on the same (T-valued) inputs: the CUDA-core kernels keep every probability in fp32 and
// round only what they store, while the CPU attention in bf16/fp16 rounds its saved probabilities
// to T, an error of the reference's own that would otherwise count against the kernel.
//
// The tensor-core kernels (bf16, fp16 with a head size that is a multiple of 16) do round inside:
// P (forward and backward) and dS (backward) become T to enter the tensor cores. Each rounded value
// is off by at most u |x| + eta (u = 2^-8 bf16, 2^-11 fp16; eta = half the smallest subnormal,
// 2^-134 bf16, 2^-25 fp16), so each element is granted, beyond tol<T>, the first-order bound of
// that rounding, computed here in double from the reference's own P (att) and dS:
//   out[t][d]:  sum_t2 (u P[t][t2] + eta) |v[t2][d]|      dv[t2][d]: sum_t (u P[t][t2] + eta) |dout[t][d]|
//   dq[t][d]:   scale sum_t2 (u |dS[t][t2]| + eta) |k[t2][d]|
//   dk[t2][d]:  scale sum_t (u |dS[t][t2]| + eta) |q[t][d]|
// (kernels_flash_attention.cu derives them). The CUDA-core kernels are granted tol<T> alone.
// twice: the forward and the backward run a second time into fresh (poisoned) buffers, and must give
// the same bits (no atomics, a fixed order of every sum).
template <class T>
void check_flash_attention(int B, int Tn, int C, int NH, bool expect_wmma, uint64_t seed, bool twice = false) {
  const bool wmma = nz::cuda::flash_attention_uses_wmma<T>(C, NH);
  const std::string tag = "flash B=" + std::to_string(B) + " T=" + std::to_string(Tn) + " C=" +
                          std::to_string(C) + " NH=" + std::to_string(NH) + (wmma ? " (tensor cores)" : "");
  SCOPED_TRACE(tag);
  ASSERT_EQ(wmma, expect_wmma) << "which kernels run";
  nz::Rng rng(seed);
  const int hs = C / NH;
  const size_t n_qkv = size_t(B) * Tn * 3 * C, n_out = size_t(B) * Tn * C, rows = size_t(B) * NH * Tn;
  const size_t n_att = rows * Tn;
  const auto qkv = random_array<T>(rng, n_qkv, -2.0f, 2.0f), dout = random_array<T>(rng, n_out);
  auto as_float = [](const std::vector<T>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); i++) f[i] = float(as_double(v[i]));
    return f;
  };
  const std::vector<float> qkv_f = as_float(qkv), dout_f = as_float(dout);
  auto out = poisoned<float>(n_out), att = poisoned<float>(n_att), dqkv = poisoned<float>(n_qkv);
  cpu::attention_forward(out.data(), att.data(), qkv_f.data(), B, Tn, C, NH);
  cpu::attention_backward(dqkv.data(), dout_f.data(), qkv_f.data(), att.data(), out.data(), B, Tn, C, NH);

  std::vector<float> lse(rows);  // log sum_{t2 <= t} exp(q[t]·k[t2] / sqrt(hs)), in double
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < Tn; t++) {
        std::vector<double> s(t + 1);
        double m = -INFINITY, sum = 0.0;
        for (int t2 = 0; t2 <= t; t2++) {
          double dot = 0.0;
          for (int d = 0; d < hs; d++)
            dot += as_double(qkv[(size_t(b) * Tn + t) * 3 * C + h * hs + d]) *
                   as_double(qkv[(size_t(b) * Tn + t2) * 3 * C + C + h * hs + d]);
          s[t2] = dot / std::sqrt(double(hs));
          m = std::max(m, s[t2]);
        }
        for (double x : s) sum += std::exp(x - m);
        lse[(size_t(b) * NH + h) * Tn + t] = float(m + std::log(sum));
      }

  // The tensor-core rounding's allowance (above), for out and for dqkv = [dq | dk | dv].
  std::vector<double> out_extra, dqkv_extra;
  if (wmma) {
    const double u = std::is_same_v<T, bf16> ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const double eta = std::is_same_v<T, bf16> ? std::ldexp(1.0, -134) : std::ldexp(1.0, -25);
    const double scale = 1.0 / std::sqrt(double(hs));
    out_extra.assign(n_out, 0.0);
    dqkv_extra.assign(n_qkv, 0.0);
    auto x = [&](int b, int t, int part, int h, int d) {  // qkv (part 0, 1, 2: q, k, v) as double
      return double(qkv_f[(size_t(b) * Tn + t) * 3 * C + size_t(part) * C + h * hs + d]);
    };
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++)
        for (int t = 0; t < Tn; t++) {
          const size_t o = (size_t(b) * Tn + t) * C + h * hs;
          double D = 0.0;  // dout[t]·out[t]
          for (int d = 0; d < hs; d++) D += double(dout_f[o + d]) * double(out[o + d]);
          for (int t2 = 0; t2 <= t; t2++) {
            const double P = att[((size_t(b) * NH + h) * Tn + t) * Tn + t2];
            double dP = 0.0;
            for (int d = 0; d < hs; d++) dP += double(dout_f[o + d]) * x(b, t2, 2, h, d);
            const double dS = P * (dP - D);
            const size_t q_t = (size_t(b) * Tn + t) * 3 * C + h * hs, k_t2 = (size_t(b) * Tn + t2) * 3 * C + C + h * hs;
            for (int d = 0; d < hs; d++) {
              out_extra[o + d] += (u * P + eta) * std::fabs(x(b, t2, 2, h, d));
              dqkv_extra[k_t2 + C + d] += (u * P + eta) * std::fabs(double(dout_f[o + d]));                // dv[t2]
              dqkv_extra[q_t + d] += scale * (u * std::fabs(dS) + eta) * std::fabs(x(b, t2, 1, h, d));     // dq[t]
              dqkv_extra[k_t2 + d] += scale * (u * std::fabs(dS) + eta) * std::fabs(x(b, t, 0, h, d));     // dk[t2]
            }
          }
        }
  }

  nz::set_kernels(Kernels::Fast);
  nz::set_attention(nz::Attention::Flash);
  DeviceArray<T> d_qkv(qkv), d_dout(dout);
  auto d_out = DeviceArray<T>::poisoned(n_out);
  auto d_lse = DeviceArray<float>::poisoned(rows);  // what the model allocates in att's place
  T* d_att = reinterpret_cast<T*>(d_lse.ptr());
  auto d_dqkv = DeviceArray<T>::poisoned(n_qkv);
  gpu::attention_forward(d_out.ptr(), d_att, d_qkv.ptr(), B, Tn, C, NH);
  expect_close("attention out " + tag, as_float(d_out.download()), out, tol<T>(), out_extra);
  const std::vector<float> got_lse = d_lse.download();
  expect_close("attention lse " + tag, got_lse, lse, tol<float>());
  gpu::attention_backward(d_dqkv.ptr(), d_dout.ptr(), d_qkv.ptr(), d_att, d_out.ptr(), B, Tn, C, NH);
  const std::vector<T> got_dqkv = d_dqkv.download();
  expect_close("attention dqkv " + tag, as_float(got_dqkv), dqkv, tol<T>(), dqkv_extra);
  if (twice) {
    auto d_out2 = DeviceArray<T>::poisoned(n_out);
    auto d_lse2 = DeviceArray<float>::poisoned(rows);
    auto d_dqkv2 = DeviceArray<T>::poisoned(n_qkv);
    T* d_att2 = reinterpret_cast<T*>(d_lse2.ptr());
    gpu::attention_forward(d_out2.ptr(), d_att2, d_qkv.ptr(), B, Tn, C, NH);
    gpu::attention_backward(d_dqkv2.ptr(), d_dout.ptr(), d_qkv.ptr(), d_att2, d_out2.ptr(), B, Tn, C, NH);
    expect_bitwise("attention out, second run " + tag, d_out2.download(), d_out.download());
    expect_bitwise("attention lse, second run " + tag, d_lse2.download(), got_lse);
    expect_bitwise("attention dqkv, second run " + tag, d_dqkv2.download(), got_dqkv);
  }
  nz::set_attention(nz::Attention::Gemm);
}

// fp32 always runs the CUDA-core kernels; bf16 and fp16 the tensor-core kernels when the head size is
// a multiple of 16. Tiles: forward and dq 64 queries (keys by 32), dk/dv 32 keys (queries by 16).
TYPED_TEST(CudaKernels, FlashAttention) {
  using T = TypeParam;
  const bool half_types = !std::is_same_v<T, float>;
  check_flash_attention<T>(kB, kT, kC, kNH, false, 116);       // head size 12: CUDA cores; T = 37: a partial last tile
  check_flash_attention<T>(1, 19, 32, 2, half_types, 117);     // head size 16: one fragment wide
  check_flash_attention<T>(2, 70, 128, 2, half_types, 118);    // head size 64: two query tiles, the last partial
  check_flash_attention<T>(2, 45, 256, 2, half_types, 119);    // head size 128: partial key tiles, two dk/dv blocks
}

// The tensor-core kernels at a real sequence length, T = 1024: the forward's and dq's 64-query blocks
// see up to 32 key tiles of 32 (blocks skip the tiles after their last query: causal), dk/dv's
// 32-key blocks up to 64 query tiles of 16, so the double buffers alternate many times and a tile
// read from the wrong buffer, at the wrong offset or before its copy landed is caught; head size 64
// (gpt2's) and 128 (a dq block above 48 KiB of shared memory). Out, lse, dq, dk, dv within the
// derived bound, and (head size 64) a second run bit for bit. One sequence of one head each: the
// emulator's cost.
TYPED_TEST(CudaKernels, FlashAttentionLongSequence) {
  using T = TypeParam;
  if constexpr (std::is_same_v<T, float>) {
    GTEST_SKIP() << "fp32 runs the CUDA-core kernels (FlashAttention covers them)";
  } else {
    check_flash_attention<T>(1, 1024, 64, 1, true, 120, true);  // head size 64, and a second run
    check_flash_attention<T>(1, 1024, 128, 1, true, 121);       // head size 128
  }
}

// ---------------------------------------------------------------------------------------------
// elementwise: GELU, residual, accumulate

TYPED_TEST(CudaKernels, Gelu) {
  using T = TypeParam;
  nz::Rng rng(108);
  const size_t n = 31973;
  const auto inp = random_array<T>(rng, n, -5.0f, 5.0f), dout = random_array<T>(rng, n);
  auto out = poisoned<T>(n), dinp = poisoned<T>(n);
  cpu::gelu_forward(out.data(), inp.data(), n);
  cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), n);

  DeviceArray<T> d_inp(inp), d_dout(dout);
  auto d_out = DeviceArray<T>::poisoned(n), d_dinp = DeviceArray<T>::poisoned(n);
  gpu::gelu_forward(d_out.ptr(), d_inp.ptr(), n);
  gpu::gelu_backward(d_dinp.ptr(), d_inp.ptr(), d_dout.ptr(), n);
  expect_close("gelu out", d_out.download(), out, tol<T>());
  expect_close("gelu dinp", d_dinp.download(), dinp, tol<T>());
}

TYPED_TEST(CudaKernels, Residual) {
  using T = TypeParam;
  nz::Rng rng(109);
  const size_t n = 7993;
  const auto a = random_array<T>(rng, n), b = random_array<T>(rng, n);
  auto out = poisoned<T>(n);
  cpu::residual_forward(out.data(), a.data(), b.data(), n);

  DeviceArray<T> d_a(a), d_b(b);
  auto d_out = DeviceArray<T>::poisoned(n);
  gpu::residual_forward(d_out.ptr(), d_a.ptr(), d_b.ptr(), n);
  expect_close("residual out", d_out.download(), out, tol<T>());
  gpu::residual_forward(d_a.ptr(), d_a.ptr(), d_b.ptr(), n);  // in place: out aliases a
  expect_bitwise("residual in place", d_a.download(), d_out.download());
}

TYPED_TEST(CudaKernels, Accumulate) {
  using T = TypeParam;
  nz::Rng rng(110);
  const size_t n = 12345;
  const auto src1 = random_array<T>(rng, n), src2 = random_array<T>(rng, n);
  auto dst = poisoned<T>(n);  // first = true must not read dst (it holds NaN)
  cpu::accumulate(dst.data(), src1.data(), n, 0.25f, true);
  const auto after_first = dst;
  cpu::accumulate(dst.data(), src2.data(), n, 0.25f, false);

  DeviceArray<T> d_src1(src1), d_src2(src2);
  auto d_dst = DeviceArray<T>::poisoned(n);
  gpu::accumulate(d_dst.ptr(), d_src1.ptr(), n, 0.25f, true);
  // bit for bit: offload accumulates on the CPU what stage2 accumulates here (no fused multiply-add)
  expect_bitwise("accumulate first", d_dst.download(), after_first);
  gpu::accumulate(d_dst.ptr(), d_src2.ptr(), n, 0.25f, false);
  expect_bitwise("accumulate second", d_dst.download(), dst);
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy

TYPED_TEST(CudaKernels, SoftmaxXent) {
  using T = TypeParam;
  nz::Rng rng(111);
  const int BT = kB * kT, V = kV;
  const auto logits = random_array<T>(rng, size_t(BT) * V, -4.0f, 4.0f);
  const std::vector<int> targets = random_ints(rng, BT, V);
  const float dloss = 1.0f / BT;

  std::vector<float> losses(BT);
  auto probs = poisoned<T>(logits.size()), dlogits = poisoned<T>(logits.size());
  cpu::softmax_xent_forward(losses.data(), probs.data(), logits.data(), targets.data(), BT, V);
  cpu::softmax_xent_backward(dlogits.data(), probs.data(), targets.data(), dloss, BT, V);

  DeviceArray<T> d_logits(logits), d_probs(probs);  // (the backward reads the CPU's probs)
  DeviceArray<int> d_targets(targets);
  auto d_losses = DeviceArray<float>::poisoned(BT), d_out = DeviceArray<T>::poisoned(logits.size());
  gpu::softmax_xent_forward(d_losses.ptr(), d_out.ptr(), d_logits.ptr(), d_targets.ptr(), BT, V);
  expect_close("softmax_xent losses", d_losses.download(), losses, tol<float>());
  const auto gpu_probs = d_out.download();
  expect_close("softmax_xent probs", gpu_probs, probs, tol<T>());

  d_out.poison();
  gpu::softmax_xent_backward(d_out.ptr(), d_probs.ptr(), d_targets.ptr(), dloss, BT, V);
  expect_close("softmax_xent dlogits", d_out.download(), dlogits, tol<T>());

  // In place, as the trainer runs it: probs over the logits, then dlogits over the probs.
  const auto gpu_losses = d_losses.download();
  gpu::softmax_xent_forward(d_losses.ptr(), d_logits.ptr(), d_logits.ptr(), d_targets.ptr(), BT, V);
  expect_bitwise("softmax_xent probs in place", d_logits.download(), gpu_probs);
  expect_bitwise("softmax_xent losses in place", d_losses.download(), gpu_losses);
  gpu::softmax_xent_backward(d_probs.ptr(), d_probs.ptr(), d_targets.ptr(), dloss, BT, V);
  expect_bitwise("softmax_xent dlogits in place", d_probs.download(), d_out.download());
}

// ---------------------------------------------------------------------------------------------
// optimizer and gradient norm

TYPED_TEST(CudaKernels, AdamW) {
  using T = TypeParam;
  nz::Rng rng(112);
  const size_t n = 10007;
  auto p = random_array<float>(rng, n), m = random_array<float>(rng, n, -0.1f, 0.1f);
  auto v = random_array<float>(rng, n, 0.0f, 0.01f);
  const auto g = random_array<T>(rng, n);
  DeviceArray<float> d_p(p), d_m(m), d_v(v);
  DeviceArray<T> d_g(g);
  // step t = 3 (bias corrections matter), decay on, clipping scale on
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3);
  gpu::adamw_update(d_p.ptr(), d_m.ptr(), d_v.ptr(), d_g.ptr(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3);
  // bit for bit: offload and infinity run this update on the CPU (kernels_elementwise.cu)
  expect_bitwise("adamw p", d_p.download(), p);
  expect_bitwise("adamw m", d_m.download(), m);
  expect_bitwise("adamw v", d_v.download(), v);
}

TYPED_TEST(CudaKernels, SumSquares) {
  using T = TypeParam;
  nz::Rng rng(113);
  // 100003 and 200000 > the fixed grid's 65536 threads. The CPU adds in the kernel's order
  // (kernels_cpu.cpp), so the bits are equal: a norm summed on the host (offload's gradients) is the
  // norm stage2 sums on the GPU.
  for (size_t n : {size_t(1), size_t(257), size_t(1000), size_t(65536), size_t(100003), size_t(200000)}) {
    const auto x = random_array<T>(rng, n, -3.0f, 3.0f);
    const double want = cpu::sum_squares(x.data(), n);
    DeviceArray<T> d_x(x);
    const double got = gpu::sum_squares(d_x.ptr(), n);
    EXPECT_EQ(got, want) << "sum_squares n=" << n;
    // the same sum left on the device (the norm reads many back in one copy): the same bits
    DeviceArray<double> d_result = DeviceArray<double>::poisoned(1);
    gpu::sum_squares_to(d_result.ptr(), d_x.ptr(), n);
    EXPECT_EQ(d_result.download()[0], got) << "sum_squares_to n=" << n;
  }
}

// A batch's token losses added to a running total on the device, in double: first = true starts it.
using CudaLossTotal = CudaTest;
TEST_F(CudaLossTotal, AddSumToKeepsARunningTotal) {
  nz::Rng rng(114);
  DeviceArray<double> d_total = DeviceArray<double>::poisoned(1);  // NaN: `first` must not read it
  double want = 0;
  for (size_t n : {size_t(1), size_t(777), size_t(5000)}) {  // 5000 > the block's 1024 threads
    const auto x = random_array<float>(rng, n, 0.0f, 10.0f);
    double sum = 0;
    for (float v : x) sum += v;
    want += sum;
    DeviceArray<float> d_x(x);
    gpu::add_sum_to(d_total.ptr(), d_x.ptr(), n, /*first=*/n == 1);
    EXPECT_NEAR(d_total.download()[0], want, 1e-12 * want) << "after n=" << n;
  }
}

// ---------------------------------------------------------------------------------------------
// column sums over many rows (column_sum.cuh): the bias gradient, layer norm's dw and db, and the
// fused GELU backward's bias gradient. N = 785 cuts the rows into 4 chunks of 197 (the last one
// partial); N = 70001 reaches the cap of 256 chunks (274 rows each); N = 3 is one chunk. C = 77
// leaves a partial block of columns. Each is run twice: the same bits both times.

template <class T>
void check_column_sums(int N, int C, uint64_t seed) {
  const std::string tag = "N=" + std::to_string(N) + " C=" + std::to_string(C);
  SCOPED_TRACE(tag);
  nz::Rng rng(seed);
  const size_t n = size_t(N) * C;
  const auto inp = random_array<T>(rng, n, -2.0f, 3.0f), dout = random_array<T>(rng, n);
  const auto w = random_array<T>(rng, C, 0.5f, 1.5f), b = random_array<T>(rng, C);
  const auto g0 = random_array<T>(rng, C), g1 = random_array<T>(rng, C);
  std::vector<float> mean(N), rstd(N);
  auto ln_out = poisoned<T>(n);
  cpu::layernorm_forward(ln_out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);

  // the CPU: matmul's dbias (alone: no dinp, no dw, so no inp or w either), layer norm's dw and db,
  // gelu_backward_bias's dinp and dbias
  auto dbias = g0, dw = g0, db = g1, gelu_dbias = g1;
  cpu::matmul_backward((T*)nullptr, (T*)nullptr, dbias.data(), dout.data(), inp.data(), (const T*)nullptr, N, 0, C);
  auto dinp = poisoned<T>(n);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
  auto gelu_dinp = poisoned<T>(n);
  cpu::gelu_backward_bias(gelu_dinp.data(), gelu_dbias.data(), inp.data(), dout.data(), N, C);

  DeviceArray<T> d_inp(inp), d_dout(dout), d_w(w);
  DeviceArray<float> d_mean(mean), d_rstd(rstd);
  std::vector<std::vector<T>> first;
  for (int run = 0; run < 2; run++) {
    DeviceArray<T> d_dbias(g0), d_dw(g0), d_db(g1), d_gelu_dbias(g1);
    auto d_dinp = DeviceArray<T>::poisoned(n), d_gelu_dinp = DeviceArray<T>::poisoned(n);
    gpu::matmul_backward((T*)nullptr, (T*)nullptr, d_dbias.ptr(), d_dout.ptr(), d_inp.ptr(), (const T*)nullptr,
                         N, 0, C);
    gpu::layernorm_backward(d_dinp.ptr(), d_dw.ptr(), d_db.ptr(), d_dout.ptr(), d_inp.ptr(), d_w.ptr(),
                            d_mean.ptr(), d_rstd.ptr(), N, C);
    gpu::gelu_backward_bias(d_gelu_dinp.ptr(), d_gelu_dbias.ptr(), d_inp.ptr(), d_dout.ptr(), N, C);
    std::vector<std::vector<T>> got = {d_dbias.download(), d_dinp.download(), d_dw.download(),
                                       d_db.download(), d_gelu_dinp.download(), d_gelu_dbias.download()};
    if (run == 0) {
      expect_close("matmul dbias (+=) " + tag, got[0], dbias, tol<T>());
      expect_close("layernorm dinp " + tag, got[1], dinp, tol<T>());
      expect_close("layernorm dw (+=) " + tag, got[2], dw, tol<T>());
      expect_close("layernorm db (+=) " + tag, got[3], db, tol<T>());
      expect_close("gelu_backward_bias dinp " + tag, got[4], gelu_dinp, tol<T>());
      expect_close("gelu_backward_bias dbias (+=) " + tag, got[5], gelu_dbias, tol<T>());
      first = got;
    } else {
      for (size_t i = 0; i < got.size(); i++)
        expect_bitwise("column sums, result " + std::to_string(i) + " of the second run " + tag, got[i], first[i]);
    }
  }
}

TYPED_TEST(CudaKernels, ColumnSumsOverManyRows) {
  check_column_sums<TypeParam>(785, 77, 120);
  check_column_sums<TypeParam>(3, 77, 121);
  check_column_sums<TypeParam>(70001, 5, 122);
}

// ---------------------------------------------------------------------------------------------
// the fused ops, against the CPU's (which tests/kernels/test_kernels.cpp checks against the unfused ops,
// bit for bit), in place as the model calls them

TYPED_TEST(CudaKernels, FusedResidualLayerNorm) {
  using T = TypeParam;
  nz::Rng rng(123);
  const int N = kB * kT, C = kC;
  const size_t n = size_t(N) * C;
  const auto a = random_array<T>(rng, n, -2.0f, 3.0f), b = random_array<T>(rng, n);
  const auto w = random_array<T>(rng, C, 0.5f, 1.5f), bias = random_array<T>(rng, C);
  const auto dout = random_array<T>(rng, n), dskip = random_array<T>(rng, n);
  const auto dw0 = random_array<T>(rng, C), db0 = random_array<T>(rng, C);

  // forward: res = a + b over b (res_att = x + res_att), out = layernorm(res)
  auto res = b, out = poisoned<T>(n);
  std::vector<float> mean(N), rstd(N);
  cpu::residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), res.data(), w.data(),
                                  bias.data(), N, C);
  DeviceArray<T> d_a(a), d_res(b), d_w(w), d_bias(bias);
  auto d_out = DeviceArray<T>::poisoned(n);
  auto d_mean = DeviceArray<float>::poisoned(N), d_rstd = DeviceArray<float>::poisoned(N);
  gpu::residual_layernorm_forward(d_res.ptr(), d_out.ptr(), d_mean.ptr(), d_rstd.ptr(), d_a.ptr(), d_res.ptr(),
                                  d_w.ptr(), d_bias.ptr(), N, C);
  expect_close("residual_layernorm res", d_res.download(), res, tol<T>());
  expect_close("residual_layernorm out", d_out.download(), out, tol<T>());
  expect_close("residual_layernorm mean", d_mean.download(), mean, tol<float>());
  expect_close("residual_layernorm rstd", d_rstd.download(), rstd, tol<float>());

  // backward with the skip path, on the CPU's res, mean and rstd; dinp over dskip
  auto dinp = dskip, dw = dw0, db = db0;
  cpu::layernorm_backward_residual(dinp.data(), dw.data(), db.data(), dinp.data(), dout.data(), res.data(),
                                   w.data(), mean.data(), rstd.data(), N, C);
  DeviceArray<T> d_dinp(dskip), d_dout(dout), d_dw(dw0), d_db(db0);
  d_res.upload(res);
  d_mean.upload(mean);
  d_rstd.upload(rstd);
  gpu::layernorm_backward_residual(d_dinp.ptr(), d_dw.ptr(), d_db.ptr(), d_dinp.ptr(), d_dout.ptr(), d_res.ptr(),
                                   d_w.ptr(), d_mean.ptr(), d_rstd.ptr(), N, C);
  expect_close("layernorm_backward_residual dinp", d_dinp.download(), dinp, tol<T>());
  expect_close("layernorm_backward_residual dw (+=)", d_dw.download(), dw, tol<T>());
  expect_close("layernorm_backward_residual db (+=)", d_db.download(), db, tol<T>());
}

TYPED_TEST(CudaKernels, FusedBiasGelu) {
  using T = TypeParam;
  nz::Rng rng(124);
  const int N = kB * kT, C = kC, OC = 4 * kC;
  const auto inp = random_array<T>(rng, size_t(N) * C), w = random_array<T>(rng, size_t(OC) * C);
  const auto bias = random_array<T>(rng, OC), dout = random_array<T>(rng, size_t(N) * OC);
  const auto dbias0 = random_array<T>(rng, OC);
  DeviceArray<T> d_inp(inp), d_w(w), d_bias(bias);
  for (Kernels impl : kKernelChoices) {
    for (bool with_bias : {true, false}) {
      const std::string tag = std::string(nz::kernels_name(impl)) + (with_bias ? " bias" : " no bias");
      auto fc = poisoned<T>(size_t(N) * OC), fcg = poisoned<T>(size_t(N) * OC);
      cpu::matmul_bias_gelu_forward(fc.data(), fcg.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr,
                                    N, C, OC);
      nz::set_kernels(impl);
      auto d_fc = DeviceArray<T>::poisoned(fc.size()), d_fcg = DeviceArray<T>::poisoned(fc.size());
      gpu::matmul_bias_gelu_forward(d_fc.ptr(), d_fcg.ptr(), d_inp.ptr(), d_w.ptr(),
                                    with_bias ? d_bias.ptr() : nullptr, N, C, OC);
      nz::set_kernels(Kernels::Fast);
      expect_close("matmul_bias_gelu fc " + tag, d_fc.download(), fc, tol<T>());
      expect_close("matmul_bias_gelu fcg " + tag, d_fcg.download(), fcg, tol<T>());
    }
  }
  // backward: d4c = gelu'(fc) * d4c in place, fc bias gradient from it (the CPU's fc as input)
  auto fc = poisoned<T>(size_t(N) * OC), fcg = poisoned<T>(size_t(N) * OC);
  cpu::matmul_bias_gelu_forward(fc.data(), fcg.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  auto d4c = dout, dbias = dbias0;
  cpu::gelu_backward_bias(d4c.data(), dbias.data(), fc.data(), d4c.data(), N, OC);
  DeviceArray<T> d_fc(fc), d_d4c(dout), d_dbias(dbias0);
  gpu::gelu_backward_bias(d_d4c.ptr(), d_dbias.ptr(), d_fc.ptr(), d_d4c.ptr(), N, OC);
  expect_close("gelu_backward_bias dinp", d_d4c.download(), d4c, tol<T>());
  expect_close("gelu_backward_bias dbias (+=)", d_dbias.download(), dbias, tol<T>());
}

// ---------------------------------------------------------------------------------------------
// determinism: the same inputs give the same bits, run after run

TYPED_TEST(CudaKernels, RunToRunBitwise) {
  using T = TypeParam;
  nz::Rng rng(114);
  const int N = kB * kT, C = kC, OC = kOC;
  const auto inp = random_array<T>(rng, size_t(N) * C), w = random_array<T>(rng, size_t(OC) * C);
  const auto dout = random_array<T>(rng, size_t(N) * OC), dw0 = random_array<T>(rng, size_t(OC) * C);
  const auto qkv = random_array<T>(rng, size_t(N) * 3 * C), datt_out = random_array<T>(rng, size_t(N) * C);
  const std::vector<int> tokens = random_ints(rng, N, 5);  // few distinct tokens: many repeats
  DeviceArray<T> d_inp(inp), d_w(w), d_dout(dout), d_qkv(qkv), d_datt_out(datt_out);
  DeviceArray<int> d_tokens(tokens);

  // Runs every kernel with a reduction once, and returns all results as raw bytes.
  auto run_all = [&]() {
    std::vector<std::vector<T>> results;
    for (Kernels impl : kKernelChoices) {
      nz::set_kernels(impl);
      DeviceArray<T> d_dw(dw0), d_dbias(std::vector<T>(OC, nz::store<T>(0.5f)));
      auto d_dinp = DeviceArray<T>::poisoned(size_t(N) * C);
      gpu::matmul_backward(d_dinp.ptr(), d_dw.ptr(), d_dbias.ptr(), d_dout.ptr(), d_inp.ptr(), d_w.ptr(),
                           N, C, OC);
      results.push_back(d_dinp.download());
      results.push_back(d_dw.download());
      results.push_back(d_dbias.download());
      auto d_out = DeviceArray<T>::poisoned(size_t(N) * C);
      auto d_att = DeviceArray<T>::poisoned(size_t(kB) * kNH * kT * kT);
      auto d_dqkv = DeviceArray<T>::poisoned(size_t(N) * 3 * C);
      gpu::attention_forward(d_out.ptr(), d_att.ptr(), d_qkv.ptr(), kB, kT, C, kNH);
      gpu::attention_backward(d_dqkv.ptr(), d_datt_out.ptr(), d_qkv.ptr(), d_att.ptr(), d_out.ptr(), kB, kT, C,
                              kNH);
      results.push_back(d_out.download());
      results.push_back(d_att.download());
      results.push_back(d_dqkv.download());
    }
    nz::set_kernels(Kernels::Fast);
    {  // flash attention, head size 32 (C 64, 2 heads; qkv's and datt_out's first elements): in bf16
       // and fp16 the tensor-core kernels
      const int fC = 64, fNH = 2;
      nz::set_attention(nz::Attention::Flash);
      auto d_out = DeviceArray<T>::poisoned(size_t(N) * fC), d_dqkv = DeviceArray<T>::poisoned(size_t(N) * 3 * fC);
      auto d_lse = DeviceArray<T>::poisoned(size_t(kB) * fNH * kT * sizeof(float) / sizeof(T));  // (B,NH,T) fp32
      gpu::attention_forward(d_out.ptr(), d_lse.ptr(), d_qkv.ptr(), kB, kT, fC, fNH);
      gpu::attention_backward(d_dqkv.ptr(), d_datt_out.ptr(), d_qkv.ptr(), d_lse.ptr(), d_out.ptr(), kB, kT, fC,
                              fNH);
      nz::set_attention(nz::Attention::Gemm);
      results.push_back(d_out.download());
      results.push_back(d_lse.download());
      results.push_back(d_dqkv.download());
    }
    DeviceArray<T> d_dwte(std::vector<T>(size_t(5) * C, nz::store<T>(0.0f)));
    DeviceArray<T> d_dwpe(std::vector<T>(size_t(kT) * C, nz::store<T>(0.0f)));
    gpu::embedding_backward(d_dwte.ptr(), d_dwpe.ptr(), d_inp.ptr(), d_tokens.ptr(), kB, kT, C);
    results.push_back(d_dwte.download());
    results.push_back(d_dwpe.download());
    const double ss = gpu::sum_squares(d_dout.ptr(), d_dout.size());
    std::vector<T> ss_bytes(sizeof(double) / sizeof(T) + 1);
    std::memcpy(ss_bytes.data(), &ss, sizeof(double));
    results.push_back(ss_bytes);
    return results;
  };
  const auto first = run_all(), second = run_all();
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); i++)
    expect_bitwise("result " + std::to_string(i) + " of the second run", second[i], first[i]);
}

// ---------------------------------------------------------------------------------------------
// casts, bit for bit

std::vector<float> cast_test_values(nz::Rng& rng) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 3.0e38f, -3.0e38f,
                          1e-40f /* subnormal */, 1.0f + 1.0f / 256 /* a tie: rounds to even */,
                          1.0f + 3.0f / 256 /* a tie: rounds up to even */};
  for (int i = 0; i < 4999; i++) v.push_back((rng.uniform() - 0.5f) * 1000.0f);
  return v;
}

TEST_F(CudaCast, AllFourCastsBitwise) {
  nz::Rng rng(115);
  const std::vector<float> f = cast_test_values(rng);
  const size_t n = f.size();
  std::vector<bf16> b = poisoned<bf16>(n);
  cpu::cast(b.data(), f.data(), n);
  std::vector<float> f_back = poisoned<float>(n);
  cpu::cast(f_back.data(), b.data(), n);

  DeviceArray<float> d_f(f);
  auto d_b = DeviceArray<bf16>::poisoned(n), d_b2 = DeviceArray<bf16>::poisoned(n);
  auto d_f_back = DeviceArray<float>::poisoned(n), d_f2 = DeviceArray<float>::poisoned(n);
  gpu::cast(d_b.ptr(), d_f.ptr(), n);
  expect_bitwise("cast fp32 -> bf16", d_b.download(), b);
  gpu::cast(d_f_back.ptr(), d_b.ptr(), n);
  expect_bitwise("cast bf16 -> fp32", d_f_back.download(), f_back);
  gpu::cast(d_f2.ptr(), d_f.ptr(), n);
  expect_bitwise("cast fp32 -> fp32", d_f2.download(), f);
  gpu::cast(d_b2.ptr(), d_b.ptr(), n);
  expect_bitwise("cast bf16 -> bf16", d_b2.download(), b);
}

TEST_F(CudaCast, Fp16CastsBitwise) {
  nz::Rng rng(116);
  std::vector<float> f;
  for (float x : cast_test_values(rng))
    if (!std::isnan(x)) f.push_back(x);
  for (float x : {65504.0f, 65519.0f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f})
    f.push_back(x);  // the largest, overflow, subnormal and tie cases
  const size_t n = f.size();
  std::vector<nz::f16> h = poisoned<nz::f16>(n);
  cpu::cast(h.data(), f.data(), n);
  std::vector<float> f_back = poisoned<float>(n);
  cpu::cast(f_back.data(), h.data(), n);
  DeviceArray<float> d_f(f);
  auto d_h = DeviceArray<nz::f16>::poisoned(n), d_h2 = DeviceArray<nz::f16>::poisoned(n);
  auto d_f_back = DeviceArray<float>::poisoned(n);
  gpu::cast(d_h.ptr(), d_f.ptr(), n);
  expect_bitwise("cast fp32 -> fp16", d_h.download(), h);
  gpu::cast(d_f_back.ptr(), d_h.ptr(), n);
  expect_bitwise("cast fp16 -> fp32", d_f_back.download(), f_back);
  gpu::cast(d_h2.ptr(), d_h.ptr(), n);
  expect_bitwise("cast fp16 -> fp16", d_h2.download(), h);
  DeviceArray<float> d_nan(std::vector<float>{NAN, -NAN});
  auto d_h_nan = DeviceArray<nz::f16>::poisoned(2);
  gpu::cast(d_h_nan.ptr(), d_nan.ptr(), 2);
  for (nz::f16 x : d_h_nan.download()) EXPECT_TRUE(std::isnan(nz::f16_to_f32(x))) << "fp32 NaN -> fp16";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// swap_blocks (ulysses' layout changes around its all-to-alls): data movement, so bit for bit.

// The reference against the formula it stands for, element by element: out[j][i] = in[i][j].
TEST(SwapBlocksReference, SwapsTheFirstTwoAxes) {
  const size_t n0 = 5, n1 = 3, w = 7;  // blocks of 7 floats
  std::vector<float> in(n0 * n1 * w), out(in.size(), -1.0f);
  for (size_t k = 0; k < in.size(); k++) in[k] = float(k);
  nz::ref::swap_blocks(out.data(), in.data(), n0, n1, w * sizeof(float));
  for (size_t i = 0; i < n0; i++)
    for (size_t j = 0; j < n1; j++)
      for (size_t c = 0; c < w; c++) ASSERT_EQ(out[(j * n0 + i) * w + c], in[(i * n1 + j) * w + c]) << i << " " << j;
}

using CudaSwapBlocks = CudaTest;
TEST_F(CudaSwapBlocks, EqualsTheCpuReferenceBitForBit) {
  nz::Rng rng(142);
  struct Shape {
    size_t n0, n1, block, offset;  // offset: bytes past an aligned start, for the 2- and 1-byte words
  };
  const Shape shapes[] = {
      {2 * 8 * 3, 2, 16 * 4, 0},  // ulysses' first swap: B T/S parts rows, S = 2 head groups of 16 fp32
      {2, 2, 8 * 3 * 16 * 4, 0},  // its second: S slots of B = 2 sequences' T/S rows
      {37, 3, 6, 2},              // a bf16 block of 3 elements (2-byte words)
      {11, 4, 5, 1},              // odd bytes (1-byte words)
      {1, 7, 12, 0}, {7, 1, 12, 0}};
  for (const Shape& sh : shapes) {
    SCOPED_TRACE("n0 " + std::to_string(sh.n0) + " n1 " + std::to_string(sh.n1) + " block " + std::to_string(sh.block));
    const size_t bytes = sh.n0 * sh.n1 * sh.block;
    std::vector<unsigned char> in(bytes + sh.offset);
    for (unsigned char& b : in) b = static_cast<unsigned char>(rng.next());
    std::vector<unsigned char> want(bytes + sh.offset, 0xFF);
    nz::ref::swap_blocks(want.data() + sh.offset, in.data() + sh.offset, sh.n0, sh.n1, sh.block);
    DeviceArray<unsigned char> d_in(in);
    auto d_out = DeviceArray<unsigned char>::poisoned(bytes + sh.offset);
#ifdef NZ_HAVE_CUDA
    nz::cuda::swap_blocks(d_out.ptr() + sh.offset, d_in.ptr() + sh.offset, sh.n0, sh.n1, sh.block);
#endif
    expect_bitwise("swap_blocks", d_out.download(), want);
  }
}
