// check.h — nz_emu's checks of what kernels do with memory (check.cpp), between the scheduler and
// device memory of emu.cpp and the compiler's hooks. Not part of the emulated CUDA API.
//
// NZ_EMU_CHECK picks the checks: "all", "none" (the default), or a comma list of race, uninit,
// bounds, misaligned, stream (the order of streams, events and the host: streams.h). `make emu-check` turns on all of them. A finding is one line on stderr,
// "emu-check: KIND: ...", and a program with findings exits with status 66 (at exit, so one run
// reports every distinct finding), after a line saying how many accesses were checked.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nz_emu {
namespace check {

enum : unsigned { kRace = 1, kUninit = 2, kBounds = 4, kMisaligned = 8, kStream = 16 };
extern unsigned g_kinds;  // the checks on (NZ_EMU_CHECK, read at start-up)
// The running CUDA thread (its linear index in the block) while a kernel runs and a check is on;
// -1 otherwise, which makes every hook return at once. Its fiber's stack, never checked.
extern int g_thread;
extern const char* g_stack_lo;
extern const char* g_stack_hi;

// The scheduler's events.
void launch_begin(const char* kernel, unsigned threads_per_block);
void block_begin(unsigned block_linear, unsigned char* dyn_shared, size_t dyn_size, unsigned char* dyn_buffer,
                 size_t dyn_buffer_size);
void barrier_released(int warp);  // a warp's __syncwarp; -1: the block's __syncthreads
void launch_end();

// Device memory: each cudaMalloc (the mapping's whole range, guard page included, and the buffer
// in it), and what host-side operations write (copies, memsets, cuBLAS, collectives).
void allocated(const void* user, size_t bytes, const void* map_lo, const void* map_hi);
void freed(const void* user);
void host_wrote(const void* p, size_t bytes);

// A static __shared__ variable reached by a thread (cu2cpp.pl adds the call after each one).
void static_shared(void* p, size_t bytes, const char* name, const char* file, int line);

// cp.async: the destination is being written from the issue until the wait that covers it.
void async_issued(void* dst, size_t bytes, const void* pc);
void async_landed(void* dst, const void* src, size_t bytes, size_t zfill, const void* pc);

// An atomic read-modify-write of n bytes (no race record: atomics do not race with each other).
void atomic(void* p, size_t n, const void* pc);

// A finding of another part of the checks (streams.cpp): printed as "emu-check: KIND: message"
// unless one with the same key was; counted either way.
void finding(const char* kind, const char* key, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// One load or store of n bytes by the running thread (aligned: the compiler assumed n-byte alignment).
void access(const void* p, size_t n, bool write, bool aligned, const void* pc);

}  // namespace check
}  // namespace nz_emu
