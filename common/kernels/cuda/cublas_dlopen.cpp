// cublas_dlopen.cpp — cuBLAS opened by the first GPU matmul that needs it, not at every start.
//
// cuBLAS (and cuBLASLt, which it loads) is about 900 MB of shared library, and loading it costs
// each process about 0.2 s of CPU time before main() runs: every CPU run paid it, and the test
// suites start thousands of processes. So the programs are linked without it. These six functions,
// the only ones the CUDA backend calls (matmul_cublas.cu, kernels_attention.cu), carry cuBLAS's own
// names and signatures (its header declares them); the first call opens libcublas.so.<major> of the
// headers this was compiled against, found like a linked library (the programs' RUNPATH, then the
// system's), and every call goes on to the real function. Nothing else changes: same library, same
// calls, same results. The GPU bundle (make gpu-bundle, NZ_BUNDLE=1) links cuBLAS as before and
// leaves this file out.
#include <cublas_v2.h>
#include <dlfcn.h>

#include "runtime/check.h"  // run_error

namespace {

#define NZ_STR2(x) #x
#define NZ_STR(x) NZ_STR2(x)
constexpr const char* kLibrary = "libcublas.so." NZ_STR(CUBLAS_VER_MAJOR);

void* library() {
  static void* handle = [] {
    void* h = dlopen(kLibrary, RTLD_NOW | RTLD_GLOBAL);
    if (!h)
      nz::run_error("cuBLAS: cannot open %s (%s), expected the CUDA toolkit's or PyTorch's cuBLAS %d; "
                "put its folder on LD_LIBRARY_PATH", kLibrary, dlerror(), CUBLAS_VER_MAJOR);
    return h;
  }();
  return handle;
}

// The real function `name`, of the type of our own definition of it, looked up once.
template <class F>
F real(const char* name) {
  void* f = dlsym(library(), name);
  if (!f) nz::run_error("cuBLAS: %s has no %s, expected cuBLAS %d; check LD_LIBRARY_PATH", kLibrary, name,
                    CUBLAS_VER_MAJOR);
  return reinterpret_cast<F>(f);
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  static auto f = real<decltype(&cublasCreate_v2)>("cublasCreate_v2");
  return f(handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  static auto f = real<decltype(&cublasSetStream_v2)>("cublasSetStream_v2");
  return f(handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  static auto f = real<decltype(&cublasSetWorkspace_v2)>("cublasSetWorkspace_v2");
  return f(handle, workspace, bytes);
}
cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  static auto f = real<decltype(&cublasSetMathMode)>("cublasSetMathMode");
  return f(handle, mode);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  static auto f = real<decltype(&cublasGetStatusString)>("cublasGetStatusString");
  return f(status);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                                         void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  using F = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                               const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                               cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  static auto f = real<F>("cublasGemmEx");
  return f(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType,
           algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, const void* alpha,
    const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
    long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc, long long int strideC,
    int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  using F = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                               const void*, cudaDataType, int, long long int, const void*, cudaDataType, int,
                               long long int, const void*, void*, cudaDataType, int, long long int, int,
                               cublasComputeType_t, cublasGemmAlgo_t);
  static auto f = real<F>("cublasGemmStridedBatchedEx");
  return f(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
           ldc, strideC, batchCount, computeType, algo);
}

}  // extern "C"
