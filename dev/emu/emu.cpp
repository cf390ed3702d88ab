// emu.cpp — nz_emu, the CPU emulator of the CUDA subset nanoZeRO uses: the kernel scheduler
// (fibers and barriers), device memory with guard pages, the runtime API, cublasGemmEx and the
// NCCL collectives over MPI. What it checks and what it cannot: include/cuda_runtime.h.
#include <mpi.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <set>
#include <vector>

#include "check.h"  // NZ_EMU_CHECK: races, uninitialised reads, bounds, misalignment
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "kernels/dtype.h"  // nz::bf16, bf16_to_f32, f32_to_bf16 (round to nearest even)
#include "nccl.h"
#include "streams.h"  // NZ_EMU_CHECK=stream: the order of streams, events and the host

// ============================================================================================
// failures
namespace nz_emu {

namespace {
const char* g_kernel = nullptr;  // the kernel running now, for error messages
// The kind of check a fatal error belongs to (bounds, barrier, misaligned), set just before fail():
// with NZ_EMU_CHECK on, the error is also printed as a finding line, "emu-check: KIND: ...".
const char* g_fail_kind = nullptr;
}

void fail(const char* fmt, ...) {
  if (g_fail_kind && check::g_kinds) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "emu-check: %s: %s%s%s\n", g_fail_kind, msg, g_kernel ? " in kernel " : "",
            g_kernel ? g_kernel : "");
  }
  fprintf(stderr, "nz_emu: ");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (g_kernel)
    fprintf(stderr, " [in kernel %s, block (%u,%u,%u), thread (%u,%u,%u)]", g_kernel, block_idx.x,
            block_idx.y, block_idx.z, thread_idx().x, thread_idx().y, thread_idx().z);
  fputc('\n', stderr);
  fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
  abort();
}

// ============================================================================================
// device memory: one mapping per cudaMalloc, the buffer placed so that it ends right before an
// inaccessible guard page, and the whole buffer inaccessible outside DeviceAccess scopes.
namespace {

constexpr size_t kDeviceAlign = 16;  // (a GPU gives 256; 16 lets the guard page sit closer)

struct Mapping {
  char* base;         // start of the mapping
  size_t data_bytes;  // accessible part (whole pages); the guard page follows
  size_t bytes;       // what was asked for; the buffer is [user, user + bytes)
  // Sealed: inaccessible to host code and kernels alike, always. cuBLAS's workspace
  // (cublasSetWorkspace), which on a GPU only the library touches and the emulated cuBLAS never
  // does: toggling its 32 MiB at every launch would cost more than the runs themselves.
  bool sealed = false;
};
std::map<const char*, Mapping> g_device;  // keyed by the pointer cudaMalloc returned
std::set<void*> g_pinned;
size_t g_device_used = 0;
int g_access_depth = 0;
cudaError_t g_last_error = cudaSuccess;
int g_current_device = 0;

size_t page_size() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

bool protect_enabled() {
  static const bool enabled = [] {
    const char* e = getenv("NZ_EMU_PROTECT");
    return !(e && e[0] == '0');
  }();
  return enabled;
}

void set_access(const Mapping& m, bool accessible) {
  if (m.sealed) return;
  if (protect_enabled() && mprotect(m.base, m.data_bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    fail("mprotect failed");
}

size_t total_device_bytes() {
  static const size_t total = [] {
    const char* e = getenv("NZ_EMU_MEM_MB");
    size_t mb = e ? strtoull(e, nullptr, 10) : 16384;
    return (mb ? mb : 16384) << 20;
  }();
  return total;
}

// The mapping (if any) whose pages (guard page included) contain p. A buffer starts some way
// into its mapping, so p may belong to the buffer before it or to the one after it.
const std::pair<const char* const, Mapping>* mapping_of(const void* p) {
  const char* c = static_cast<const char*>(p);
  auto contains = [&](const std::pair<const char* const, Mapping>& kv) {
    return c >= kv.second.base && c < kv.second.base + kv.second.data_bytes + page_size();
  };
  auto next = g_device.upper_bound(c);
  if (next != g_device.end() && contains(*next)) return &*next;
  if (next != g_device.begin() && contains(*std::prev(next))) return &*std::prev(next);
  return nullptr;
}

int device_count() {
  static const int n = [] {
    const char* e = getenv("NZ_EMU_GPUS");
    return e ? atoi(e) : 1;
  }();
  return n;
}

cudaError_t record(cudaError_t err) {
  if (err != cudaSuccess) g_last_error = err;
  return err;
}

}  // namespace

DeviceAccess::DeviceAccess() {
  if (g_access_depth++ == 0)
    for (auto& kv : g_device) set_access(kv.second, true);
}

DeviceAccess::~DeviceAccess() {
  if (--g_access_depth == 0)
    for (auto& kv : g_device) set_access(kv.second, false);
}

bool is_device_pointer(const void* p, size_t bytes) {
  auto it = g_device.upper_bound(static_cast<const char*>(p));
  if (it == g_device.begin()) return false;
  --it;
  const char* user = it->first;
  const char* c = static_cast<const char*>(p);
  return c >= user && c + bytes <= user + it->second.bytes;
}

// ============================================================================================
// segmentation faults: say which rule was broken
namespace {

struct Fiber;
Fiber* g_cur = nullptr;

void on_segv(int sig, siginfo_t* info, void*) {
  const char* addr = static_cast<const char*>(info->si_addr);
  if (streams::host_fault(addr)) return;  // a pinned page protected by the stream check: reported, opened
  const auto* hit = mapping_of(addr);
  if (hit) {
    const char* user = hit->first;
    const Mapping& m = hit->second;
    char what[320];
    if (addr >= m.base + m.data_bytes)
      snprintf(what, sizeof(what), "%zu bytes past the end of a %zu-byte device buffer",
               size_t(addr - (user + m.bytes)), m.bytes);
    else if (addr < user)
      snprintf(what, sizeof(what), "%zu bytes before the start of a %zu-byte device buffer",
               size_t(user - addr), m.bytes);
    else
      snprintf(what, sizeof(what),
               "byte %zu of a %zu-byte device buffer from host code (a device pointer used on the "
               "host; device memory is only reachable from kernels, cudaMemcpy and collectives)",
               size_t(addr - user), m.bytes);
    g_fail_kind = "bounds";
    fail("invalid access at %p: %s", static_cast<const void*>(addr), what);
  }
  if (g_kernel) fail("invalid access at %p (not device memory; a fiber's stack overflowed?)", static_cast<const void*>(addr));
  signal(sig, SIG_DFL);
  raise(sig);
}

struct SegvHandler {
  SegvHandler() {
    static char alt_stack[1 << 16];
    stack_t ss = {};
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof(alt_stack);
    sigaltstack(&ss, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
  }
};
void install_segv_handler() { static SegvHandler once; }

}  // namespace

// ============================================================================================
// the kernel scheduler
//
// Each CUDA thread of a block is a fiber with its own stack. A fiber is started once with
// makecontext; after that every switch is a jump (jump_to below; no system call). The scheduler runs
// every ready fiber until it blocks at a barrier or finishes, then releases whichever barrier is
// complete: a warp's (shuffle, __syncwarp, a WMMA *_sync call of mma.h) when all 32 lanes are there
// at the same operation, the block's (__syncthreads) when every thread is there. If neither is
// complete the kernel would hang or misbehave on a GPU: that is an error here.
dim3 block_idx, block_dim, grid_dim;

namespace {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;

enum class State { Ready, AtSyncthreads, AtWarp, Done };
enum class WarpOp { Syncwarp, Shuffle, Wmma };

// Switching between fibers: GCC's and Clang's __builtin_setjmp/__builtin_longjmp save and restore
// only the frame, stack pointer and resume address (the function calling __builtin_setjmp saves
// every callee-saved register itself), which makes a switch a few nanoseconds; glibc's _longjmp
// costs ~10x more. The jump lives in a function of its own, as the builtins require.
typedef void* JumpBuf[5];
// Every function that calls __builtin_setjmp is noipa: its callers must assume that it clobbers
// every caller-saved register (another fiber ran in between), which GCC's interprocedural
// register allocation would otherwise not.
[[gnu::noipa]] void jump_to(JumpBuf& buf) { __builtin_longjmp(buf, 1); }

struct Fiber {
  JumpBuf ctx;
  char* stack;
  dim3 tid;
  int lane, warp;
  State state;
  WarpOp op;
  unsigned warp_ops;  // warp operations this thread has reached so far
  // __pipeline_memcpy_async's copies not yet performed (cuda_pipeline.h), in issue order, each with
  // its group: the number of __pipeline_commit calls before it
  struct AsyncCopy {
    void* dst;
    const void* src;
    size_t bytes, zfill;
    unsigned group;
    const void* pc;  // where it was issued (NZ_EMU_CHECK's findings)
  };
  std::vector<AsyncCopy> async_copies;
  unsigned groups_committed;
};

struct WarpSlots {
  uint64_t value[2][kWarp];  // double-buffered by operation parity: one barrier per shuffle
};

std::vector<Fiber*> g_fibers;
std::vector<WarpSlots> g_warps;
// The launch's dynamic shared memory, its start aligned to 128 bytes (g_dynamic_shared_bytes
// allocated with room to spare) as a GPU's shared window is, so that WMMA's 256-bit alignment rule
// can be checked against offsets into it.
constexpr size_t kSharedAlign = 128;
std::vector<unsigned char> g_dynamic_shared_bytes;
unsigned char* g_dynamic_shared = nullptr;
size_t g_dynamic_shared_size = 0;
JumpBuf g_scheduler;
Fiber* g_starting = nullptr;
void (*g_body)(void*) = nullptr;
void* g_body_ctx = nullptr;
int g_block_threads = 0;
const dim3 g_no_thread(0, 0, 0);

[[gnu::noipa]] void yield_to_scheduler() {
  Fiber* f = g_cur;
  if (__builtin_setjmp(f->ctx) == 0) jump_to(g_scheduler);
}

[[gnu::noipa]] void fiber_main() {
  Fiber* f = g_starting;
  for (;;) {
    if (__builtin_setjmp(f->ctx) == 0) jump_to(g_scheduler);  // parked until given a thread to run
    g_body(g_body_ctx);
    f->state = State::Done;
  }
}

[[gnu::noipa]] Fiber* new_fiber() {
  Fiber* f = new Fiber();
  const size_t page = page_size();
  void* mem = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) fail("cannot map a fiber stack");
  f->stack = static_cast<char*>(mem);
  mprotect(f->stack, page, PROT_NONE);  // stacks grow down: overflow hits this page
  // Stack tops are staggered: 4 KiB-aligned tops would all fall in the same L1 cache sets.
  static unsigned count = 0;
  const size_t stagger = (count++ * 320) % 4096;
  ucontext_t start, here;
  getcontext(&start);
  start.uc_stack.ss_sp = f->stack + page;
  start.uc_stack.ss_size = kStackBytes - stagger;
  start.uc_link = nullptr;
  makecontext(&start, fiber_main, 0);
  g_starting = f;
  if (__builtin_setjmp(g_scheduler) == 0) swapcontext(&here, &start);  // runs until fiber_main parks
  return f;
}

[[gnu::noipa]] void resume(Fiber* f) {
  g_cur = f;
  if (__builtin_setjmp(g_scheduler) == 0) jump_to(f->ctx);
  g_cur = nullptr;
}

const char* state_name(State s) {
  switch (s) {
    case State::Ready: return "running";
    case State::AtSyncthreads: return "at __syncthreads";
    case State::AtWarp: return "at a warp operation";
    case State::Done: return "exited";
  }
  return "?";
}

[[noreturn]] void stuck(const char* why, int warp) {
  const int first = warp * kWarp, end = std::min(g_block_threads, first + kWarp);
  char lanes[512] = "";
  size_t len = 0;
  for (int i = first; i < end && len < sizeof(lanes) - 64; i++) {
    const Fiber* f = g_fibers[i];
    if (i > first && f->state == g_fibers[i - 1]->state &&
        (f->state != State::AtWarp || f->warp_ops == g_fibers[i - 1]->warp_ops))
      continue;
    len += snprintf(lanes + len, sizeof(lanes) - len, "%slane %d %s", i > first ? ", " : "", i - first,
                    state_name(f->state));
    if (f->state == State::AtWarp)
      len += snprintf(lanes + len, sizeof(lanes) - len, " #%u (%s)", f->warp_ops,
                      f->op == WarpOp::Shuffle ? "shuffle" : f->op == WarpOp::Wmma ? "wmma" : "__syncwarp");
  }
  g_cur = g_fibers[first];
  g_fail_kind = "barrier";
  fail("%s; warp %d: %s", why, warp, lanes);
}

// The ready queue of one block: fiber indices in the order they will run. A warp whose 32 lanes
// have all arrived is queued again at once; the block's __syncthreads when nothing else can run.
// Released lanes are queued forwards and backwards in turn, so no lane always runs first.
// NZ_EMU_SEED=N (schedule fuzzing): every release, the first included, queues its threads in a
// random order drawn from N, and the blocks of a launch run in a random order too.
std::vector<int> g_ready;
std::vector<int> g_warp_arrived;  // lanes of each warp waiting at a warp operation

struct Fuzz {
  bool on = false;
  uint64_t state = 0;
  Fuzz() {
    const char* e = getenv("NZ_EMU_SEED");
    if (e && *e) on = true, state = strtoull(e, nullptr, 10) * 0x9E3779B97F4A7C15ull + 1;
  }
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  template <class It>
  void shuffle(It first, It last) {  // Fisher-Yates
    for (auto n = last - first; n > 1; n--) std::swap(first[n - 1], first[long(next() % uint64_t(n))]);
  }
};
Fuzz& fuzz() {
  static Fuzz f;
  return f;
}

void queue_range(int first, int end, bool backwards) {
  const size_t start = g_ready.size();
  for (int j = first; j < end; j++) g_ready.push_back(backwards ? end - 1 - (j - first) : j);
  if (fuzz().on) fuzz().shuffle(g_ready.begin() + long(start), g_ready.end());
}

void run_block() {
  const int n = g_block_threads, warps = (n + kWarp - 1) / kWarp;
  for (int i = 0; i < n; i++) {
    Fiber* f = g_fibers[i];
    f->tid = dim3(i % block_dim.x, i / block_dim.x % block_dim.y, i / (block_dim.x * block_dim.y));
    f->lane = i % kWarp;
    f->warp = i / kWarp;
    f->state = State::Ready;
    f->warp_ops = 0;
    f->async_copies.clear();  // copies a thread of the previous block never waited for
    f->groups_committed = 0;
  }
  g_ready.clear();
  queue_range(0, n, false);
  g_warp_arrived.assign(warps, 0);
  size_t head = 0;
  int done = 0;
  bool backwards = true;
  while (done < n) {
    if (head == g_ready.size()) {  // nothing can run: only the block barrier can be released
      for (int w = 0; w < warps; w++)
        if (g_warp_arrived[w] > 0) stuck("a warp operation that not every lane reaches", w);
      if (done > 0) {
        for (int i = 0; i < n; i++)
          if (g_fibers[i]->state == State::Done) stuck("__syncthreads after some threads of the block exited", i / kWarp);
      }
      for (int i = 0; i < n; i++) g_fibers[i]->state = State::Ready;
      if (check::g_kinds) check::barrier_released(-1);
      g_ready.clear();
      head = 0;
      queue_range(0, n, backwards);
      backwards = !backwards;
    }
    Fiber* f = g_fibers[g_ready[head++]];
    if (check::g_kinds) {  // the hooks check this thread's accesses, outside its own stack
      check::g_thread = g_ready[head - 1];
      check::g_stack_lo = f->stack;
      check::g_stack_hi = f->stack + kStackBytes + page_size();
    }
    resume(f);
    // Copies the thread never waited for land some time after it exits on a GPU: for the race
    // check, a write when it exits (here they are dropped, so nothing reads them by accident)
    if (check::g_kinds && f->state == State::Done)
      for (const Fiber::AsyncCopy& c : f->async_copies) check::async_landed(c.dst, nullptr, c.bytes, c.bytes, c.pc);
    check::g_thread = -1;
    if (f->state == State::Done) {
      done++;
    } else if (f->state == State::AtWarp) {
      const int w = f->warp, first = w * kWarp, end = std::min(n, first + kWarp);
      if (end - first < kWarp) stuck("a full-warp operation in a warp of fewer than 32 threads", w);
      if (++g_warp_arrived[w] == kWarp) {
        for (int i = first; i < end; i++)
          if (g_fibers[i]->warp_ops != f->warp_ops || g_fibers[i]->op != f->op)
            stuck("the lanes of a warp are at different warp operations", w);
        g_warp_arrived[w] = 0;
        if (check::g_kinds && f->op == WarpOp::Syncwarp) check::barrier_released(w);  // shuffles, WMMA: no order
        for (int i = first; i < end; i++) g_fibers[i]->state = State::Ready;
        queue_range(first, end, backwards);
        backwards = !backwards;
      }
    }
    if (head > 4096 && head * 2 > g_ready.size()) {  // drop what has run
      g_ready.erase(g_ready.begin(), g_ready.begin() + long(head));
      head = 0;
    }
  }
}

}  // namespace

const dim3& thread_idx() { return g_cur ? g_cur->tid : g_no_thread; }
int lane_id() { return g_cur->lane; }
void* dynamic_shared() { return g_dynamic_shared; }

void syncthreads() {
  g_cur->state = State::AtSyncthreads;
  yield_to_scheduler();
}

// The mask of a warp operation: every lane that calls it must be in it (on a GPU, undefined
// otherwise: an "emu-check: mask" finding here, fatal), and the emulator supports whole warps only.
void check_mask(const char* what, unsigned mask) {
  if (!(mask >> g_cur->lane & 1)) {
    g_fail_kind = "mask";
    fail("%s by lane %d with mask %#x, which leaves the lane out (undefined on a GPU)", what, g_cur->lane, mask);
  }
  if (mask != 0xffffffffu) fail("%s with mask %#x: the emulator supports whole-warp operations only", what, mask);
}

void syncwarp(unsigned mask) {
  check_mask("__syncwarp", mask);
  g_cur->state = State::AtWarp;
  g_cur->op = WarpOp::Syncwarp;
  g_cur->warp_ops++;
  yield_to_scheduler();
}

void wmma_barrier() {
  g_cur->state = State::AtWarp;
  g_cur->op = WarpOp::Wmma;
  g_cur->warp_ops++;
  yield_to_scheduler();
}

void wmma_check(const char* what, const void* p, unsigned ldm, size_t elem_bytes) {
  g_fail_kind = "misaligned";
  if (ldm * elem_bytes % 16 != 0)
    fail("wmma::%s with ldm %u: a GPU requires a multiple of 16 bytes (%zu elements)", what, ldm, 16 / elem_bytes);
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c >= g_dynamic_shared && c < g_dynamic_shared + g_dynamic_shared_size && (c - g_dynamic_shared) % 32 != 0)
    fail("wmma::%s at byte %zu of dynamic shared memory: a GPU requires a 32-byte (256-bit) aligned pointer", what,
         size_t(c - g_dynamic_shared));
  g_fail_kind = nullptr;
}

void pipeline_copy(void* dst, const void* src, size_t bytes, size_t zfill) {
  if (!g_cur) fail("__pipeline_memcpy_async called outside a kernel");
  if (bytes != 4 && bytes != 8 && bytes != 16) fail("__pipeline_memcpy_async of %zu bytes: a GPU copies 4, 8 or 16", bytes);
  if (zfill > bytes) fail("__pipeline_memcpy_async with zfill %zu > %zu bytes", zfill, bytes);
  g_fail_kind = "misaligned";
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0)
    fail("__pipeline_memcpy_async of %zu bytes from %p to %p: a GPU requires both %zu-byte aligned", bytes, src, dst,
         bytes);
  g_fail_kind = "bounds";
  if (!is_device_pointer(src, bytes - zfill)) fail("__pipeline_memcpy_async from %p: not global (device) memory", src);
  g_fail_kind = nullptr;
  if (is_device_pointer(dst, bytes)) fail("__pipeline_memcpy_async to %p: global memory, not shared memory", dst);
  check::async_issued(dst, bytes, __builtin_return_address(0));
  g_cur->async_copies.push_back({dst, src, bytes, zfill, g_cur->groups_committed, __builtin_return_address(0)});
}

void pipeline_commit() {
  if (!g_cur) fail("__pipeline_commit called outside a kernel");
  g_cur->groups_committed++;
}

// Performs, in issue order, the copies of every committed group but the `prior` most recent ones.
void pipeline_wait_prior(size_t prior) {
  if (!g_cur) fail("__pipeline_wait_prior called outside a kernel");
  std::vector<Fiber::AsyncCopy>& q = g_cur->async_copies;
  const unsigned done_below = g_cur->groups_committed > prior ? unsigned(g_cur->groups_committed - prior) : 0;
  size_t kept = 0;
  for (size_t i = 0; i < q.size(); i++) {
    const Fiber::AsyncCopy& c = q[i];
    if (c.group < done_below) {
      check::async_landed(c.dst, c.src, c.bytes, c.zfill, __builtin_return_address(0));
      memcpy(c.dst, c.src, c.bytes - c.zfill);
      memset(static_cast<char*>(c.dst) + (c.bytes - c.zfill), 0, c.zfill);
    } else {
      q[kept++] = c;
    }
  }
  q.resize(kept);
}

void warp_exchange(const void* mine, void* theirs, size_t bytes, unsigned mask, int src_lane) {
  check_mask("a shuffle", mask);
  Fiber* f = g_cur;
  const unsigned op = f->warp_ops;
  WarpSlots& w = g_warps[f->warp];
  memcpy(&w.value[op & 1][f->lane], mine, bytes);
  f->state = State::AtWarp;
  f->op = WarpOp::Shuffle;
  f->warp_ops++;
  yield_to_scheduler();
  // A shuffle whose source lane is outside the warp returns the caller's own value.
  const int src = src_lane >= 0 && src_lane < kWarp ? src_lane : f->lane;
  memcpy(theirs, &w.value[op & 1][src], bytes);
}

unsigned ballot(unsigned mask, bool predicate) {
  check_mask("__ballot_sync", mask);
  Fiber* f = g_cur;
  const unsigned op = f->warp_ops;
  WarpSlots& w = g_warps[f->warp];
  w.value[op & 1][f->lane] = predicate;
  f->state = State::AtWarp;
  f->op = WarpOp::Shuffle;
  f->warp_ops++;
  yield_to_scheduler();
  unsigned bits = 0;
  for (int l = 0; l < kWarp; l++) bits |= unsigned(w.value[op & 1][l] != 0) << l;
  return bits & mask;
}

unsigned active_mask() {
  const int first = g_cur->warp * kWarp;
  unsigned bits = 0;
  for (int l = 0; l < kWarp && first + l < g_block_threads; l++)
    if (g_fibers[size_t(first + l)]->state != State::Done) bits |= 1u << l;
  return bits;
}

// NZ_EMU_PROFILE=1: at exit, the emulation time per kernel (where the emulator spends its time;
// says nothing about a GPU's).
struct Profile {
  struct Entry {
    double seconds = 0;
    unsigned long long launches = 0, threads = 0;
  };
  std::map<std::string, Entry> entries;
  static Profile* get() {
    static Profile* p = getenv("NZ_EMU_PROFILE") ? new Profile() : nullptr;
    return p;
  }
  static void report() {
    Profile* p = get();
    std::vector<std::pair<double, std::string>> rows;
    for (auto& kv : p->entries) rows.push_back({kv.second.seconds, kv.first});
    std::sort(rows.rbegin(), rows.rend());
    fprintf(stderr, "nz_emu profile (emulation time, not GPU time):\n");
    for (auto& r : rows) {
      const Entry& e = p->entries[r.second];
      fprintf(stderr, "  %8.3f s %8llu launches %12llu threads  %s\n", e.seconds, e.launches, e.threads,
              r.second.c_str());
    }
  }
  struct Timer {
    Entry* e = nullptr;
    std::chrono::steady_clock::time_point t0;
    Timer(const char* name, unsigned long long threads) {
      Profile* p = get();
      if (!p) return;
      static bool registered = (atexit(report), true);
      (void)registered;
      e = &p->entries[name];
      e->launches++;
      e->threads += threads;
      t0 = std::chrono::steady_clock::now();
    }
    ~Timer() {
      if (e) e->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };
};

// cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), per kernel
std::map<const void*, size_t> g_max_dynamic_shared;
constexpr size_t kSharedDefault = 48 * 1024, kSharedOptIn = 227 * 1024;  // sm_90's limits per block

cudaError_t set_max_dynamic_shared(const void* func, int bytes) {
  if (!func || bytes < 0 || size_t(bytes) > kSharedOptIn) return record(cudaErrorInvalidValue);
  g_max_dynamic_shared[func] = size_t(bytes);
  return cudaSuccess;
}

void run_grid(const char* name, const void* func, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              void (*body)(void*), void* ctx) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  const auto opted = func ? g_max_dynamic_shared.find(func) : g_max_dynamic_shared.end();
  const size_t smem_limit = opted == g_max_dynamic_shared.end() ? kSharedDefault
                                                                : std::max(kSharedDefault, opted->second);
  const bool valid = threads >= 1 && threads <= 1024 && block.x <= 1024 && block.y <= 1024 &&
                     block.z <= 64 && grid.x >= 1 && grid.x <= 0x7fffffffu && grid.y >= 1 &&
                     grid.y <= 65535 && grid.z >= 1 && grid.z <= 65535 && smem <= smem_limit;
  if (!valid) {
    if (getenv("NZ_EMU_VERBOSE"))
      fprintf(stderr, "nz_emu: launch of %s refused: grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", name,
              grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (g_cur) fail("kernel %s launched from inside a kernel", name);
  install_segv_handler();
  while (g_fibers.size() < threads) g_fibers.push_back(new_fiber());
  g_warps.resize((threads + kWarp - 1) / kWarp);
  g_dynamic_shared_bytes.assign(smem + kSharedAlign, 0xff);
  g_dynamic_shared = g_dynamic_shared_bytes.data() +
                     (kSharedAlign - reinterpret_cast<uintptr_t>(g_dynamic_shared_bytes.data()) % kSharedAlign);
  g_dynamic_shared_size = smem;
  g_block_threads = int(threads);
  g_body = body;
  g_body_ctx = ctx;
  block_dim = block;
  grid_dim = grid;
  DeviceAccess access;
  g_kernel = name;
  Profile::Timer timer(name, threads * grid.x * grid.y * grid.z);
  streams::begin(stream, "kernel", name);
  if (check::g_kinds) check::launch_begin(name, unsigned(threads));
  const size_t blocks = size_t(grid.x) * grid.y * grid.z;
  std::vector<size_t> order;  // NZ_EMU_SEED: the blocks in a random order
  if (fuzz().on) {
    order.resize(blocks);
    for (size_t b = 0; b < blocks; b++) order[b] = b;
    fuzz().shuffle(order.begin(), order.end());
  }
  for (size_t i = 0; i < blocks; i++) {
    const size_t b = order.empty() ? i : order[i];
    block_idx = dim3(unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / (size_t(grid.x) * grid.y)));
    if (smem) memset(g_dynamic_shared, 0xff, smem);  // a new block's shared memory is garbage
    if (check::g_kinds)
      check::block_begin(unsigned(b), g_dynamic_shared, smem, g_dynamic_shared_bytes.data(),
                         g_dynamic_shared_bytes.size());
    run_block();
  }
  if (check::g_kinds) check::launch_end();
  streams::end();
  g_kernel = nullptr;
}

}  // namespace nz_emu

// ============================================================================================
// the runtime API
using namespace nz_emu;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return *count > 0 ? cudaSuccess : record(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
  g_current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device_count() == 0) return record(cudaErrorNoDevice);
  *device = g_current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  snprintf(prop->name, sizeof(prop->name), "nz_emu (CUDA emulated on the CPU)");
  prop->totalGlobalMem = total_device_bytes();
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}

// Distinct per ordinal, so NZ_EMU_GPUS=4 with 4 ranks looks like 4 GPUs (the NCCL path), and
// every rank sees the same id for the same ordinal (ranks sharing a GPU: the MPI path).
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
  snprintf(bus_id, size_t(len), "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  streams::host_waits_device();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  install_segv_handler();
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t page = page_size();
  const size_t padded = (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
  const size_t data_bytes = (padded + page - 1) / page * page;
  if (g_device_used + data_bytes > total_device_bytes()) return record(cudaErrorMemoryAllocation);
  void* mem = mmap(nullptr, data_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) return record(cudaErrorMemoryAllocation);
  Mapping m{static_cast<char*>(mem), data_bytes, bytes};
  memset(m.base, 0xff, data_bytes);  // never-written memory reads as NaN
  mprotect(m.base + data_bytes, page, PROT_NONE);
  const char* user = m.base + data_bytes - padded;
  g_device[user] = m;
  g_device_used += data_bytes;
  if (check::g_kinds) check::allocated(user, bytes, m.base, m.base + data_bytes + page);
  streams::device_allocated(user, bytes);
  if (g_access_depth == 0) set_access(m, false);
  *ptr = const_cast<char*>(user);
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto it = g_device.find(static_cast<const char*>(ptr));
  if (it == g_device.end()) return record(cudaErrorInvalidValue);
  if (check::g_kinds) check::freed(ptr);
  streams::host_waits_device();  // cudaFree waits for the device first
  streams::device_freed(ptr);
  munmap(it->second.base, it->second.data_bytes + page_size());
  g_device_used -= it->second.data_bytes;
  g_device.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  *ptr = streams::pinned_allocate(bytes);  // with the stream check: pages of its own, to protect
  if (!*ptr && posix_memalign(ptr, 64, bytes ? bytes : 1) != 0) return record(cudaErrorMemoryAllocation);
  g_pinned.insert(*ptr);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (!g_pinned.erase(ptr)) return record(cudaErrorInvalidValue);
  streams::host_waits_device();  // cudaFreeHost waits for the device first
  if (!streams::pinned_free(ptr)) free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (device_count() == 0) return record(cudaErrorNoDevice);
  *total_bytes = total_device_bytes();
  *free_bytes = total_device_bytes() - g_device_used;
  return cudaSuccess;
}

namespace {
// 0: host memory; 1: inside one device buffer; -1: starts in a device buffer, runs past its end.
int where(const void* p, size_t bytes) {
  if (is_device_pointer(p, bytes)) return 1;
  return mapping_of(p) ? -1 : 0;
}
}  // namespace

namespace {
cudaError_t memset_on(cudaStream_t stream, const char* call, void* ptr, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (where(ptr, bytes) != 1) return record(cudaErrorInvalidValue);
  streams::begin(stream, call);
  streams::writes(ptr, bytes);
  DeviceAccess access;
  memset(ptr, value, bytes);
  check::host_wrote(ptr, bytes);
  streams::end();
  return cudaSuccess;
}

const char* kind_name(int d, int s) {
  return d && s ? "device to device" : d ? "host to device" : s ? "device to host" : "host to host";
}

// A copy queued on stream: the operation that reads src and writes dst.
cudaError_t copy_on(cudaStream_t stream, const char* call, void* dst, const void* src, size_t bytes,
                    cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const int d = where(dst, bytes), s = where(src, bytes);
  if (d < 0 || s < 0) return record(cudaErrorInvalidValue);  // a copy past the end of a buffer
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = !d && !s; break;
    case cudaMemcpyHostToDevice: ok = d && !s; break;
    case cudaMemcpyDeviceToHost: ok = !d && s; break;
    case cudaMemcpyDeviceToDevice: ok = d && s; break;
    case cudaMemcpyDefault: break;
  }
  if (!ok) return record(cudaErrorInvalidValue);
  char detail[96];
  snprintf(detail, sizeof(detail), "(%s, %zu bytes)", kind_name(d, s), bytes);
  streams::begin(stream, call, detail);
  streams::reads(src, bytes);
  streams::writes(dst, bytes);
  DeviceAccess access;
  streams::pinned_open();
  memmove(dst, src, bytes);
  streams::pinned_close();
  check::host_wrote(dst, bytes);
  streams::end();
  // Into pageable host memory a copy is synchronous: the host has seen it complete on return.
  if (!d && !streams::pinned(dst)) streams::host_waits_stream(stream);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) { return memset_on(nullptr, "cudaMemset", ptr, value, bytes); }

// On the legacy default stream, and the host waits for it (cudaMemcpy returns when it is done).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t err = copy_on(nullptr, "cudaMemcpy", dst, src, bytes, kind);
  if (err == cudaSuccess) streams::host_waits_stream(nullptr);
  return err;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_on(stream, "cudaMemcpyAsync", dst, src, bytes, kind);
}

// Streams and events: handles (all work completes within its call); the stream check (streams.h)
// follows the order they give.
struct nz_emu_stream {
  unsigned flags;
};
struct nz_emu_event {
  unsigned flags;
  double recorded_ms = -1;  // the host's steady clock at the last record; -1: never recorded
};
namespace {
std::set<const void*> g_handles;
bool valid_stream(cudaStream_t s) { return s == nullptr || g_handles.count(s); }
}  // namespace

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  *stream = new nz_emu_stream{flags};
  g_handles.insert(*stream);
  streams::stream_created(*stream, flags);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return valid_stream(stream) ? memset_on(stream, "cudaMemsetAsync", ptr, value, bytes)
                              : record(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!g_handles.count(event)) return record(cudaErrorInvalidResourceHandle);
  streams::host_waits_event(event);
  return cudaSuccess;
}
cudaError_t cudaPeekAtLastError() { return g_last_error; }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream || !g_handles.erase(stream)) return record(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  streams::host_waits_stream(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!valid_stream(stream) || !g_handles.count(event)) return record(cudaErrorInvalidResourceHandle);
  streams::stream_waits_event(stream, event);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  *event = new nz_emu_event{flags};
  g_handles.insert(*event);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event || !g_handles.erase(event)) return record(cudaErrorInvalidResourceHandle);
  streams::event_destroyed(event);
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!valid_stream(stream) || !g_handles.count(event)) return record(cudaErrorInvalidResourceHandle);
  event->recorded_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  streams::event_recorded(event, stream);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!g_handles.count(start) || !g_handles.count(end) || ((start->flags | end->flags) & cudaEventDisableTiming))
    return record(cudaErrorInvalidResourceHandle);
  if (start->recorded_ms < 0 || end->recorded_ms < 0) return cudaErrorNotReady;
  *ms = float(end->recorded_ms - start->recorded_ms);
  return cudaSuccess;
}
// NZ_EMU_NCCL_STUCK=error|hang (tests of nccl::wait_joined): a collective that never completes,
// because a peer failed (NCCL reports ncclRemoteError) or silently (ncclInProgress forever).
static const char* nccl_stuck() {
  static const char* mode = getenv("NZ_EMU_NCCL_STUCK");
  return mode;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!g_handles.count(event)) return record(cudaErrorInvalidResourceHandle);
  if (nccl_stuck()) return cudaErrorNotReady;
  streams::host_waits_event(event);  // done: the host has seen what it waited for
  return cudaSuccess;
}

// ============================================================================================
// cuBLAS: cublasGemmEx
struct nz_emu_cublas {
  cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (device_count() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new nz_emu_cublas{nullptr};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && !is_device_pointer(workspace, bytes)) fail("cublasSetWorkspace: %zu bytes at %p are not device memory", bytes, workspace);
  auto it = g_device.find(static_cast<const char*>(workspace));
  if (it != g_device.end()) {  // the library's from now on: sealed (Mapping)
    set_access(it->second, false);
    it->second.sealed = true;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;  // the products are fp32 loops whatever the mode
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

namespace {
inline float load_elem(const void* p, size_t i, cudaDataType_t t) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  if (t == CUDA_R_16F) return nz::f16_to_f32(static_cast<const nz::f16*>(p)[i]);
  return nz::bf16_to_f32(static_cast<const nz::bf16*>(p)[i]);
}
inline void store_elem(void* p, size_t i, cudaDataType_t t, float v) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = v;
  else if (t == CUDA_R_16F) static_cast<nz::f16*>(p)[i] = nz::f32_to_f16(v);
  else static_cast<nz::bf16*>(p)[i] = nz::f32_to_bf16(v);
}
// A column-major (rows, cols) operand with leading dimension ld is a device buffer that reaches
// element (rows-1, cols-1).
void check_operand(const char* name, const void* p, int rows, int cols, int ld, size_t elem) {
  if (rows == 0 || cols == 0) return;
  const size_t extent = (size_t(ld) * (cols - 1) + rows) * elem;
  if (!is_device_pointer(p, extent))
    fail("cublasGemmEx: %s (%d x %d, ld %d) is not a device buffer of at least %zu bytes", name, rows,
         cols, ld, extent);
}
}  // namespace

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                          const void* A, cudaDataType_t Atype, int lda, long long strideA,
                                          const void* B, cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (compute != CUBLAS_COMPUTE_32F || Atype != Btype ||
      (Atype != CUDA_R_32F && Atype != CUDA_R_16BF && Atype != CUDA_R_16F) ||
      (Ctype != Atype && Ctype != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
  const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const size_t ab_elem = Atype == CUDA_R_32F ? 4 : 2, c_elem = Ctype == CUDA_R_32F ? 4 : 2;
  auto operand = [](const void* base, long long stride, size_t elem, int i) {
    return static_cast<const char*>(base) + i * stride * (long long)elem;
  };
  for (int i = 0; i < batch; i++) {
    check_operand("A", operand(A, strideA, ab_elem, i), a_rows, a_cols, lda, ab_elem);
    check_operand("B", operand(B, strideB, ab_elem, i), b_rows, b_cols, ldb, ab_elem);
    check_operand("C", operand(C, strideC, c_elem, i), m, n, ldc, c_elem);
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  if (streams::on()) {  // the operation: each column of A and B read, of C written (and read)
    streams::begin(handle->stream, batch > 1 ? "cublasGemmStridedBatchedEx" : "cublasGemmEx");
    for (int i = 0; i < batch; i++) {
      for (int j = 0; j < a_cols; j++) streams::reads(operand(A, strideA, ab_elem, i) + size_t(j) * lda * ab_elem, a_rows * ab_elem);
      for (int j = 0; j < b_cols; j++) streams::reads(operand(B, strideB, ab_elem, i) + size_t(j) * ldb * ab_elem, b_rows * ab_elem);
      for (int j = 0; j < n; j++) {
        const char* col = operand(C, strideC, c_elem, i) + size_t(j) * ldc * c_elem;
        if (b != 0.0f) streams::reads(col, m * c_elem);
        streams::writes(col, m * c_elem);
      }
    }
    streams::end();
  }
  DeviceAccess access;
  for (int i = 0; i < batch; i++) {
    const void *Ai = operand(A, strideA, ab_elem, i), *Bi = operand(B, strideB, ab_elem, i);
    void* Ci = const_cast<char*>(operand(C, strideC, c_elem, i));
    for (int j = 0; j < n; j++)
      for (int r = 0; r < m; r++) {
        float acc = 0.0f;
        for (int p = 0; p < k; p++) {
          const size_t ai = transa == CUBLAS_OP_N ? size_t(p) * lda + r : size_t(r) * lda + p;
          const size_t bi = transb == CUBLAS_OP_N ? size_t(j) * ldb + p : size_t(p) * ldb + j;
          acc += load_elem(Ai, ai, Atype) * load_elem(Bi, bi, Btype);
        }
        const size_t ci = size_t(j) * ldc + r;
        // beta == 0: C is not read (it may hold NaN), as cuBLAS documents
        store_elem(Ci, ci, Ctype, b == 0.0f ? a * acc : a * acc + b * load_elem(Ci, ci, Ctype));
      }
    for (int j = 0; j < n; j++)  // the columns written (for NZ_EMU_CHECK's never-written check)
      check::host_wrote(static_cast<char*>(Ci) + size_t(j) * ldc * c_elem, size_t(m) * c_elem);
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* A, cudaDataType_t Atype,
                            int lda, const void* B, cudaDataType_t Btype, int ldb, const void* beta,
                            void* C, cudaDataType_t Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb,
                                    0, beta, C, Ctype, ldc, 0, 1, compute, algo);
}

// ============================================================================================
// NCCL over MPI
struct nz_emu_nccl {
  MPI_Comm comm;
  int rank, size;
  bool init_pending = false;  // NZ_EMU_NCCL_STUCK=init: a creation that never completes
  bool init_unpolled = false;  // made non-blocking: the next async-error poll reports its success
};

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result";
}

// NZ_EMU_NO_NCCL=1: any NCCL call stops the run (the test that a one-rank run makes none).
static void nccl_called(const char* what) {
  static const bool forbidden = getenv("NZ_EMU_NO_NCCL") && strcmp(getenv("NZ_EMU_NO_NCCL"), "1") == 0;
  if (forbidden) fail("%s called, and NZ_EMU_NO_NCCL=1 says this run makes no NCCL call", what);
}
// NZ_EMU_NCCL_STUCK=init: a non-blocking ncclCommInitRankConfig that never completes (a peer that
// never joins the bootstrap), for the time limit on communicator creation.
static bool init_hangs() {
  static const bool hangs = getenv("NZ_EMU_NCCL_STUCK") && strcmp(getenv("NZ_EMU_NCCL_STUCK"), "init") == 0;
  return hangs;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  nccl_called("ncclGetUniqueId");
  // Different on every call and every process, like a real id (it names a socket address).
  static unsigned counter = 0;
  memset(id->internal, 0, sizeof(id->internal));
  snprintf(id->internal, sizeof(id->internal), "nz_emu %ld %u %lu", long(getpid()), counter++,
           (unsigned long)(size_t)id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  nccl_called("ncclCommInitRank");
  int initialized = 0, world_size = 0, world_rank = 0;
  MPI_Initialized(&initialized);
  if (!initialized || device_count() == 0) return ncclInvalidUsage;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (nranks != world_size || rank != world_rank) return ncclInvalidArgument;
  std::vector<char> ids(size_t(world_size) * NCCL_UNIQUE_ID_BYTES);
  MPI_Allgather(id.internal, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, ids.data(), NCCL_UNIQUE_ID_BYTES, MPI_BYTE,
                MPI_COMM_WORLD);
  for (int r = 0; r < world_size; r++)
    if (memcmp(ids.data() + size_t(r) * NCCL_UNIQUE_ID_BYTES, id.internal, NCCL_UNIQUE_ID_BYTES) != 0)
      fail("ncclCommInitRank: rank %d passed a different unique id than rank %d (the id was not "
           "broadcast from one rank)", r, rank);
  *comm = new nz_emu_nccl{MPI_COMM_NULL, rank, nranks};
  MPI_Comm_dup(MPI_COMM_WORLD, &(*comm)->comm);
  return ncclSuccess;
}

// Non-blocking (config.blocking == 0): the communicator is made here, as the blocking call makes
// it, and ncclInProgress returned; ncclCommGetAsyncError then says ncclSuccess (or, with
// NZ_EMU_NCCL_STUCK=init, ncclInProgress until the communicator is aborted).
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  nccl_called("ncclCommInitRankConfig");
  if (!config || (config->blocking != 0 && config->blocking != 1)) return ncclInvalidArgument;
  if (init_hangs()) {  // the bootstrap waits for a peer that never comes
    *comm = new nz_emu_nccl{MPI_COMM_NULL, rank, nranks};
    (*comm)->init_pending = true;
    return ncclInProgress;
  }
  const ncclResult_t r = ncclCommInitRank(comm, nranks, id, rank);
  if (r != ncclSuccess || config->blocking) return r;
  (*comm)->init_unpolled = true;  // the creation succeeded, whatever NZ_EMU_NCCL_STUCK does later
  return ncclInProgress;
}

// The new communicator's MPI one is split off the parent's; non-blocking as ncclCommInitRankConfig.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  nccl_called("ncclCommSplit");
  if (!comm || color < 0 || !config || (config->blocking != 0 && config->blocking != 1)) return ncclInvalidArgument;
  *newcomm = new nz_emu_nccl{MPI_COMM_NULL, 0, 0};
  MPI_Comm_split(comm->comm, color, key, &(*newcomm)->comm);
  MPI_Comm_rank((*newcomm)->comm, &(*newcomm)->rank);
  MPI_Comm_size((*newcomm)->comm, &(*newcomm)->size);
  (*newcomm)->init_unpolled = config->blocking == 0;
  return config->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
  delete comm;
  return ncclSuccess;
}
// Collectives complete when they are called here, so there is never an error left to report
// (unless NZ_EMU_NCCL_STUCK says otherwise, above).
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm) return ncclInvalidArgument;
  if (comm->init_pending || comm->init_unpolled) {
    *async_error = comm->init_pending ? ncclInProgress : ncclSuccess;
    comm->init_unpolled = false;
    return ncclSuccess;
  }
  *async_error = !nccl_stuck() ? ncclSuccess : strcmp(nccl_stuck(), "error") == 0 ? ncclRemoteError : ncclInProgress;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

namespace {

size_t nccl_bytes(ncclDataType_t t) { return t == ncclFloat64 ? 8 : t == ncclFloat32 ? 4 : 2; }

// Every rank's `count` elements at `send`, gathered into one host vector (rank-major).
std::vector<char> gather_all(const void* send, size_t count, ncclDataType_t t, ncclComm_t comm) {
  const size_t bytes = count * nccl_bytes(t);
  if (bytes > size_t(1) << 30) fail("NCCL emulation: %zu bytes in one collective is too many", bytes);
  if (!is_device_pointer(send, bytes)) fail("NCCL: the send buffer (%zu bytes) is not device memory", bytes);
  std::vector<char> all(bytes * comm->size);
  MPI_Allgather(send, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, comm->comm);
  return all;
}

// One hop of a ring: the running sum plus the next rank's value, stored in the wire type (for bf16
// that rounds after every addition, as each hop stores its partial sum).
inline float hop(float s, float v) { return s + v; }
inline double hop(double s, double v) { return s + v; }
inline nz::bf16 hop(nz::bf16 s, nz::bf16 v) { return nz::f32_to_bf16(nz::bf16_to_f32(s) + nz::bf16_to_f32(v)); }
inline nz::f16 hop(nz::f16 s, nz::f16 v) { return nz::f32_to_f16(nz::f16_to_f32(s) + nz::f16_to_f32(v)); }

// Element i of a ring sum whose chunk ends on rank `last`: ranks last+1, last+2, ..., last.
template <class V>
void ring_sum(const std::vector<char>& all, size_t count, size_t i, int last, int size, void* out,
              size_t out_index) {
  const V* v = reinterpret_cast<const V*>(all.data());
  const int first = (last + 1) % size;
  V s = v[size_t(first) * count + i];
  for (int h = 1; h < size; h++) s = hop(s, v[size_t((first + h) % size) * count + i]);
  static_cast<V*>(out)[out_index] = s;
}

void ring_sum(const std::vector<char>& all, size_t count, size_t i, int last, int size, ncclDataType_t t,
              void* out, size_t out_index) {
  if (t == ncclFloat64) ring_sum<double>(all, count, i, last, size, out, out_index);
  else if (t == ncclFloat32) ring_sum<float>(all, count, i, last, size, out, out_index);
  else if (t == ncclFloat16) ring_sum<nz::f16>(all, count, i, last, size, out, out_index);
  else ring_sum<nz::bf16>(all, count, i, last, size, out, out_index);
}

}  // namespace

// The stream check's operation on the collective's stream (a scope): what it reads and writes.
struct CollectiveOp {
  CollectiveOp(cudaStream_t stream, const char* name, const void* send, size_t send_bytes, const void* recv,
               size_t recv_bytes) {
    streams::begin(stream, name);
    streams::reads(send, send_bytes);
    streams::writes(recv, recv_bytes);
  }
  ~CollectiveOp() { streams::end(); }
};

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  nccl_called("ncclAllReduce");
  if (!comm || op != ncclSum) return ncclInvalidArgument;
  CollectiveOp in_order(stream, "ncclAllReduce", send, count * nccl_bytes(type), recv, count * nccl_bytes(type));
  DeviceAccess access;
  if (!is_device_pointer(recv, count * nccl_bytes(type))) fail("ncclAllReduce: recv is not device memory");
  std::vector<char> all = gather_all(send, count, type, comm);
  const size_t chunk = (count + comm->size - 1) / comm->size;  // chunk c ends its ring on rank c
  for (size_t i = 0; i < count; i++) ring_sum(all, count, i, int(i / chunk), comm->size, type, recv, i);
  check::host_wrote(recv, count * nccl_bytes(type));
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  nccl_called("ncclReduceScatter");
  if (!comm || op != ncclSum) return ncclInvalidArgument;
  CollectiveOp in_order(stream, "ncclReduceScatter", send, recvcount * comm->size * nccl_bytes(type), recv,
                        recvcount * nccl_bytes(type));
  DeviceAccess access;
  if (!is_device_pointer(recv, recvcount * nccl_bytes(type)))
    fail("ncclReduceScatter: recv is not device memory");
  const size_t count = recvcount * comm->size;
  std::vector<char> all = gather_all(send, count, type, comm);
  for (size_t i = 0; i < recvcount; i++)
    ring_sum(all, count, size_t(comm->rank) * recvcount + i, comm->rank, comm->size, type, recv, i);
  check::host_wrote(recv, recvcount * nccl_bytes(type));
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  nccl_called("ncclAllGather");
  if (!comm) return ncclInvalidArgument;
  CollectiveOp in_order(stream, "ncclAllGather", send, sendcount * nccl_bytes(type), recv,
                        sendcount * comm->size * nccl_bytes(type));
  DeviceAccess access;
  const size_t bytes = sendcount * nccl_bytes(type);
  if (!is_device_pointer(recv, bytes * comm->size)) fail("ncclAllGather: recv is not device memory");
  std::vector<char> all = gather_all(send, sendcount, type, comm);
  memcpy(recv, all.data(), all.size());
  check::host_wrote(recv, all.size());
  return ncclSuccess;
}

// Point to point: the ops of a group are posted together at ncclGroupEnd and all waited for; an op
// outside a group is a group of one. MPI_Issend, not MPI_Isend: NCCL's send does not complete
// before the peer has posted the receive (MPI would complete a small send eagerly), and one tag,
// so messages between two ranks match in the order they were issued, as NCCL's do.
namespace {
struct P2POp {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  MPI_Comm comm;
  cudaStream_t stream;
};
int g_group_depth = 0;
std::vector<P2POp> g_group_ops;

ncclResult_t run_p2p_ops() {
  std::vector<MPI_Request> reqs(g_group_ops.size(), MPI_REQUEST_NULL);
  {
    DeviceAccess access;
    for (size_t i = 0; i < g_group_ops.size(); i++) {
      const P2POp& op = g_group_ops[i];
      if (op.send) MPI_Issend(op.buf, int(op.bytes), MPI_BYTE, op.peer, 0, op.comm, &reqs[i]);
      else MPI_Irecv(op.buf, int(op.bytes), MPI_BYTE, op.peer, 0, op.comm, &reqs[i]);
    }
    MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    for (const P2POp& op : g_group_ops) {
      if (!op.send) check::host_wrote(op.buf, op.bytes);
      streams::begin(op.stream, op.send ? "ncclSend" : "ncclRecv");
      if (op.send) streams::reads(op.buf, op.bytes);
      else streams::writes(op.buf, op.bytes);
      streams::end();
    }
  }
  g_group_ops.clear();
  return ncclSuccess;
}

ncclResult_t add_p2p_op(bool send, const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                        cudaStream_t stream) {
  if (!comm || peer < 0 || peer >= comm->size || peer == comm->rank) return ncclInvalidArgument;
  const size_t bytes = count * nccl_bytes(type);
  if (bytes > size_t(1) << 30) fail("NCCL emulation: %zu bytes in one send or receive is too many", bytes);
  if (!is_device_pointer(buf, bytes))
    fail("%s: the buffer (%zu bytes) is not device memory", send ? "ncclSend" : "ncclRecv", bytes);
  g_group_ops.push_back({send, const_cast<void*>(buf), bytes, peer, comm->comm, stream});
  return g_group_depth > 0 ? ncclSuccess : run_p2p_ops();
}
}  // namespace

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  nccl_called("ncclSend");
  return add_p2p_op(true, send, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  nccl_called("ncclRecv");
  return add_p2p_op(false, recv, count, type, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  nccl_called("ncclGroupStart");
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  nccl_called("ncclGroupEnd");
  if (g_group_depth == 0) return ncclInvalidUsage;
  return --g_group_depth > 0 ? ncclSuccess : run_p2p_ops();
}
