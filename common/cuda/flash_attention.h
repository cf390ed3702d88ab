// flash_attention.h — causal self-attention without the (T,T) matrix (kernels_flash_attention.cu),
// the CUDA backend's choice when --attention flash; kernels_attention.cu dispatches to it.
//   forward:  out (B,T,C) and lse (B,NH,T), the log of each row's softmax denominator
//   backward: dqkv (B,T,3C) (overwrite), from dout, qkv and that lse
// The lse is passed in the kernel interface's att argument: the model, when flash attention is in
// force (kernels.h flash_attention_in_force), allocates only those B*NH*T floats in att's place.
// flash_attention_fits says whether the head size is within the kernels' limit.
#pragma once
#include "dtype.h"  // nz::bf16

namespace nz {
namespace cuda {

// The head sizes the kernels take (their per-thread rows live in 48 KiB of shared memory); a plain
// header function, so the model and zero_estimate ask it in builds without CUDA too.
constexpr int kMaxFlashHeadSize = 128;
inline bool flash_attention_fits(int C, int NH) { return C / NH <= kMaxFlashHeadSize; }

template <class T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const float* lse, int B, int Tn, int C,
                              int NH);

}  // namespace cuda
}  // namespace nz
