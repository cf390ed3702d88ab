// kernels.h — every op of the GPT model, forward and backward, as plain functions over raw arrays.
//
// The same declarations (made from the one list, kernel_table.inc) exist three times:
//   nz::ref  — kernels_ref.cpp: the textbook loops, what a learner reads first; the fast kernels
//              are tested against it. Instantiated for float, bf16, fp16 and double.
//   nz::cpu  — kernels_cpu.cpp: the same functions made fast (the matrix products through a BLAS,
//              the rest vectorized and threaded), what runs on machines without a GPU.
//              Instantiated for float, bf16, fp16 and double (double: the finite-difference tests).
//   nz::cuda — common/kernels/cuda/*.cu: hand-written CUDA kernels, float, bf16 and fp16, on device pointers; the
//              matrix products also through cuBLAS.
// T is the storage type; arithmetic is done in acc_t<T> (fp32, or double).
//
// Conventions (identical for all three):
//  - weight and bias gradients ACCUMULATE (+=): a unit's backward zeroes its gradient first, and
//    the tied embedding collects two contributions (LM head and token lookup) in one buffer;
//  - input gradients (dinp) are OVERWRITTEN (=);
//  - a null bias / dbias / dinp pointer means "none";
//  - every reduction runs in a fixed order, so results are bitwise reproducible run to run.
#pragma once
#include <cstddef>
#include "kernels/dtype.h"

namespace nz {

// Which kernels a run uses (--kernels; ops.h dispatches on it), the same choice on both backends:
//   Reference — the hand-written lesson: nz::ref's textbook loops on the CPU, the tiled CUDA
//               kernels on the GPU;
//   Fast      — a well-kept library for the matrix products: a BLAS on the CPU (nz::cpu), cuBLAS
//               on the GPU. The default.
// Either way every result is the same bits run after run for the same shapes and thread count.
enum class Kernels { Reference, Fast };
void set_kernels(Kernels k);
Kernels kernels();
inline const char* kernels_name(Kernels k) { return k == Kernels::Reference ? "reference" : "fast"; }

// Which attention the CUDA backend's fast kernels use (--attention):
//   Gemm  — the four products as batched cuBLAS GEMMs (tensor cores) around a softmax kernel, the
//           (B,NH,T,T) probabilities written and read back. The default.
//   Flash — common/kernels/cuda/kernels_flash_attention.cu: tiles in shared memory, an online softmax, only
//           one number per row saved; the (T,T) matrix never reaches memory.
// The CPU and --kernels reference keep the textbook attention either way.
enum class Attention { Gemm, Flash };
void set_attention(Attention a);
Attention attention();
inline const char* attention_name(Attention a) { return a == Attention::Flash ? "flash" : "gemm"; }
// Whether a block's attention runs the flash kernels: the CUDA device, --kernels fast, --attention
// flash, and a head size (C / NH) they take (else the CUDA fast path falls back to gemm). The model
// asks once, when it allocates its activations: with flash in force it keeps only the log-sum-exp,
// B*NH*T fp32, in place of the (B,NH,T,T) probabilities (model.cpp ActLayout).
bool flash_attention_in_force(int C, int NH);

// The declarations, one per entry of kernel_table.inc, e.g.
//   template <class T> void gelu_forward(T* out, const T* inp, size_t n);
#define NZ_TEMPLATE_T template <class T>
#define NZ_TEMPLATE_A template <class A>
#define NZ_TEMPLATE_DS template <class D, class S>
#define NZ_KERNEL(cuda_file, types, ret, name, params) NZ_TEMPLATE_##types ret name params;
namespace ref {  // the reference: read this one first
#include "kernels/kernel_table.inc"
}  // namespace ref
namespace cpu {
#include "kernels/kernel_table.inc"
}  // namespace cpu
namespace cuda {
#include "kernels/kernel_table.inc"
}  // namespace cuda
#undef NZ_KERNEL
#undef NZ_TEMPLATE_T
#undef NZ_TEMPLATE_A
#undef NZ_TEMPLATE_DS
}  // namespace nz
