// ops.h — run every kernel on the backend this run uses: nz::ops::f<T>(...) calls nz::cuda::f<T>
// on the CUDA backend (which picks cuBLAS or its hand-written kernels by nz::kernels() itself), and
// on the CPU nz::cpu::f<T> (fast, the default) or nz::ref::f<T> (--kernels reference). Double
// precision exists only on the CPU.
#pragma once
#include <type_traits>

#include "runtime/check.h"
#include "runtime/device.h"
#include "kernels/kernels.h"

namespace nz::ops {

#ifdef NZ_HAVE_CUDA
#define NZ_OP(name)                                                                 \
  template <class T, class... A>                                                    \
  inline auto name(A... a) {                                                        \
    if constexpr (!std::is_same_v<T, double>)                                       \
      if (current_device() == Device::CUDA) return cuda::name<T>(a...);             \
    if (kernels() == Kernels::Reference) return ref::name<T>(a...);                 \
    return cpu::name<T>(a...);                                                      \
  }
#else
#define NZ_OP(name)                                                                 \
  template <class T, class... A>                                                    \
  inline auto name(A... a) {                                                        \
    if (kernels() == Kernels::Reference) return ref::name<T>(a...);                 \
    return cpu::name<T>(a...);                                                      \
  }
#endif

NZ_OP(embedding_forward)
NZ_OP(embedding_backward)
NZ_OP(layernorm_forward)
NZ_OP(layernorm_backward)
NZ_OP(residual_layernorm_forward)
NZ_OP(layernorm_backward_residual)
NZ_OP(matmul_forward)
NZ_OP(matmul_backward)
NZ_OP(matmul_bias_gelu_forward)
NZ_OP(attention_forward)
NZ_OP(attention_backward)
NZ_OP(gelu_forward)
NZ_OP(gelu_backward)
NZ_OP(gelu_backward_bias)
NZ_OP(residual_forward)
NZ_OP(softmax_xent_forward)
NZ_OP(softmax_xent_backward)
NZ_OP(adamw_update)
NZ_OP(sum_squares)
NZ_OP(accumulate)
NZ_OP(sum_squares_to)
NZ_OP(add_sum_to)
#undef NZ_OP

template <class D, class S>
inline void cast(D* dst, const S* src, size_t n) {
#ifdef NZ_HAVE_CUDA
  if constexpr (!std::is_same_v<D, double> && !std::is_same_v<S, double>)
    if (current_device() == Device::CUDA) return cuda::cast<D, S>(dst, src, n);
#endif
  if (kernels() == Kernels::Reference) return ref::cast<D, S>(dst, src, n);
  cpu::cast<D, S>(dst, src, n);
}

}  // namespace nz::ops
