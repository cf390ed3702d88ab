// emu_check_clean.cu — a clean single-file CUDA program for `make emu-check` (tests/cuda/emu_check.sh):
// a block-wide reversal through shared memory with the barrier it needs (on a stream of its own, an
// event waited for: the runtime calls a small program makes), then its arguments printed
// one per line in brackets (the check that ARGS reach the program as words, unexpanded). Exits 0
// when the reversal is right.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void reverse(float* out, const float* in) {
  __shared__ float staged[128];
  staged[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = staged[blockDim.x - 1 - threadIdx.x];
}

int main(int argc, char** argv) {
  const int n = 128;
  float h[n];
  for (int i = 0; i < n; i++) h[i] = float(i);
  float *in = nullptr, *out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&in), sizeof(h));
  cudaMalloc(reinterpret_cast<void**>(&out), sizeof(h));
  cudaStream_t stream;
  cudaEvent_t done;
  cudaStreamCreate(&stream);
  cudaEventCreate(&done);
  cudaMemsetAsync(out, 0, sizeof(h), stream);
  cudaMemcpy(in, h, sizeof(h), cudaMemcpyHostToDevice);
  reverse<<<1, n, 0, stream>>>(out, in);
  cudaEventRecord(done, stream);
  cudaEventSynchronize(done);
  if (cudaPeekAtLastError() != cudaSuccess) return 2;
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (int i = 0; i < n; i++) wrong += h[i] != float(n - 1 - i);
  for (int i = 1; i < argc; i++) printf("arg [%s]\n", argv[i]);
  printf("%s: %d of %d reversed elements wrong\n", wrong ? "wrong" : "ok", wrong, n);
  return wrong ? 1 : 0;
}
