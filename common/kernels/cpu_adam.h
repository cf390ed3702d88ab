// cpu_adam.h — the host AdamW of ZeRO-Offload: the optimizer step moved to the CPU has to keep up
// with the GPU, so it is written for speed (dev/bench/bench_adam.cpp measures it).
//
// It computes EXACTLY what nz::cpu::adamw_update computes (kernels_cpu.cpp), bit for bit: the same
// IEEE operations in the same order for every element. Speed comes only from doing many elements
// at once (SIMD lanes, OpenMP threads) and touching memory once; never from FMA, reciprocal
// estimates or reassociation, which would change the bits. So offload trains the same model as
// stage2 (tests/kernels/test_cpu_adam.cpp checks the kernel, tests/stages/test_offload.cpp the whole run).
#pragma once
#include <cstddef>

#include "kernels/dtype.h"

namespace nz::cpu_adam {

// AdamW, step t >= 1, on n elements: p, m, v fp32 (host); g in the storage type T, multiplied by
// grad_scale (clipping) first; weight_decay 0 for biases and layernorm parameters.
// Fused: when p_out is not null, the updated parameters are also written there in the storage
// type (the copy the device gets back), in the same pass. p_out may alias g (same T, same index:
// each element's gradient is read before its parameter is written).
template <class T>
void adamw_update(float* p, float* m, float* v, const T* g, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t, T* p_out = nullptr);

// SIMD lanes per step of the vector loop on this build (16 with AVX-512, 8 with AVX, 4 otherwise:
// SSE, or NEON on 64-bit ARM).
int lanes();

}  // namespace nz::cpu_adam
