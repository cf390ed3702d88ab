// cublas_v2.h — nz_emu: cublasGemmEx as nanoZeRO calls it, on the CPU (dev/emu/emu.cpp), with
// cuBLAS's own argument rules (column-major, leading dimensions at least the stored rows, C not
// read when beta is 0), so a wrong transpose flag or leading dimension fails here as it would on a
// GPU. See cuda_runtime.h in this directory for what the emulator is.
#pragma once
#include "cuda_runtime.h"

struct nz_emu_cublas;
typedef nz_emu_cublas* cublasHandle_t;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
// The workspace must be device memory of at least `bytes` (checked); the emulator uses none.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);
const char* cublasGetStatusString(cublasStatus_t status);
// Math modes. The emulator's products are plain fp32 loops, so every mode computes the same thing
// here; the modes cuBLAS accepts are accepted (the default, and no reduced-precision reductions).
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16 };
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
// C (m,n) = alpha * op(A) (m,k) · op(B) (k,n) + beta * C, all column-major; alpha and beta point to
// floats (CUBLAS_COMPUTE_32F); A and B both CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F, C the same type as
// them or CUDA_R_32F (the combinations cuBLAS supports with CUBLAS_COMPUTE_32F).
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* A, cudaDataType_t Atype,
                            int lda, const void* B, cudaDataType_t Btype, int ldb, const void* beta,
                            void* C, cudaDataType_t Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
// The same for batch products C_i = alpha * op(A_i) · op(B_i) + beta * C_i, X_i = X + i * strideX.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                          const void* A, cudaDataType_t Atype, int lda, long long strideA,
                                          const void* B, cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo);
