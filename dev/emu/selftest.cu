// selftest.cu — the tests of nz_emu itself: one correct kernel that must give the right answer,
// and deliberately broken kernels and host code that the emulator must reject. Built only for the
// emulator (dev/emu.mk); tests/cuda/emu_check.sh runs every case and checks the outcome.
//   emu_selftest <case>    exit 0 and print "ok: ..." when the case behaves as intended
//
// Cases that must work:
//   good                 block sum with shuffles, __syncthreads and dynamic shared memory
//   bad_launch           a 2048-thread block is refused (cudaErrorInvalidConfiguration)
//   bad_lda              cublasGemmEx with lda < rows is refused (CUBLAS_STATUS_INVALID_VALUE)
//   poisoned             never-written device memory reads back as 0xFF bytes (NaN)
//   missing_sync         a shared-memory exchange without __syncthreads gives a wrong answer
//   wmma                 the emulated tensor cores (mma.h): D = A·B + C on one 16×16×16 tile, bf16 and
//                        half, B read row-major and col-major, D stored both ways, against a plain loop
//   wmma_missing_syncwarp  lanes that read a tile store_matrix_sync wrote without __syncwarp() first
//                        read other lanes' elements before they are written
//   async_copy           cp.async (cuda_pipeline.h): 16-byte copies into shared memory, committed,
//                        waited for, then read by other threads after __syncthreads: the right answer
//   async_missing_wait   the same kernel without __pipeline_wait_prior: every thread reads shared
//                        memory that the copies have not yet reached (the copy lands at the wait)
// Cases the emulator must stop with a message (the check greps for it):
//   out_of_bounds        a thread writes one element past the end of its buffer
//   host_deref           host code reads a device pointer
//   divergent_sync       __syncthreads inside `if (threadIdx.x < 16)`
//   partial_shuffle      half the lanes return, the other half shuffle
//   wmma_divergent       half the lanes return, the other half call mma_sync
//   wmma_bad_ldm         load_matrix_sync of bf16 rows 20 elements apart (40 bytes, not a multiple of 16)
//   wmma_misaligned      load_matrix_sync from byte 16 of shared memory (a GPU needs 32-byte alignment)
//   async_misaligned     a 16-byte __pipeline_memcpy_async from an address 8 bytes into a buffer
//   mask_syncwarp        lanes 0-15 call __syncwarp(0xffff0000): a mask that leaves them out
//   mask_shuffle         every lane calls __shfl_down_sync(0xffff0000, ...): lanes 0-15 are left out
#include <cublas_v2.h>
#include <cuda_pipeline.h>  // __pipeline_memcpy_async, commit, wait_prior (dev/emu/include/cuda_pipeline.h)
#include <cuda_runtime.h>
#include <mma.h>  // nvcuda::wmma (dev/emu/include/mma.h)

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_common.cuh"  // nz::cuda::block_sum, warp_sum
#include "runtime/rng.h"            // nz::Rng

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

// out = in reversed by 4-float pieces: thread i copies piece i of in into shared memory with one 16-byte
// asynchronous copy, and after the barrier writes piece (n - 1 - i), which another thread copied.
__global__ void reverse_pieces_async(float* out, const float* in, bool wait) {
  extern __shared__ float staged[];
  const int i = threadIdx.x, n = blockDim.x;
  __pipeline_memcpy_async(staged + 4 * i, in + 4 * i, 16);
  __pipeline_commit();
  if (wait) __pipeline_wait_prior(0);  // the BUG when not: the copy has not landed at the barrier
  __syncthreads();
  for (int c = 0; c < 4; c++) out[4 * i + c] = staged[4 * (n - 1 - i) + c];
}

__global__ void divergent_sync(float* x) {
  if (threadIdx.x < 16) __syncthreads();  // BUG: half the block never arrives
  x[threadIdx.x] = 1.0f;
}

__global__ void partial_shuffle(float* x) {
  if (threadIdx.x % 32 < 16) return;  // BUG: the remaining lanes shuffle with a full mask
  x[threadIdx.x] = warp_sum(1.0f);
}

__global__ void syncwarp_wrong_mask(float* x) {
  if (threadIdx.x < 16) __syncwarp(0xffff0000u);  // BUG: the calling lanes are not in the mask
  x[threadIdx.x] = 1.0f;
}

__global__ void shuffle_wrong_mask(float* x) {
  x[threadIdx.x] = __shfl_down_sync(0xffff0000u, 1.0f, 1);  // BUG: lanes 0-15 call it, outside the mask
}

namespace wmma = nvcuda::wmma;

// D = A·B + C for one 16×16×16 tile (A, B of W = bf16 or half; C, D fp32; all row-major in global
// memory, bt = B's transpose), through dynamic shared memory as the flash attention kernels go: A
// row-major; B read both as row_major (from b) and as col_major (from bt's rows), giving d_row (stored
// row-major) and d_col (stored col-major: d_col holds D's transpose). One warp.
template <class W>
__global__ void wmma_tile(float* d_row, float* d_col, const W* a, const W* b, const W* bt, const float* c) {
  extern __shared__ float smem[];
  constexpr int ld = 24, ldc = 20;  // padded rows: 48 and 80 bytes
  W* As = reinterpret_cast<W*>(smem);
  W* Bs = As + 16 * ld;
  W* Bts = Bs + 16 * ld;
  float* Cs = reinterpret_cast<float*>(Bts + 16 * ld);
  for (int e = threadIdx.x; e < 256; e += 32) {
    As[e / 16 * ld + e % 16] = a[e];
    Bs[e / 16 * ld + e % 16] = b[e];
    Bts[e / 16 * ld + e % 16] = bt[e];
    Cs[e / 16 * ldc + e % 16] = c[e];
  }
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> fb;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> fbt;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc, d1, d2;
  wmma::load_matrix_sync(fa, As, ld);
  wmma::load_matrix_sync(fb, Bs, ld);
  wmma::load_matrix_sync(fbt, Bts, ld);
  wmma::load_matrix_sync(fc, Cs, ldc, wmma::mem_row_major);
  wmma::mma_sync(d1, fa, fb, fc);
  wmma::mma_sync(d2, fa, fbt, fc);
  wmma::store_matrix_sync(d_row, d1, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(d_col, d2, 16, wmma::mem_col_major);
}

// Each lane sums row lane % 16 of a tile that store_matrix_sync has just written to shared memory.
__global__ void row_sums_without_syncwarp(float* sums, const float* tile) {
  extern __shared__ float smem[];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, tile, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(smem, f, 16, wmma::mem_row_major);
  // BUG: no __syncwarp(): each lane wrote only its share of the tile
  float s = 0.0f;
  for (int c = 0; c < 16; c++) s += smem[threadIdx.x % 16 * 16 + c];
  sums[threadIdx.x] = s;
}

__global__ void divergent_mma(float* out) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(a, nz::f32_to_bf16(1.0f));
  wmma::fill_fragment(b, nz::f32_to_bf16(1.0f));
  wmma::fill_fragment(c, 0.0f);
  if (threadIdx.x >= 16) return;  // BUG: mma_sync needs the whole warp
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

// A bf16 tile loaded from shared memory at byte `offset`, rows `ldm` elements apart.
__global__ void load_bf16_tile(float* out, int offset, unsigned ldm) {
  extern __shared__ float smem[];
  for (int e = threadIdx.x; e < 16 * 32; e += 32) reinterpret_cast<__nv_bfloat16*>(smem)[e] = nz::f32_to_bf16(1.0f);
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(smem) + offset), ldm);
  out[threadIdx.x] = 1.0f;
}

float* device_floats(size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc");
  return static_cast<float*>(p);
}

template <class W>
int check_wmma(const char* name, W (*to_w)(float)) {
  nz::Rng rng(7);
  std::vector<W> a(256), b(256), bt(256);
  std::vector<float> c(256);
  for (int i = 0; i < 256; i++) {
    a[i] = to_w(rng.uniform() * 4.0f - 2.0f);
    b[i] = to_w(rng.uniform() * 4.0f - 2.0f);
    c[i] = rng.uniform() - 0.5f;
  }
  for (int k = 0; k < 16; k++)
    for (int j = 0; j < 16; j++) bt[j * 16 + k] = b[k * 16 + j];
  W *d_a = nullptr, *d_b = nullptr, *d_bt = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&d_a), 512), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&d_b), 512), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&d_bt), 512), "cudaMalloc");
  float *d_c = device_floats(256), *d_row = device_floats(256), *d_col = device_floats(256);
  check(cudaMemcpy(d_a, a.data(), 512, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(d_b, b.data(), 512, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(d_bt, bt.data(), 512, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(d_c, c.data(), 1024, cudaMemcpyHostToDevice), "cudaMemcpy");
  wmma_tile<W><<<1, 32, 3 * 16 * 24 * sizeof(W) + 16 * 20 * sizeof(float)>>>(d_row, d_col, d_a, d_b, d_bt, d_c);
  check(cudaGetLastError(), "launch");
  std::vector<float> row(256), col(256);
  check(cudaMemcpy(row.data(), d_row, 1024, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(col.data(), d_col, 1024, cudaMemcpyDeviceToHost), "cudaMemcpy");
  // the plain loop: fp32 products of the exact inputs, added to c in k order (mma.h's definition)
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float want = c[i * 16 + j];
      for (int k = 0; k < 16; k++) want += nz::load(a[i * 16 + k]) * nz::load(b[k * 16 + j]);
      if (row[i * 16 + j] != want || col[j * 16 + i] != want) {
        printf("wrong: %s D[%d][%d] = %g (B row_major), %g (B col_major), want %g\n", name, i, j, row[i * 16 + j],
               col[j * 16 + i], want);
        return 1;
      }
    }
  return 0;
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
  if (c == "wmma") {
    if (check_wmma<__nv_bfloat16>("bf16", nz::f32_to_bf16) || check_wmma<__half>("half", nz::f32_to_f16)) return 1;
    printf("ok: wmma D = A·B + C (bf16 and half; B row- and col-major) equals the plain loop\n");
    return 0;
  }
  if (c == "wmma_missing_syncwarp") {
    std::vector<float> tile(256);
    for (int i = 0; i < 256; i++) tile[i] = float(i % 7);
    float *d_tile = device_floats(256), *d_sums = device_floats(32);
    check(cudaMemcpy(d_tile, tile.data(), 1024, cudaMemcpyHostToDevice), "cudaMemcpy");
    row_sums_without_syncwarp<<<1, 32, 256 * sizeof(float)>>>(d_sums, d_tile);
    float sums[32];
    check(cudaMemcpy(sums, d_sums, sizeof(sums), cudaMemcpyDeviceToHost), "cudaMemcpy");
    int wrong = 0;
    for (int l = 0; l < 32; l++) {
      float want = 0.0f;
      for (int col = 0; col < 16; col++) want += tile[l % 16 * 16 + col];
      wrong += !(sums[l] == want);
    }
    if (wrong == 0) {
      printf("wrong: the missing __syncwarp went unnoticed\n");
      return 1;
    }
    printf("ok: %d of 32 lanes read the stored tile before the other lanes had written it\n", wrong);
    return 0;
  }
  if (c == "async_copy" || c == "async_missing_wait") {
    const int n = 64;  // threads, 4 floats each
    std::vector<float> in(4 * n);
    for (int i = 0; i < 4 * n; i++) in[i] = float(i);
    float *d_in = device_floats(4 * n), *d_out = device_floats(4 * n);
    check(cudaMemcpy(d_in, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    reverse_pieces_async<<<1, n, 4 * n * sizeof(float)>>>(d_out, d_in, c == "async_copy");
    std::vector<float> out(4 * n);
    check(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    int wrong = 0;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < 4; k++) wrong += !(out[4 * i + k] == in[4 * (n - 1 - i) + k]);
    if (c == "async_copy") {
      if (wrong) {
        printf("wrong: %d of %d elements differ after waited-for asynchronous copies\n", wrong, 4 * n);
        return 1;
      }
      printf("ok: 16-byte asynchronous copies, waited for, then read across threads\n");
      return 0;
    }
    if (wrong == 0) {
      printf("wrong: reading before __pipeline_wait_prior went unnoticed\n");
      return 1;
    }
    printf("ok: %d of %d elements read before their copy landed (no __pipeline_wait_prior)\n", wrong, 4 * n);
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
  } else if (c == "wmma_divergent") {
    divergent_mma<<<1, 32>>>(device_floats(256));
  } else if (c == "wmma_bad_ldm") {
    load_bf16_tile<<<1, 32, 2048>>>(device_floats(32), 0, 20);
  } else if (c == "wmma_misaligned") {
    load_bf16_tile<<<1, 32, 2048>>>(device_floats(32), 16, 32);
  } else if (c == "async_misaligned") {
    float* in = device_floats(64);
    reverse_pieces_async<<<1, 8, 8 * 16>>>(device_floats(64), in + 2, true);  // 8 bytes in: not 16-aligned
  } else if (c == "mask_syncwarp") {
    syncwarp_wrong_mask<<<1, 32>>>(device_floats(32));
  } else if (c == "mask_shuffle") {
    shuffle_wrong_mask<<<1, 32>>>(device_floats(32));
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
