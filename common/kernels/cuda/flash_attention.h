// flash_attention.h — causal self-attention without the (T,T) matrix (kernels_flash_attention.cu),
// the CUDA backend's choice when --attention flash; kernels_attention.cu dispatches to it.
//   forward:  out (B,T,C) and lse (B,NH,T), the log of each row's softmax denominator
//   backward: dqkv (B,T,3C) (overwrite), from dout, qkv and that lse
// The lse is passed in the kernel interface's att argument: the model, when flash attention is in
// force (kernels.h flash_attention_in_force), allocates only those B*NH*T floats in att's place.
// flash_attention_fits says whether the head size is within the kernels' limit;
// flash_attention_uses_wmma which of the two families of kernels runs.
#pragma once
#include <type_traits>  // std::is_same_v

#include "kernels/dtype.h"  // nz::bf16, nz::f16

namespace nz {
namespace cuda {

// The head sizes the kernels take (their tiles live in 48 KiB of shared memory); plain header
// functions, so the model, zero_estimate and the tests ask them in builds without CUDA too.
constexpr int kMaxFlashHeadSize = 128;
inline bool flash_attention_fits(int C, int NH) { return C / NH <= kMaxFlashHeadSize; }

// The tensor-core kernels (WMMA) run for bf16 and fp16 storage when the head size is a multiple of
// WMMA's 16; fp32 storage (WMMA takes no fp32 inputs, only TF32, which would round them) and other
// head sizes run the CUDA-core kernels.
template <class T>
inline bool flash_attention_uses_wmma(int C, int NH) {
  return (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) && (C / NH) % 16 == 0;
}

template <class T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const float* lse, const T* out, int B,
                              int Tn, int C, int NH);

}  // namespace cuda
}  // namespace nz
