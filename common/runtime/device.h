// device.h — where compute runs (CPU or CUDA) and the few raw memory operations the rest needs.
// Allocation of model state does NOT happen here directly: it goes through the ledger (ledger.h),
// which calls raw_alloc/raw_free and records every byte.
#pragma once
#include <cstddef>

namespace nz {

enum class Device { CPU, CUDA };

// Where bytes live, for the ledger. On the CPU backend "device" memory is ordinary host memory
// that is accounted as device memory, so a CPU run's ledger is identical to a GPU run's.
enum class Location { Device, Host, Disk };
const char* location_name(Location l);

// Set once at start-up by select_device(); read everywhere.
Device current_device();
// "auto" picks CUDA when a GPU is visible, else the CPU. Prints one line when it falls back.
// Returns the device chosen. local_rank picks the GPU (local_rank % visible GPUs).
Device select_device(const char* choice, int local_rank, bool verbose);

// Raw memory on the current device (CPU: 64-byte aligned host memory; CUDA: cudaMalloc).
void* raw_alloc(size_t bytes, Location loc);
void raw_free(void* p, Location loc);
// With NZ_GUARD_BUFFERS=1 (CPU backend; the exercise grader sets it) raw_alloc puts every block
// flush against this many bytes of inaccessible memory, which no other allocation can take: an
// access past the block's end faults, and the ledger names the block of a pointer there. 0 otherwise.
size_t guard_after(size_t bytes);
// Device blocks kept for reuse (stage3's gathered units: Buffer does this for Category::Gathered).
// On CUDA, cudaMalloc and cudaFree for every gather would cost a driver call each, and cudaFree
// synchronises the whole device, which would stall the very prefetch stage3 starts to overlap.
// pool_take returns a kept block of exactly `bytes` (units repeat the same sizes) or a fresh one;
// pool_give keeps it. Reuse needs no synchronisation of its own because every writer of a gathered
// unit is ordered after the kernels already queued on the compute stream: NCCL's all-gather waits
// for them on the GPU (comm_nccl.cu, after_compute), the MPI path copies in on the compute stream
// itself. The rule that makes this hold: give a block back only after its gather was waited for
// (stage3's release_unit follows gather_unit). Kept blocks show in cudaMemGetInfo, not in the
// ledger, which counts a block from take to give. The CPU keeps them too: a released unit's memory
// then goes to no other allocation, so a use after release is named (ledger.h, check_span) instead
// of reading whatever was put there next.
void* pool_take(size_t bytes, Location loc);
void pool_give(void* p, size_t bytes, Location loc);
void fill_zero(void* p, size_t bytes, Location loc);
// Copies between locations (device<->host); host<->host is memcpy.
void copy_bytes(void* dst, Location dst_loc, const void* src, Location src_loc, size_t bytes);
// Wait for all queued device work (no-op on the CPU).
void device_sync();
// Offload's host<->device copies: on CUDA queued on a copy stream of their own, after the device
// work already queued, and asynchronous for the host (Location::Host memory is pinned), so the CPU
// can work while they run; copy_wait() waits for all of them. On the CPU backend: memcpy, no wait.
// Unchecked: the trainers call copy_bytes_async (ledger.h), which checks both sides first.
void raw_copy_async(void* dst, Location dst_loc, const void* src, Location src_loc, size_t bytes);
void copy_wait();

// Runs before the host waits for the device (a copy to the host, device_sync, copy_wait). The NCCL
// path sets it (comm_backend.cpp: nccl::wait_joined), so a collective whose peer failed ends the run
// with a name instead of hanging the wait. Unset: nothing runs.
void set_before_host_wait(void (*wait)());

// A host->device copy queued on the compute stream, behind the kernels already queued there, that
// does not make the host wait (a copy from ordinary host memory waits for the whole queue first).
// src must be pinned (raw_alloc(.., Location::Host) on CUDA) and must not change until the copy
// has run: after the next device_sync or copy to the host. On the CPU backend: memcpy.
void copy_to_device_queued(void* dst, const void* src, size_t bytes);

// A few bytes outside the ledger, which counts model state and activations: raw_alloc when made,
// raw_free when destroyed (the model's loss total, its staging of token batches).
class RawBlock {
 public:
  RawBlock(size_t bytes, Location loc) : p_(raw_alloc(bytes, loc)), loc_(loc) {}
  ~RawBlock() { if (p_) raw_free(p_, loc_); }
  RawBlock(RawBlock&& o) noexcept : p_(o.p_), loc_(o.loc_) { o.p_ = nullptr; }
  RawBlock(const RawBlock&) = delete;
  RawBlock& operator=(const RawBlock&) = delete;
  RawBlock& operator=(RawBlock&&) = delete;
  void* data() const { return p_; }

 private:
  void* p_;
  Location loc_;
};

// ---- CUDA runtime hooks, implemented in common/kernels/cuda/runtime.cu when nvcc is available, and by
// stubs in device.cpp otherwise. Nothing outside device.cpp and common/kernels/cuda/ calls these. ----
namespace cuda_rt {
bool compiled();                 // true when the CUDA backend is compiled in
int device_count();              // 0 without a GPU or driver
void set_device(int ordinal);
void* malloc_device(size_t bytes);
void free_device(void* p);
void* malloc_pinned(size_t bytes);  // page-locked host memory (offload, MPI staging)
void free_pinned(void* p);
void memset_zero(void* p, size_t bytes);
void memcpy_any(void* dst, const void* src, size_t bytes);  // cudaMemcpyDefault
void memcpy_async(void* dst, const void* src, size_t bytes);  // on the copy stream (copy_bytes_async)
void copy_stream_sync();                                       // wait for the copy stream
void memcpy_queued(void* dst, const void* src, size_t bytes);  // on the compute stream (copy_to_device_queued)
void synchronize();
void mem_get_info(size_t* free_bytes, size_t* total_bytes);
// The CUDA context and cuBLAS (its handle and a workspace of its own, made now rather than by the
// first product) brought up, for the device-memory baseline taken right after (trainer.cpp).
void start_libraries();
// NZ_PROFILE (profile.h): timing event i, made on first use, recorded on the compute stream; and the
// milliseconds between two of them, read once the device has been synchronised.
void timer_record(int i);
double timer_elapsed_ms(int from, int to);
const char* device_name();
}  // namespace cuda_rt

}  // namespace nz
