// selftest.cu — the tests of nz_emu itself: one correct kernel that must give the right answer,
// and deliberately broken kernels and host code that the emulator must reject. Built only for the
// emulator (tests/emu.mk); tests/emu_check.sh runs every case and checks the outcome.
//   emu_selftest <case>    exit 0 and print "ok: ..." when the case behaves as intended
//
// Cases that must work:
//   good                 block sum with shuffles, __syncthreads and dynamic shared memory
//   bad_launch           a 2048-thread block is refused (cudaErrorInvalidConfiguration)
//   bad_lda              cublasGemmEx with lda < rows is refused (CUBLAS_STATUS_INVALID_VALUE)
//   poisoned             never-written device memory reads back as 0xFF bytes (NaN)
//   missing_sync         a shared-memory exchange without __syncthreads gives a wrong answer
// Cases the emulator must stop with a message (the check greps for it):
//   out_of_bounds        a thread writes one element past the end of its buffer
//   host_deref           host code reads a device pointer
//   divergent_sync       __syncthreads inside `if (threadIdx.x < 16)`
//   partial_shuffle      half the lanes return, the other half shuffle
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_common.cuh"  // nz::cuda::block_sum, warp_sum

namespace {

using nz::cuda::block_sum;
using nz::cuda::warp_sum;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "selftest: %s failed: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

// out[b] = sum of in[b*blockDim.x .. +blockDim.x), staged through dynamic shared memory
__global__ void block_sums(float* out, const float* in) {
  extern __shared__ float staged[];
  staged[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  const float v = staged[blockDim.x - 1 - threadIdx.x];  // another thread's element
  const float total = block_sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

__global__ void write_index(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) x[i] = float(i);  // BUG: i == n is one past the end
}

__global__ void reverse_without_sync(float* out) {
  __shared__ float s[64];
  s[threadIdx.x] = float(threadIdx.x);
  out[threadIdx.x] = s[63 - threadIdx.x];  // BUG: no __syncthreads between the write and the read
}

__global__ void divergent_sync(float* x) {
  if (threadIdx.x < 16) __syncthreads();  // BUG: half the block never arrives
  x[threadIdx.x] = 1.0f;
}

__global__ void partial_shuffle(float* x) {
  if (threadIdx.x % 32 < 16) return;  // BUG: the remaining lanes shuffle with a full mask
  x[threadIdx.x] = warp_sum(1.0f);
}

float* device_floats(size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc");
  return static_cast<float*>(p);
}

int run(const std::string& c) {
  if (c == "good") {
    const int blocks = 3, threads = 128;
    std::vector<float> in(blocks * threads);
    for (size_t i = 0; i < in.size(); i++) in[i] = float(i % 7);
    float* d_in = device_floats(in.size());
    float* d_out = device_floats(blocks);
    check(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    block_sums<<<blocks, threads, threads * sizeof(float)>>>(d_out, d_in);
    check(cudaGetLastError(), "launch");
    float out[blocks];
    check(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (int b = 0; b < blocks; b++) {
      float want = 0;
      for (int t = 0; t < threads; t++) want += in[b * threads + t];
      if (out[b] != want) {
        printf("wrong: block %d sum %g, want %g\n", b, out[b], want);
        return 1;
      }
    }
    printf("ok: block sums correct\n");
    return 0;
  }
  if (c == "bad_launch") {
    float* x = device_floats(4096);
    write_index<<<1, 2048>>>(x, 4096);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaErrorInvalidConfiguration) {
      printf("wrong: a 2048-thread block gave %s\n", cudaGetErrorName(e));
      return 1;
    }
    printf("ok: %s\n", cudaGetErrorName(e));
    return 0;
  }
  if (c == "bad_lda") {
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    float* a = device_floats(64);
    const float one = 1, zero = 0;
    // 8x8 = (8x8)·(8x8), A with leading dimension 4 < 8 rows
    const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F, 4, a,
                                           CUDA_R_32F, 8, &zero, a, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_INVALID_VALUE) {
      printf("wrong: lda 4 for 8 rows gave %s\n", cublasGetStatusString(st));
      return 1;
    }
    printf("ok: %s\n", cublasGetStatusString(st));
    return 0;
  }
  if (c == "poisoned") {
    float* x = device_floats(5);
    float back[5];
    check(cudaMemcpy(back, x, sizeof(back), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (float v : back)
      if (!std::isnan(v)) {
        printf("wrong: fresh device memory read %g\n", v);
        return 1;
      }
    printf("ok: fresh device memory is NaN\n");
    return 0;
  }
  if (c == "missing_sync") {
    float* x = device_floats(64);
    reverse_without_sync<<<1, 64>>>(x);
    float out[64];
    check(cudaMemcpy(out, x, sizeof(out), cudaMemcpyDeviceToHost), "cudaMemcpy");
    int wrong = 0;
    for (int t = 0; t < 64; t++) wrong += out[t] != float(63 - t);
    if (wrong == 0) {
      printf("wrong: the race went unnoticed\n");
      return 1;
    }
    printf("ok: %d of 64 threads read the shared value before it was written\n", wrong);
    return 0;
  }
  if (c == "out_of_bounds") {
    const int n = 1000;
    float* x = device_floats(n);
    write_index<<<4, 256>>>(x, n);
  } else if (c == "host_deref") {
    float* x = device_floats(16);
    printf("%g\n", x[3]);  // BUG: x is a device pointer
  } else if (c == "divergent_sync") {
    divergent_sync<<<1, 64>>>(device_floats(64));
  } else if (c == "partial_shuffle") {
    partial_shuffle<<<1, 64>>>(device_floats(64));
  } else {
    fprintf(stderr, "selftest: unknown case '%s'\n", c.c_str());
    return 2;
  }
  printf("wrong: case %s was not stopped\n", c.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: emu_selftest <case>\n");
    return 2;
  }
  return run(argv[1]);
}
