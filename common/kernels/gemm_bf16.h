// gemm_bf16.h — matrix products of bf16 operands on the CPU's own bf16 dot-product instructions.
//
// A bf16 product on a CPU is only faster than an fp32 one if the hardware multiplies bf16 pairs
// itself (AVX512-BF16's VDPBF16PS, AMX): then it does twice the work per instruction and reads half
// the bytes. Without them the operands are widened to fp32 (exactly) and go through sgemm
// (kernels_cpu.cpp), which is what bf16_gemm() leaves its caller to do when it returns false.
//
// The library is oneDNN (Debian's libdnnl-dev): its matmul has hand-tuned kernels for those
// instructions; the BLAS this project links for fp32 has no bf16 product in Debian's build.
// Each product of two bf16 values is exact in fp32 and the sums are fp32 sums, so the result obeys
// the same rounding bound as the widened sgemm (tests/kernels/test_kernels_ref.cpp), only in another order.
#pragma once
#include "kernels/dtype.h"

namespace nz::cpu {

// c (M,N) = op(a) (M,K) @ op(b) (K,N), fp32 result, row-major, c overwritten; op(x) = x or x^T,
// as in blas_gemm(). Returns false, touching nothing, if this CPU has no bf16 dot-product
// instructions oneDNN can use (it then has no bf16 matmul at all, or only a plain reference loop),
// or NZ_CPU_BF16_GEMM=widen is set, to compare: the caller widens instead.
// Same bits every call for the same shapes and thread count. Not to be called from inside a
// parallel region.
bool bf16_gemm(bool ta, bool tb, int M, int N, int K, const bf16* a, int lda, const bf16* b, int ldb,
               float* c, int ldc);

// Whether bf16_gemm() runs on the hardware's bf16 instructions here, decided once per process
// (oneDNN asked for a product on a small shape; any error it raises means no).
bool bf16_gemm_available();

// The path bf16 products take in this process, in words, for a run's header and the benchmark:
// "oneDNN on the CPU's bf16 instructions (brg:avx512_core_bf16)" or "widened to fp32 for sgemm (...)".
const char* bf16_gemm_path();

}  // namespace nz::cpu
