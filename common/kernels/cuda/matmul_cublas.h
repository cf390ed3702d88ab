// matmul_cublas.h — the three products of a linear layer through cuBLAS (matmul_cublas.cu), for
// kernels_matmul.cu's dispatch, and the batched product of attention's cuBLAS path. Row-major shapes as in kernel_table.inc; T = float or nz::bf16.
#pragma once

namespace nz {
namespace cuda {

// The handle, made now (it is otherwise made by the first product) with a workspace of its own,
// so that both are in the device-memory baseline taken before the model's first allocation.
void cublas_start();

// out (N,OC) = inp (N,C) @ w (OC,C)^T, plus the old out when accumulate (how the bias gets in)
template <class T>
void cublas_matmul_forward(T* out, const T* inp, const T* w, int N, int C, int OC, bool accumulate);
// dinp (N,C) = dout (N,OC) @ w (OC,C)   (overwrite)
template <class T>
void cublas_matmul_dinp(T* dinp, const T* dout, const T* w, int N, int C, int OC);
// dw (OC,C) += dout (N,OC)^T @ inp (N,C)   (accumulate)
template <class T>
void cublas_matmul_dweight(T* dw, const T* dout, const T* inp, int N, int C, int OC);

// The batched product attention uses (kernels_attention.cu), in cuBLAS's own column-major terms:
//   C_i (m,n) = alpha * op(A_i) (m,k) · op(B_i) (k,n),  i = 0..batch-1,  X_i = X + i * stride_X
// (overwrite). A and B are of the storage type T; C is T or float (attention keeps its scores in
// fp32). Instantiated for (float, float), (bf16, bf16) and (bf16, float).
template <class T, class TC>
void cublas_gemm_batched(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                         const T* A, int lda, long long stride_a, const T* B, int ldb,
                         long long stride_b, TC* C, int ldc, long long stride_c, int batch);

}  // namespace cuda
}  // namespace nz
