// cuda_runtime.h — nz_emu: the part of the CUDA runtime and device language that nanoZeRO's
// CUDA backend uses, emulated on the CPU, so the kernels in common/kernels/cuda/ can be run and tested on
// a machine without a GPU (and stepped through in gdb).
//
// How a kernel runs here: dev/emu/cu2cpp.pl rewrites each launch `k<<<grid, block, smem>>>(args)`
// into `::nz_emu::launch(k, "k", grid, block, smem)(args)`, and the .cu files are then compiled as
// plain C++ with this directory first on the include path. A launch runs the blocks one after
// another; inside a block every CUDA thread is a fiber (its own stack) on one OS thread, and the
// fibers run until they reach __syncthreads, __syncwarp, a shuffle or a WMMA *_sync call (mma.h),
// where they wait for the rest of their block or warp. Released threads run forwards and backwards
// in turn (NZ_EMU_SEED=N: in a random order drawn from N, blocks too). That order turns only some
// missing barriers into wrong results; the race check (NZ_EMU_CHECK, below) reports the rest.
//
// What the emulator checks that real hardware would only do silently wrong (each is a fatal error
// naming the kernel, block and thread):
//   - a thread that reads or writes outside every device allocation: each cudaMalloc ends at a page
//     boundary followed by an inaccessible guard page;
//   - host code that dereferences a device pointer: device memory is inaccessible except while a
//     kernel, a cudaMemcpy/cudaMemset or a collective runs;
//   - memory read before anything wrote it: cudaMalloc and dynamic shared memory are filled with
//     0xFF bytes (a NaN in fp32 and bf16);
//   - barriers that not every thread reaches (divergent __syncthreads, shuffles with exited lanes
//     or lanes at different shuffles), and launch configurations a GPU would reject.
// NZ_EMU_CHECK=all (or race,uninit,bounds,misaligned,stream; `make emu-check CU=file.cu` sets it) checks
// every load and store of a kernel (dev/emu/check.cpp; each finding a line "emu-check: KIND: ..."):
//   race        unordered accesses to a byte under CUDA's rules (same thread; same warp across
//               __syncwarp/__syncthreads; other warps across __syncthreads; other blocks never;
//               cp.async destinations written from issue to wait)   tests/cuda/emu_catalogue.cu:
//               counter, first_phase, across_blocks, async_double_buffer, wmma_no_syncwarp, and the
//               flash attention mutants of dev/emu/flash_mutants.pl
//   uninit      reads of never-written device or shared memory (static __shared__ poisoned per
//               block)                                               static_accumulator, fmaxf_hides_nan
//   bounds      accesses outside a buffer's exact bytes (padding included)   before_start, in_padding
//   misaligned  an n-byte access not n-aligned, uint4 copies included  misaligned_uint4, misaligned_float
//   mask        (always, fatal) a lane calling a warp function with a mask that leaves it out
//   stream      an operation (kernel, copy, memset, cuBLAS, NCCL) touching a byte of device or pinned
//               memory that an operation on another stream touched, one of them writing, with no event
//               wait or host synchronisation ordering the two; the host touching a pinned buffer a
//               copy not yet synchronised writes (or reads, for a host write) ("emu-check:
//               stream-race:"; dev/emu/streams.h)     copy_no_event, pinned_no_sync, pinned_reuse,
//               comm_no_wait, and the trainers' mutants of dev/emu/stream_mutants.pl
// Every operation, event and collective still completes before its call returns: the stream check
// follows the order the program gives, the values never depend on it.
// What it cannot check: speed, bank conflicts, occupancy, the exact bits of a GPU (no fused
// multiply-add contraction, other summation orders in cuBLAS and NCCL), fences and atomics, and
// masks of partial-warp operations (only full warps are supported). docs/gpu.md has the table.
#pragma once
#include <cmath>    // expf, sqrtf, fmaxf, ... as device code uses them; INFINITY
#include <cstddef>  // size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <tuple>
#include <type_traits>
#include <utility>

// ---- the device language ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)  // a register budget for the GPU's compiler: nothing to emulate
// Blocks run one at a time, so a function-local static is exactly one block's shared memory
// (cu2cpp.pl adds the call that lets NZ_EMU_CHECK poison it per block and check its accesses).
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
namespace nz_emu {
// A 16-byte vector load or store, for NZ_EMU_CHECK (check.cpp): the compiler splits a uint4 copy into
// 4-byte moves, so its alignment is checked here; also recorded as one access for the other checks.
void vector_access(const void* p, size_t bytes, bool write);
}  // namespace nz_emu
// The 16-byte vector type of a 16-byte load or store (alignas: a GPU's uint4 is 16-byte aligned, and
// a GPU faults on a uint4 access at an address that is not). Copies tell the checks where they read
// and write (always inlined, so the code address they record is the kernel's).
struct alignas(16) uint4 {
  unsigned x, y, z, w;
  uint4() = default;
  constexpr uint4(unsigned x_, unsigned y_, unsigned z_, unsigned w_) : x(x_), y(y_), z(z_), w(w_) {}
  __attribute__((always_inline)) uint4(const uint4& o) : x(o.x), y(o.y), z(o.z), w(o.w) {
    nz_emu::vector_access(&o, 16, false);
  }
  __attribute__((always_inline)) uint4& operator=(const uint4& o) {
    nz_emu::vector_access(&o, 16, false);
    nz_emu::vector_access(this, 16, true);
    x = o.x, y = o.y, z = o.z, w = o.w;
    return *this;
  }
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4(x, y, z, w); }

// ---- runtime types ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorNotReady = 600,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
// The one function attribute used: a kernel's dynamic shared memory above the 48 KiB every kernel
// may have, up to the device's opt-in limit (227 KiB on sm_90; the emulator's device is one).
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDisableTiming = 0x2;

struct nz_emu_stream;
struct nz_emu_event;
typedef nz_emu_stream* cudaStream_t;
typedef nz_emu_event* cudaEvent_t;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor;
  int multiProcessorCount;
  size_t sharedMemPerBlock;
  int maxThreadsPerBlock;
  int warpSize;
};

// ---- runtime functions (dev/emu/emu.cpp) ----
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
// A few more calls a small program makes (each completes at its call, as every operation here does;
// the stream check follows the order they give: dev/emu/streams.h)
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaPeekAtLastError();
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);  // done (work runs when queued), unless NZ_EMU_NCCL_STUCK
cudaError_t cudaEventCreate(cudaEvent_t* event);  // a timing event
// The host's clock between the two records (work runs when queued, so a record is the moment the
// stream reaches it); cudaErrorInvalidResourceHandle for an event made with cudaEventDisableTiming,
// cudaErrorNotReady for one never recorded, as CUDA's.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// ---- the emulator itself ----
namespace nz_emu {

// cudaFuncSetAttribute's record: the largest dynamic shared memory a launch of func may ask for.
cudaError_t set_max_dynamic_shared(const void* func, int bytes);

// The running fiber's threadIdx; the block's blockIdx; the launch's blockDim and gridDim.
const dim3& thread_idx();
extern dim3 block_idx, block_dim, grid_dim;

void syncthreads();
void syncwarp(unsigned mask = 0xffffffffu);
// One lane's part of a warp exchange: publish `mine` (bytes <= 8), wait for every lane of the
// warp, then copy lane src_lane's value into `theirs`.
void warp_exchange(const void* mine, void* theirs, size_t bytes, unsigned mask, int src_lane);
int lane_id();
void* dynamic_shared();

// Device memory is accessible inside a DeviceAccess scope only (kernels, copies, collectives).
struct DeviceAccess {
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};
bool is_device_pointer(const void* p, size_t bytes);  // [p, p+bytes) inside one cudaMalloc
void fail(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

// NZ_EMU_CHECK (dev/emu/check.h): a static __shared__ array reached by a thread (cu2cpp.pl)
namespace check {
void static_shared(void* p, size_t bytes, const char* name, const char* file, int line);
}

// Runs body() once per thread of every block; records cudaErrorInvalidConfiguration instead when
// a GPU would refuse the launch.
void run_grid(const char* name, const void* func, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              void (*body)(void*), void* ctx);

template <class Kernel>
struct Launch {
  Kernel kernel;
  const char* name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  template <class... Args>
  void operator()(Args&&... args) const {
    // Arguments are copied, as a real launch copies them into the kernel's parameter space.
    auto call = [k = kernel, tup = std::make_tuple(std::forward<Args>(args)...)]() {
      std::apply([&](auto&... a) { k(a...); }, tup);
    };
    using Call = decltype(call);
    const void* func = nullptr;  // the kernel's identity, for its attributes (a function's address)
    if constexpr (std::is_pointer<Kernel>::value) func = reinterpret_cast<const void*>(kernel);
    run_grid(name, func, grid, block, smem, stream, [](void* c) { (*static_cast<Call*>(c))(); }, &call);
  }
};
template <class Kernel>
Launch<Kernel> launch(Kernel kernel, const char* name, dim3 grid, dim3 block, size_t smem = 0,
                      cudaStream_t stream = nullptr) {
  return Launch<Kernel>{kernel, name, grid, block, smem, stream};
}

// A shuffle: lane src's v (src outside [first, first + width): the caller's own v, as on a GPU).
template <class T>
T shuffle(unsigned mask, T v, int src, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a value > 8 bytes");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail("shuffle with width %d: a GPU requires a power of two from 1 to 32", width);
  const int first = lane_id() / width * width;
  T out;
  warp_exchange(&v, &out, sizeof(T), mask, src >= first && src < first + width ? src : lane_id());
  return out;
}
template <class T>
T shfl_xor(unsigned mask, T v, int lane_mask, int width = 32) {
  return shuffle(mask, v, lane_id() ^ lane_mask, width);
}
// __ballot_sync: bit i set when lane i's predicate is true (every lane of the warp takes part).
unsigned ballot(unsigned mask, bool predicate);
unsigned active_mask();  // the lanes of the warp that have not exited
// Atomics: one fiber runs at a time, so a plain read-modify-write is atomic here. The access is
// not recorded for the race check (atomics of many threads to one word are no race), but it is
// checked for bounds and never-written memory, and marks the word written (check.cpp).
void atomic_access(void* p, size_t bytes);

}  // namespace nz_emu

template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return nz_emu::set_max_dynamic_shared(reinterpret_cast<const void*>(func), value);
}

#define threadIdx (::nz_emu::thread_idx())
#define blockIdx (::nz_emu::block_idx)
#define blockDim (::nz_emu::block_dim)
#define gridDim (::nz_emu::grid_dim)
#define __syncthreads() ::nz_emu::syncthreads()
#define __syncwarp(...) ::nz_emu::syncwarp(__VA_ARGS__)

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return nz_emu::shfl_xor(mask, v, lane_mask, width);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return nz_emu::shuffle(mask, v, nz_emu::lane_id() / width * width + src_lane % width, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return nz_emu::shuffle(mask, v, nz_emu::lane_id() - int(delta), width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return nz_emu::shuffle(mask, v, nz_emu::lane_id() + int(delta), width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) { return nz_emu::ballot(mask, predicate != 0); }
inline int __any_sync(unsigned mask, int predicate) { return nz_emu::ballot(mask, predicate != 0) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return nz_emu::ballot(mask, predicate != 0) == mask; }
inline unsigned __activemask() { return nz_emu::active_mask(); }

// The single rounded operations nvcc never fuses into an FMA (__fadd_rn, __fmul_rn, ...). The
// kernels are compiled with -ffp-contract=fast here as nvcc fuses by default (dev/emu.mk), so each is
// a call GCC does not inline: nothing can fuse across it either.
__attribute__((noinline)) inline float __fadd_rn(float a, float b) { return a + b; }
__attribute__((noinline)) inline float __fsub_rn(float a, float b) { return a - b; }
__attribute__((noinline)) inline float __fmul_rn(float a, float b) { return a * b; }
__attribute__((noinline)) inline float __fdiv_rn(float a, float b) { return a / b; }
__attribute__((noinline)) inline float __fsqrt_rn(float a) { return std::sqrt(a); }

// atomicAdd, atomicSub, atomicMax, atomicMin, atomicExch, atomicCAS on int, unsigned, unsigned long long,
// float and double (Max, Min: integers), each returning the old value.
template <class T>
__attribute__((no_sanitize_thread)) inline T nz_atomic_update(T* p, T v, int op) {
  nz_emu::atomic_access(p, sizeof(T));
  const T old = *p;
  *p = op == 0 ? T(old + v) : op == 1 ? T(old - v) : op == 2 ? (v > old ? v : old) : op == 3 ? (v < old ? v : old) : v;
  return old;
}
template <class T>
inline T atomicAdd(T* p, T v) { return nz_atomic_update(p, v, 0); }
template <class T>
inline T atomicSub(T* p, T v) { return nz_atomic_update(p, v, 1); }
template <class T>
inline T atomicMax(T* p, T v) { return nz_atomic_update(p, v, 2); }
template <class T>
inline T atomicMin(T* p, T v) { return nz_atomic_update(p, v, 3); }
template <class T>
inline T atomicExch(T* p, T v) { return nz_atomic_update(p, v, 4); }
template <class T>
__attribute__((no_sanitize_thread)) inline T atomicCAS(T* p, T compare, T v) {
  nz_emu::atomic_access(p, sizeof(T));
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
