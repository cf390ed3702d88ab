// streams.h — nz_emu's stream-order check (NZ_EMU_CHECK=stream, part of "all"; streams.cpp).
// Not part of the emulated CUDA API: emu.cpp tells it what each runtime call does.
//
// Every operation still runs at its call (so values never change with the check), but the check
// keeps, for each stream and each host thread, a vector clock: which operations of every stream
// it is ordered after. An operation on a stream is ordered after the earlier operations of that
// stream, after everything its host thread had seen when it was queued, and after what the
// stream waited for (cudaStreamWaitEvent: what the event's stream had queued at its record); the
// host sees a stream's work at cudaStreamSynchronize, cudaEventSynchronize, a cudaEventQuery that
// answers done, cudaDeviceSynchronize, a synchronous cudaMemcpy (and cudaFree, which waits for
// the device). The legacy default stream and the streams made without cudaStreamNonBlocking wait
// for each other. Every byte of device and pinned memory remembers the last operation that wrote
// it and up to three that read it since; an access by an operation not ordered after a
// conflicting one is reported as "emu-check: stream-race: ...", naming both operations and
// their streams. The host's own accesses to pinned memory are seen through page protection:
// while an operation that writes a pinned page (or reads it) is not yet ordered before the host,
// the page is unreadable (or read-only), and the fault that a host access then takes is reported.
#pragma once
#include <cstddef>

#include "cuda_runtime.h"

namespace nz_emu {
namespace streams {

bool on();  // the stream check is on (NZ_EMU_CHECK)

// Streams and events
void stream_created(cudaStream_t s, unsigned flags);
void event_recorded(cudaEvent_t e, cudaStream_t s);
void event_destroyed(cudaEvent_t e);
void stream_waits_event(cudaStream_t s, cudaEvent_t e);
void host_waits_stream(cudaStream_t s);
void host_waits_event(cudaEvent_t e);
void host_waits_device();

// One operation queued on stream s by the calling host thread, from begin to end; what it reads
// and writes in between (device or pinned memory; other host memory is ignored).
void begin(cudaStream_t s, const char* what, const char* detail = nullptr);
void reads(const void* p, size_t bytes);
void writes(const void* p, size_t bytes);
void end();
// A kernel's own load or store (check.cpp's hooks, while a kernel launched by begin() runs)
void kernel_access(const void* p, size_t bytes, bool write);

// Memory
void device_allocated(const void* p, size_t bytes);
void device_freed(const void* p);
void* pinned_allocate(size_t bytes);  // page-aligned, whole pages of its own; nullptr when the check is off
bool pinned_free(void* p);            // false: not one of pinned_allocate's
bool pinned(const void* p);           // p lies in one of pinned_allocate's buffers
// The emulator's own copies into and out of pinned memory run between these (every protected
// pinned page opened, then the protections as the pending operations require).
void pinned_open();
void pinned_close();
// A fault at addr in a protected pinned page: reported and the page opened (true), or not ours.
bool host_fault(const void* addr);

unsigned long long operations();  // operations queued so far (for the closing line)

}  // namespace streams
}  // namespace nz_emu
