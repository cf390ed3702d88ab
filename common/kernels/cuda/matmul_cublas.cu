// matmul_cublas.cu — the linear layer's three products through cublasGemmEx.
//
// cuBLAS is column-major; our matrices are row-major. A row-major (r,c) matrix, read column-major,
// is its transpose (c,r) with leading dimension c. So each row-major product Y = X·W is computed as
// the column-major product Y^T = W^T·X^T, which needs no copies, only the right transpose flags.
//
// Precision: CUBLAS_COMPUTE_32F — products and sums in fp32 for both storage types (no TF32: the
// default math mode does not allow it), one rounding when the bf16 result is stored.
// Determinism: cuBLAS gives the same bits every run on the same GPU model and toolkit.
#include <cublas_v2.h>  // cublasCreate, cublasSetMathMode, cublasGemmEx, cublasGetStatusString

#include "cuda_common.cuh"  // nz::bf16, NZ_CUDA_CHECK
#include "matmul_cublas.h"  // the declarations below

#define NZ_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                           \
    cublasStatus_t nz_st_ = (call);                                                              \
    if (nz_st_ != CUBLAS_STATUS_SUCCESS)                                                         \
      ::nz::fatal(__FILE__, __LINE__, "cuBLAS error %d (%s) in %s", int(nz_st_),                 \
                  cublasGetStatusString(nz_st_), #call);                                         \
  } while (0)

namespace nz {
namespace cuda {
namespace {

// cuBLAS's workspace, given to it rather than left for it to allocate at its first product: 32 MiB,
// what NVIDIA's documentation recommends for Hopper (less for older GPUs: enough for all).
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// One handle per process (one GPU per rank), created on first use so that a CPU-only run never
// touches cuBLAS (the trainers create it at start-up: cublas_start). Never destroyed: the process
// exit releases it, and the workspace with it.
cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = nullptr;
  if (!handle) {
    NZ_CUBLAS_CHECK(cublasCreate(&handle));
    NZ_CUBLAS_CHECK(cublasSetStream(handle, 0));  // the default stream, like every other kernel
    // bf16/fp16 outputs (the dW products): cuBLAS's default math mode allows a split-K reduction of
    // the partial sums in bf16/fp16, rounding them where the CPU reference never rounds; keep them fp32
    NZ_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    void* workspace = nullptr;
    NZ_CUDA_CHECK(cudaMalloc(&workspace, kCublasWorkspaceBytes));
    NZ_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, kCublasWorkspaceBytes));
  }
  return handle;
}

}  // namespace

void cublas_start() { (void)cublas_handle(); }

template <class T> cudaDataType_t cuda_data_type();
template <> cudaDataType_t cuda_data_type<float>() { return CUDA_R_32F; }
template <> cudaDataType_t cuda_data_type<bf16>() { return CUDA_R_16BF; }  // same bits as nz::bf16
template <> cudaDataType_t cuda_data_type<f16>() { return CUDA_R_16F; }    // same bits as __half

namespace {

// Column-major C (m,n) = op(A) (m,k) · op(B) (k,n)  [+ C when accumulate]
template <class T>
void gemm_colmajor(bool transpose_a, bool transpose_b, int m, int n, int k, const T* A, int lda,
                   const T* B, int ldb, T* C, int ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // fp32 scalars for COMPUTE_32F
  const cudaDataType_t type = cuda_data_type<T>();
  NZ_CUBLAS_CHECK(cublasGemmEx(cublas_handle(), transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                               transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, type,
                               lda, B, type, ldb, &beta, C, type, ldc, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// out (N,OC) = inp (N,C) · w^T.  Column-major: out^T (OC,N) = w (read as (C,OC), transposed)
// · inp^T (read as (C,N)).
template <class T>
void cublas_matmul_forward(T* out, const T* inp, const T* w, int N, int C, int OC, bool accumulate) {
  gemm_colmajor(true, false, OC, N, C, w, C, inp, C, out, OC, accumulate);
}

// dinp (N,C) = dout (N,OC) · w (OC,C).  Column-major: dinp^T (C,N) = w^T (read as (C,OC))
// · dout^T (read as (OC,N)).
template <class T>
void cublas_matmul_dinp(T* dinp, const T* dout, const T* w, int N, int C, int OC) {
  gemm_colmajor(false, false, C, N, OC, w, C, dout, OC, dinp, C, false);
}

// dw (OC,C) += dout^T (OC,N) · inp (N,C).  Column-major: dw^T (C,OC) += inp^T (read as (C,N))
// · dout (read as (OC,N), transposed).
template <class T>
void cublas_matmul_dweight(T* dw, const T* dout, const T* inp, int N, int C, int OC) {
  gemm_colmajor(false, true, C, OC, N, inp, C, dout, OC, dw, C, true);
}

template <class T, class TC>
void cublas_gemm_batched(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                         const T* A, int lda, long long stride_a, const T* B, int ldb,
                         long long stride_b, TC* C, int ldc, long long stride_c, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const float beta = 0.0f;
  NZ_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_handle(), transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, m,
      n, k, &alpha, A, cuda_data_type<T>(), lda, stride_a, B, cuda_data_type<T>(), ldb, stride_b, &beta, C,
      cuda_data_type<TC>(), ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

#define NZ_INSTANTIATE_BATCHED(T, TC)                                                                  \
  template void cublas_gemm_batched<T, TC>(bool, bool, int, int, int, float, const T*, int, long long, \
                                           const T*, int, long long, TC*, int, long long, int);
NZ_INSTANTIATE_BATCHED(float, float)
NZ_INSTANTIATE_BATCHED(bf16, bf16)
NZ_INSTANTIATE_BATCHED(bf16, float)
NZ_INSTANTIATE_BATCHED(f16, f16)
NZ_INSTANTIATE_BATCHED(f16, float)
#undef NZ_INSTANTIATE_BATCHED

#define NZ_INSTANTIATE(T)                                                                      \
  template void cublas_matmul_forward<T>(T*, const T*, const T*, int, int, int, bool);         \
  template void cublas_matmul_dinp<T>(T*, const T*, const T*, int, int, int);                  \
  template void cublas_matmul_dweight<T>(T*, const T*, const T*, int, int, int);
NZ_INSTANTIATE(float)
NZ_INSTANTIATE(bf16)
NZ_INSTANTIATE(f16)
#undef NZ_INSTANTIATE

}  // namespace cuda
}  // namespace nz
