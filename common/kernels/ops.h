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

// One dispatch per entry of kernel_table.inc. Ts are the template arguments as the caller writes
// them (ops::gelu_forward<bf16>, ops::cast<float, bf16>); the arguments a are passed on unchanged.
#ifdef NZ_HAVE_CUDA
#define NZ_KERNEL(cuda_file, types, ret, name, params)                                 \
  template <class... Ts, class... A>                                                 \
  inline ret name(A... a) {                                                          \
    if constexpr (!(std::is_same_v<Ts, double> || ...)) /* no double on the GPU */   \
      if (current_device() == Device::CUDA) return cuda::name<Ts...>(a...);          \
    if (kernels() == Kernels::Reference) return ref::name<Ts...>(a...);              \
    return cpu::name<Ts...>(a...);                                                   \
  }
#else
#define NZ_KERNEL(cuda_file, types, ret, name, params)                                 \
  template <class... Ts, class... A>                                                 \
  inline ret name(A... a) {                                                          \
    if (kernels() == Kernels::Reference) return ref::name<Ts...>(a...);              \
    return cpu::name<Ts...>(a...);                                                   \
  }
#endif
#include "kernels/kernel_table.inc"
#undef NZ_KERNEL

}  // namespace nz::ops
