// device.cpp — CPU/CUDA selection and raw memory. Without CUDA compiled in, the cuda_rt hooks are
// stubs that report "no GPU".
#include "runtime/device.h"

#include <sys/mman.h>  // mmap (NZ_GUARD_BUFFERS)
#include <unistd.h>    // sysconf

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>  // kept device blocks (pool_take), guarded mappings
#include <string>

#include "runtime/check.h"

namespace nz {

static Device g_device = Device::CPU;
static void (*g_before_host_wait)() = nullptr;  // set_before_host_wait

void set_before_host_wait(void (*wait)()) { g_before_host_wait = wait; }
static void before_host_wait() {
  if (g_before_host_wait) g_before_host_wait();
}

const char* location_name(Location l) {
  switch (l) {
    case Location::Device: return "device";
    case Location::Host: return "host";
    case Location::Disk: return "disk";
  }
  return "?";
}

Device current_device() { return g_device; }

Device select_device(const char* choice, int local_rank, bool verbose) {
  std::string c = choice ? choice : "auto";
  int gpus = cuda_rt::compiled() ? cuda_rt::device_count() : 0;
  if (c == "cpu") {
    g_device = Device::CPU;
  } else if (c == "cuda") {
    if (!cuda_rt::compiled())
      user_error("--device cuda: this build has no CUDA backend (nvcc was not on PATH when it was "
                 "built); rebuild with nvcc available, or use --device cpu");
    if (gpus == 0)
      user_error("--device cuda: no CUDA GPU is visible (no device or no driver); use --device cpu "
                 "or --device auto");
    g_device = Device::CUDA;
  } else {  // auto
    g_device = gpus > 0 ? Device::CUDA : Device::CPU;
    if (gpus == 0 && verbose)
      printf("device: no CUDA GPU visible%s, running on the CPU backend\n",
             cuda_rt::compiled() ? "" : " (CUDA backend not compiled in)");
  }
  if (g_device == Device::CUDA) cuda_rt::set_device(local_rank % gpus);
  return g_device;
}

// NZ_GUARD_BUFFERS=1 (the exercise grader sets it; CPU backend): every allocation is a mapping of
// its own that ends flush against inaccessible memory as large as itself. An access past its end
// then faults where it happens, and a pointer up to its size past the end still belongs to it, so
// the ledger's checks name the buffer (a bf16 slice found with float arithmetic lands there).
static bool guard_buffers() {
  static const bool on = [] {
    const char* v = getenv("NZ_GUARD_BUFFERS");
    return v && *v && strcmp(v, "0") != 0;
  }();
  return on;
}
struct GuardedMapping {
  void* base;
  size_t length;
};
static std::map<void*, GuardedMapping>& guarded() {
  static std::map<void*, GuardedMapping> m;
  return m;
}
static size_t page_rounded(size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return std::max(page, (bytes + page - 1) / page * page);
}

size_t guard_after(size_t bytes) {
  return g_device == Device::CUDA || !guard_buffers() ? 0 : page_rounded((bytes + 63) / 64 * 64);
}

// Memory at Location::Device lives on the GPU when the run uses CUDA, else in host memory (the
// ledger still counts it as device memory). Host memory is pinned on CUDA so copies are fast.
void* raw_alloc(size_t bytes, Location loc) {
  NZ_CHECK(loc != Location::Disk, "raw_alloc: disk storage is files, not memory");
  if (g_device == Device::CUDA) {
    return loc == Location::Device ? cuda_rt::malloc_device(bytes) : cuda_rt::malloc_pinned(bytes);
  }
  if (guard_buffers()) {
    const size_t used = std::max<size_t>(64, (bytes + 63) / 64 * 64), body = page_rounded(used);
    const size_t length = body + guard_after(bytes);
    void* base = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED || mprotect(base, body, PROT_READ | PROT_WRITE) != 0)
      fatal(__FILE__, __LINE__, "out of host memory allocating %zu bytes (NZ_GUARD_BUFFERS)", bytes);
    void* p = static_cast<char*>(base) + body - used;  // its end is the guard's start
    guarded()[p] = GuardedMapping{base, length};
    return p;
  }
  void* p = nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;
  if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0 || p == nullptr)
    fatal(__FILE__, __LINE__, "out of host memory allocating %zu bytes", bytes);
  return p;
}

void raw_free(void* p, Location loc) {
  if (g_device == Device::CUDA) {
    if (loc == Location::Device) cuda_rt::free_device(p);
    else cuda_rt::free_pinned(p);
    return;
  }
  if (guard_buffers()) {
    auto it = guarded().find(p);
    if (it != guarded().end()) {
      munmap(it->second.base, it->second.length);
      guarded().erase(it);
      return;
    }
  }
  free(p);
}

// Kept device blocks by size (device.h). Never returned to CUDA: they live as long as the process.
static std::multimap<size_t, void*>& kept_blocks() {
  static std::multimap<size_t, void*> kept;
  return kept;
}

void* pool_take(size_t bytes, Location loc) {
  if (loc != Location::Device || bytes == 0) return raw_alloc(bytes, loc);
  auto it = kept_blocks().find(bytes);
  if (it == kept_blocks().end()) return raw_alloc(bytes, loc);
  void* p = it->second;
  kept_blocks().erase(it);
  return p;
}

void pool_give(void* p, size_t bytes, Location loc) {
  if (loc != Location::Device || bytes == 0) return raw_free(p, loc);
  kept_blocks().emplace(bytes, p);
}

void fill_zero(void* p, size_t bytes, Location loc) {
  if (g_device == Device::CUDA && loc == Location::Device) cuda_rt::memset_zero(p, bytes);
  else memset(p, 0, bytes);
}

void copy_bytes(void* dst, Location dst_loc, const void* src, Location src_loc, size_t bytes) {
  if (bytes == 0) return;
  bool on_gpu = g_device == Device::CUDA && (dst_loc == Location::Device || src_loc == Location::Device);
  if (on_gpu && dst_loc == Location::Host) before_host_wait();  // a failed peer: a named error, not a hang
  if (on_gpu) cuda_rt::memcpy_any(dst, src, bytes);
  else memcpy(dst, src, bytes);
}

void device_sync() {
  if (g_device == Device::CUDA) before_host_wait();
  if (g_device == Device::CUDA) cuda_rt::synchronize();
}

void raw_copy_async(void* dst, Location dst_loc, const void* src, Location src_loc, size_t bytes) {
  if (bytes == 0) return;
  bool on_gpu = g_device == Device::CUDA && (dst_loc == Location::Device || src_loc == Location::Device);
  if (on_gpu) cuda_rt::memcpy_async(dst, src, bytes);
  else memcpy(dst, src, bytes);
}

void copy_to_device_queued(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (g_device == Device::CUDA) cuda_rt::memcpy_queued(dst, src, bytes);
  else memcpy(dst, src, bytes);
}

void copy_wait() {
  if (g_device == Device::CUDA) before_host_wait();
  if (g_device == Device::CUDA) cuda_rt::copy_stream_sync();
}

#ifndef NZ_HAVE_CUDA
// ---- stubs: this build has no CUDA backend ----
namespace cuda_rt {
[[noreturn]] static void no_cuda() { fatal(__FILE__, __LINE__, "CUDA backend not compiled in"); }
bool compiled() { return false; }
int device_count() { return 0; }
void set_device(int) { no_cuda(); }
void* malloc_device(size_t) { no_cuda(); }
void free_device(void*) { no_cuda(); }
void* malloc_pinned(size_t) { no_cuda(); }
void free_pinned(void*) { no_cuda(); }
void memset_zero(void*, size_t) { no_cuda(); }
void memcpy_any(void*, const void*, size_t) { no_cuda(); }
void memcpy_async(void*, const void*, size_t) { no_cuda(); }
void copy_stream_sync() { no_cuda(); }
void memcpy_queued(void*, const void*, size_t) { no_cuda(); }
void synchronize() { no_cuda(); }
void mem_get_info(size_t*, size_t*) { no_cuda(); }
void start_libraries() { no_cuda(); }
void timer_record(int) { no_cuda(); }
double timer_elapsed_ms(int, int) { no_cuda(); }
const char* device_name() { return "none"; }
}  // namespace cuda_rt
#endif

}  // namespace nz
