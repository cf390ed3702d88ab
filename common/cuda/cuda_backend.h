// cuda_backend.h — run-time choices of the CUDA backend that plain C++ code may set (this header
// needs no CUDA headers). The kernels themselves are declared in kernels.h (nz::cuda::*).
#pragma once

namespace nz {
namespace cuda {

// Which implementation nz::cuda::matmul_forward / matmul_backward use:
//   Tiled  — the hand-written shared-memory kernel in kernels_matmul.cu (read it to learn how a
//            GEMM works on a GPU);
//   Cublas — cublasGemmEx with fp32 accumulation (matmul_cublas.cu): what a real run wants.
// Both compute every product in fp32 and round once when storing, so they agree within rounding.
// Default: Cublas.
enum class MatmulImpl { Tiled, Cublas };
void set_matmul_impl(MatmulImpl impl);
MatmulImpl matmul_impl();
inline const char* matmul_impl_name(MatmulImpl impl) {
  return impl == MatmulImpl::Tiled ? "tiled" : "cublas";
}

}  // namespace cuda
}  // namespace nz
