// mma.h — nz_emu: the part of CUDA's warp matrix API (nvcuda::wmma, the tensor cores) that the
// flash attention kernels use, emulated on the CPU. See cuda_runtime.h in this directory for what
// the emulator is.
//
// On a GPU a fragment is a 16×16 tile spread over the 32 lanes of a warp in a layout NVIDIA does
// not document; here every lane holds the whole tile (x[row * 16 + col]), so a kernel that relies
// on the hardware's layout (indexing x[] to find a row) computes something else here: per-row work
// must go through store_matrix_sync to memory, as on a GPU it must too.
//
// What is emulated, and how:
//   fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16 | __half, row_major | col_major>
//   fragment<accumulator, 16, 16, 16, float>
//   fill_fragment      every element (not a warp operation)
//   load_matrix_sync   a warp barrier (all 32 lanes, as for a shuffle), then every lane reads the tile
//   store_matrix_sync  a warp barrier, then every lane writes its share of the tile: the elements i
//                      (row-major index) with i % 32 == lane. As on a GPU, a lane that reads the
//                      stored tile before a __syncwarp() can see elements other lanes have not yet
//                      written (the scheduler resumes lanes one by one), so a missing __syncwarp
//                      gives wrong answers (dev/emu/selftest.cu, wmma_missing_syncwarp)
//   mma_sync           a warp barrier, then d = a·b + c in fp32: the bf16/half inputs converted
//                      exactly, each element c[i][j] + a[i][0] b[0][j] + a[i][1] b[1][j] + ... in that
//                      order (a GPU's tensor cores add in their own order: tests use tolerances);
//                      computed once for lanes with the same operands (mma_memo)
// What it cannot catch: a missing __syncwarp() between plain threads' writes to shared memory and a
// load_matrix_sync of them. The load's barrier orders them here; on a GPU only __syncwarp() does.
// Checked as a GPU requires: ldm a multiple of 16 bytes (8 bf16/half elements, 4 floats), and, for a
// pointer into the launch's dynamic shared memory, 32-byte (256-bit) alignment. (Device buffers here
// are 16-byte aligned, a GPU's 256, so a pointer into global memory is not checked.)
// `__nv_bfloat16` and `__half` are nz::bf16 and nz::f16 (common/kernels/dtype.h): the same bits.
#pragma once
#include <cstring>  // memcmp, memcpy
#include <type_traits>

#include "cuda_runtime.h"
#include "kernels/dtype.h"  // nz::bf16, nz::f16, nz::load

using __nv_bfloat16 = nz::bf16;
using __half = nz::f16;

namespace nz_emu {
void wmma_barrier();  // the warp-collective part of every *_sync call (emu.cpp)
void wmma_check(const char* what, const void* p, unsigned ldm, size_t elem_bytes);
}  // namespace nz_emu

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment;

// The 16×16×16 shape, the only one emulated: matrix_a is (M, K), matrix_b (K, N), accumulator (M, N),
// all 16×16, stored row-major in x[].
template <class Use, class T, class Layout>
class fragment<Use, 16, 16, 16, T, Layout> {
  static_assert(std::is_same<Use, accumulator>::value
                    ? std::is_same<T, float>::value && std::is_void<Layout>::value
                    : (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) &&
                          (std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value),
                "nz_emu emulates bf16/half matrix_a, matrix_b (row_major or col_major) and float accumulators");

 public:
  static constexpr int num_elements = 256;
  T x[num_elements];
};

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& v) {
  for (T& e : f.x) e = v;
}

// matrix_a, matrix_b: element (r, c) of the operand is p[r * ldm + c] (row_major) or p[c * ldm + r]
// (col_major: the operand's columns are rows in memory, e.g. Kᵀ read from the rows of K).
template <class Use, class T, class Layout>
__attribute__((always_inline)) inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same<Use, accumulator>::value, "an accumulator is loaded with a layout_t argument");
  nz_emu::wmma_barrier();
  nz_emu::wmma_check("load_matrix_sync", p, ldm, sizeof(T));
  const bool row = std::is_same<Layout, row_major>::value;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = row ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

__attribute__((always_inline)) inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  nz_emu::wmma_barrier();
  nz_emu::wmma_check("load_matrix_sync", p, ldm, sizeof(float));
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.x[r * 16 + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

__attribute__((always_inline)) inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  nz_emu::wmma_barrier();
  nz_emu::wmma_check("store_matrix_sync", p, ldm, sizeof(float));
  for (int i = nz_emu::lane_id(); i < 256; i += 32) {  // this lane's share
    const int r = i / 16, c = i % 16;
    (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[i];
  }
}

// d = a·b + c (d may be c), in fp32. Every lane of a warp holds the same operands and computes the
// same d; the lanes resumed one after another after the barrier find the previous lane's operands
// (their bits) in mma_memo and take its d instead of computing it again: the same bits, a 32nd of
// the work (the flash attention tests at T = 1024 are mostly mma_sync).
struct MmaMemo {
  unsigned char a[512], b[512];  // the bf16/half operands' bits
  float c[256], d[256];
  bool valid = false;
};
inline MmaMemo& mma_memo() {
  static MmaMemo memo;  // one per process: blocks run one at a time on one OS thread
  return memo;
}

template <class T, class LayoutA, class LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  static_assert(sizeof(a.x) == sizeof(MmaMemo::a), "16-bit operands");
  nz_emu::wmma_barrier();
  MmaMemo& memo = mma_memo();
  if (memo.valid && std::memcmp(memo.a, a.x, sizeof(memo.a)) == 0 && std::memcmp(memo.b, b.x, sizeof(memo.b)) == 0 &&
      std::memcmp(memo.c, c.x, sizeof(memo.c)) == 0) {
    std::memcpy(d.x, memo.d, sizeof(memo.d));
    return;
  }
  std::memcpy(memo.a, a.x, sizeof(memo.a));
  std::memcpy(memo.b, b.x, sizeof(memo.b));
  std::memcpy(memo.c, c.x, sizeof(memo.c));
  float fa[256], fb[256];
  for (int i = 0; i < 256; i++) {
    fa[i] = nz::load(a.x[i]);
    fb[i] = nz::load(b.x[i]);
  }
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float acc = memo.c[i * 16 + j];
      for (int k = 0; k < 16; k++) acc += fa[i * 16 + k] * fb[k * 16 + j];
      memo.d[i * 16 + j] = acc;
    }
  memo.valid = true;
  std::memcpy(d.x, memo.d, sizeof(memo.d));
}

}  // namespace wmma
}  // namespace nvcuda
