// matmul_cublas.h — the three products of a linear layer through cuBLAS (matmul_cublas.cu), for
// kernels_matmul.cu's dispatch. Row-major shapes as in kernel_decls.inc; T = float or nz::bf16.
#pragma once

namespace nz {
namespace cuda {

// out (N,OC) = inp (N,C) @ w (OC,C)^T, plus the old out when accumulate (how the bias gets in)
template <class T>
void cublas_matmul_forward(T* out, const T* inp, const T* w, int N, int C, int OC, bool accumulate);
// dinp (N,C) = dout (N,OC) @ w (OC,C)   (overwrite)
template <class T>
void cublas_matmul_dinp(T* dinp, const T* dout, const T* w, int N, int C, int OC);
// dw (OC,C) += dout (N,OC)^T @ inp (N,C)   (accumulate)
template <class T>
void cublas_matmul_dweight(T* dw, const T* dout, const T* inp, int N, int C, int OC);

}  // namespace cuda
}  // namespace nz
