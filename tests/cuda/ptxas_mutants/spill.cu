// spill.cu — a mutant for tests/cuda/ptxas_check.sh: a kernel whose bound (1024 threads, 2 blocks an
// SM: 32 registers a thread) is too tight for the 48 values it keeps live, so the GPU's compiler
// spills them to local memory, which the gate must refuse.
__global__ void __launch_bounds__(1024, 2) spilling_kernel(float* out, const float* in) {
  float acc[48];
#pragma unroll
  for (int i = 0; i < 48; i++) acc[i] = in[threadIdx.x + i * 1024];
#pragma unroll
  for (int r = 0; r < 8; r++) {
#pragma unroll
    for (int i = 0; i < 48; i++) acc[i] = acc[i] * acc[(i + r + 1) % 48] + 1.0f;
  }
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 48; i++) s += acc[i] * float(i + 1);
  out[threadIdx.x] = s;
}
