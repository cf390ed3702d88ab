// flash_attention.h — causal self-attention without the (T,T) matrix (kernels_flash_attention.cu),
// the CUDA backend's choice when --attention flash; kernels_attention.cu dispatches to it.
//   forward:  out (B,T,C) and lse (B,NH,T), the log of each row's softmax denominator
//   backward: dqkv (B,T,3C) (overwrite), from dout, qkv and that lse
// The lse is stored at the start of the (B,NH,T,T) att buffer the model already keeps (so the
// model, the memory ledger and their tests are the same for both paths); flash_attention_fits says
// when it fits there and the head size is within the kernels' limit.
#pragma once
#include "dtype.h"  // nz::bf16

namespace nz {
namespace cuda {

template <class T>
bool flash_attention_fits(int Tn, int C, int NH);
template <class T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const float* lse, int B, int Tn, int C,
                              int NH);

}  // namespace cuda
}  // namespace nz
