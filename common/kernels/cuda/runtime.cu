// runtime.cu — the CUDA side of device.h: nz::cuda_rt, thin checked wrappers over the CUDA runtime
// (device.cpp calls these when the CUDA backend is compiled in; nothing else does), and the
// kernels' scratch buffer.
#include <cuda_runtime.h>  // cudaMalloc, cudaMemcpy, cudaGetDeviceCount, cudaMemGetInfo, ...

#include <cstdio>
#include <vector>

#include "cuda_check.h"   // NZ_CUDA_CHECK
#include "cuda_common.cuh"  // scratch_buffer (declaration)
#include "matmul_cublas.h"  // cublas_start
#include "runtime/device.h"       // nz::cuda_rt declarations

namespace nz {
namespace cuda_rt {

bool compiled() { return true; }

// A machine with the CUDA toolkit but no GPU or no driver is normal (a build machine, a laptop):
// there cudaGetDeviceCount fails, and that means "0 GPUs", not an error.
int device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls do not report it
    return 0;
  }
  return n;
}

void set_device(int ordinal) { NZ_CUDA_CHECK(cudaSetDevice(ordinal)); }

void start_libraries() {
  NZ_CUDA_CHECK(cudaFree(nullptr));  // the context exists after this, whichever CUDA version
  cuda::cublas_start();
}

namespace {
std::vector<cudaEvent_t> g_timers;  // NZ_PROFILE's events, reused every step; never destroyed
}

void timer_record(int i) {
  while (int(g_timers.size()) <= i) {
    cudaEvent_t e = nullptr;
    NZ_CUDA_CHECK(cudaEventCreate(&e));
    g_timers.push_back(e);
  }
  NZ_CUDA_CHECK(cudaEventRecord(g_timers[size_t(i)], 0));
}

double timer_elapsed_ms(int from, int to) {
  float ms = 0;
  NZ_CUDA_CHECK(cudaEventElapsedTime(&ms, g_timers[size_t(from)], g_timers[size_t(to)]));
  return ms;
}

void* malloc_device(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    // Out of memory is the likely case: say how much was asked for and how much was free.
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    ::nz::fatal(__FILE__, __LINE__,
                "cudaMalloc of %zu bytes failed: %s (%s); GPU has %zu of %zu bytes free. "
                "HINT: use a smaller model or batch, more ranks, or a higher ZeRO stage",
                bytes, cudaGetErrorName(err), cudaGetErrorString(err), free_bytes, total_bytes);
  }
  return p;
}

void free_device(void* p) {
  if (p) NZ_CUDA_CHECK(cudaFree(p));
}

void* malloc_pinned(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  NZ_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void free_pinned(void* p) {
  if (p) NZ_CUDA_CHECK(cudaFreeHost(p));
}

void memset_zero(void* p, size_t bytes) {
  if (bytes == 0) return;
  NZ_CUDA_CHECK(cudaMemset(p, 0, bytes));
}

// cudaMemcpyDefault: the runtime tells device from host pointers itself (unified addressing), so
// one call serves host->device, device->host and device->device. It is synchronous with respect
// to the host for pageable memory and ordered after all earlier work on the default stream.
void memcpy_any(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  NZ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

// Offload's copies run on a stream of their own, so the host can keep working while they move.
// Each copy first waits (on the GPU, not the host) for the work already queued on the default
// (compute) stream, whose results it may read; copy_stream_sync() is where the host waits.
static cudaStream_t copy_stream() {
  static cudaStream_t s = nullptr;
  if (!s) NZ_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void memcpy_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  static cudaEvent_t compute_done = nullptr;
  if (!compute_done) NZ_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done, cudaEventDisableTiming));
  NZ_CUDA_CHECK(cudaEventRecord(compute_done, 0));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(copy_stream(), compute_done, 0));
  NZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_stream()));
}

void copy_stream_sync() { NZ_CUDA_CHECK(cudaStreamSynchronize(copy_stream())); }

// On the default (compute) stream, so ordered after the kernels queued before it and before those
// queued after it; from pinned memory it returns at once.
void memcpy_queued(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  NZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0));
}

void synchronize() { NZ_CUDA_CHECK(cudaDeviceSynchronize()); }

void mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  NZ_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

// The properties query is slow (milliseconds), so the name is cached per device ordinal.
const char* device_name() {
  static char name[256] = "";
  static int cached_ordinal = -1;
  int ordinal = 0;
  NZ_CUDA_CHECK(cudaGetDevice(&ordinal));
  if (ordinal != cached_ordinal) {
    cudaDeviceProp prop;
    NZ_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    snprintf(name, sizeof(name), "%s", prop.name);
    cached_ordinal = ordinal;
  }
  return name;
}

}  // namespace cuda_rt

namespace cuda {

void* scratch_buffer(size_t bytes) {
  static void* buffer = nullptr;
  static size_t capacity = 0;
  if (bytes > capacity) {
    // cudaFree waits for all queued work, so no kernel still reads the old buffer.
    if (buffer) NZ_CUDA_CHECK(cudaFree(buffer));
    NZ_CUDA_CHECK(cudaMalloc(&buffer, bytes));
    capacity = bytes;
  }
  return buffer;
}

}  // namespace cuda
}  // namespace nz
