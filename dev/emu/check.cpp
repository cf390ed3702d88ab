// check.cpp — nz_emu's checks of kernel memory accesses (check.h): races, reads of never-written
// memory, accesses outside a buffer and misaligned vector accesses.
//
// How accesses are seen: the kernel translation units are compiled with GCC's thread-sanitizer
// instrumentation (-fsanitize=thread, dev/emu.mk), which calls __tsan_read4(p), __tsan_write16(p),
// __tsan_read_range(p, n), ... before every load and store the compiler cannot prove private to
// the thread. The sanitizer's runtime library is not linked: this file defines those hooks. A hook
// returns at once unless a kernel thread runs with a check on, and ignores the thread's own stack
// and host memory; device buffers, dynamic and static shared memory are checked.
//
// Races (CUDA's rules, per byte): two accesses of which one writes conflict unless ordered by
//   - the same thread (program order);
//   - the same warp: a __syncwarp or __syncthreads released between them;
//   - other warps of the block: a __syncthreads released between them;
//   - other blocks of the launch: never (device memory; each block has its own shared memory).
// Shuffles and WMMA *_sync calls order no memory here, as on a GPU. Kernels of one launch after
// another are ordered here; whether their streams order them is the stream check's (streams.cpp). Each byte remembers its last writer and up to
// two readers (a third concurrent reader replaces the second, so some write-after-read races
// among three or more warps go unreported). A record of an earlier launch, or for shared memory
// of an earlier block, counts as no record: the shadow is never cleared, only allocated (36 bytes
// per byte a kernel touches) when first touched.
#include "check.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_runtime.h"  // nz_emu::block_dim, block_idx
#include "streams.h"       // the stream-order check: kernels' accesses to device memory

namespace nz_emu {
namespace check {

unsigned g_kinds = 0;
int g_thread = -1;
const char* g_stack_lo = nullptr;
const char* g_stack_hi = nullptr;

namespace {

// ---- settings and findings ----------------------------------------------------------------
unsigned parse_kinds(const char* e) {
  if (!e || !*e || strcmp(e, "none") == 0 || strcmp(e, "0") == 0) return 0;
  if (strcmp(e, "all") == 0 || strcmp(e, "1") == 0) return kRace | kUninit | kBounds | kMisaligned | kStream;
  unsigned k = 0;
  std::string s(e);
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    const std::string w = s.substr(start, end - start);
    if (w == "race") k |= kRace;
    else if (w == "uninit") k |= kUninit;
    else if (w == "bounds") k |= kBounds;
    else if (w == "misaligned") k |= kMisaligned;
    else if (w == "stream") k |= kStream;
    else {
      fprintf(stderr,
              "nz_emu: NZ_EMU_CHECK=%s: unknown check '%s' (expected all, none, or a comma list of race, "
              "uninit, bounds, misaligned, stream)\n",
              e, w.c_str());
      exit(2);
    }
    start = end + 1;
  }
  return k;
}
constexpr int kExitFindings = 66;
unsigned long g_findings = 0, g_shown = 0;
constexpr unsigned long kMaxShown = 50;
std::set<std::string> g_seen;  // distinct findings (kind and places), each printed once
std::map<std::string, int> g_per_kernel;
constexpr int kMaxPerKernel = 4;

unsigned long long g_checked = 0, g_launches = 0;  // loads and stores checked; kernel launches

// At exit, with a check on: what was checked, and status 66 when anything was found.
void at_exit() {
  const std::string ordered =
      g_kinds & kStream ? ", " + std::to_string(streams::operations()) + " stream operations ordered" : "";
  fprintf(stderr,
          "nz_emu: NZ_EMU_CHECK=%s: %llu loads and stores of device and shared memory checked in %llu kernel "
          "launch%s%s, %lu finding%s (%lu shown)\n",
          getenv("NZ_EMU_CHECK"), g_checked, g_launches, g_launches == 1 ? "" : "es", ordered.c_str(), g_findings,
          g_findings == 1 ? "" : "s", g_shown);
  fflush(stderr);
  fflush(nullptr);  // the program's stdout too: _exit skips stdio's own flush
  if (g_findings) _exit(kExitFindings);
}

struct Configure {
  Configure() {
    g_kinds = parse_kinds(getenv("NZ_EMU_CHECK"));
    if (g_kinds) atexit(at_exit);
  }
} g_configure;

// "file.cu:123" for a return address in kernel code (addr2line on the object holding it; needs -g)
std::string where(const void* pc) {
  if (!pc) return "?";
  static std::map<const void*, std::string> cache;
  auto it = cache.find(pc);
  if (it != cache.end()) return it->second;
  std::string out = "?";
  Dl_info info;
  if (dladdr(pc, &info) && info.dli_fname) {
    char cmd[1024];
    const unsigned long off = (unsigned long)((const char*)pc - (const char*)info.dli_fbase) - 1;
    char exe[512] = "";
    const char* file = info.dli_fname;
    if (!strchr(file, '/')) {  // the main program: dladdr gives argv[0]
      const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
      if (n > 0) exe[n] = 0, file = exe;
    }
    // -i: the chain of inlined calls, innermost first; the first place outside the emulator's own
    // headers (uint4's copy, cp.async, WMMA loads and stores are inlined into the kernel) is the one
    snprintf(cmd, sizeof(cmd), "addr2line -i -e '%s' 0x%lx 2>/dev/null", file, off);
    if (FILE* p = popen(cmd, "r")) {
      char line[512];
      bool first = true;
      while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "??", 2) == 0) continue;
        const char* slash = strstr(line, "common/");  // paths from the repository root where possible
        if (!slash) slash = strstr(line, "dev/");
        if (!slash) slash = strstr(line, "tests/");
        std::string place = slash ? slash : line;
        const size_t paren = place.find(" (");
        if (paren != std::string::npos) place.resize(paren);
        // Only the rewritten .cu files are instrumented, and cu2cpp.pl keeps their line numbers;
        // the debug information sometimes names the rewritten file instead of the #line one.
        const size_t cpp = place.find(".cpp:");
        if (cpp != std::string::npos) place.replace(cpp, 4, ".cu");
        if (first || out.find("dev/emu/include/") != std::string::npos) out = place;
        first = false;
      }
      pclose(p);
    }
  }
  cache[pc] = out;
  return out;
}

}  // namespace

namespace {
// Prints the finding unless one of the same kind at the same places (kernel, code addresses) was.
void vreport(const char* kind, const char* kernel, const void* pc1, const void* pc2, const char* fmt, va_list ap) {
  g_findings++;
  char key[256];
  snprintf(key, sizeof(key), "%s %s %p %p", kind, kernel, pc1, pc2);
  if (!g_seen.insert(key).second || g_shown >= kMaxShown) return;
  // at most kMaxPerKernel lines per kind and kernel: one bug touches many places
  if (++g_per_kernel[std::string(kind) + " " + kernel] > kMaxPerKernel) return;
  g_shown++;
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  fprintf(stderr, "emu-check: %s: %s\n", kind, msg);
  fflush(stderr);
}
}  // namespace

void finding(const char* kind, const char* key, const char* fmt, ...) {
  g_findings++;
  if (!g_seen.insert(std::string(kind) + " " + key).second || g_shown >= kMaxShown) return;
  g_shown++;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "emu-check: %s: %s\n", kind, msg);
  fflush(stderr);
}

namespace {
const char* g_kernel = "?";
void report(const char* kind, const void* pc1, const void* pc2, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
void report(const char* kind, const void* pc1, const void* pc2, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(kind, g_kernel, pc1, pc2, fmt, ap);
  va_end(ap);
}
}  // namespace

namespace {

// ---- the memory checked -------------------------------------------------------------------
enum class Space { Global, DynamicShared, StaticShared };

// One record of an access: the block's serial number (unique over the run), the thread and the
// thread's warp epoch at the access; 0 = none. Plus where in the code.
// Code addresses are kept as 32-bit offsets from this file's code (12 bytes a record, 36 a byte of
// memory: the shadow is memory-bound), 0 when out of reach.
struct __attribute__((packed)) Cell {
  uint64_t tag;
  int32_t pc;
};
struct __attribute__((packed)) Shadow {
  Cell w, r1, r2;
};
const char* code_base() { return reinterpret_cast<const char*>(&code_base); }
int32_t pc_offset(const void* pc) {
  const long long d = static_cast<const char*>(pc) - code_base();
  return d > INT32_MIN && d <= INT32_MAX ? int32_t(d) : INT32_MIN;
}
const void* pc_of(int32_t off) { return off == INT32_MIN ? nullptr : code_base() + off; }
constexpr size_t kPage = 1024;  // shadow is allocated per 1024 bytes, when first touched

struct Region {
  const char* lo;    // every address of the region: a device mapping with its guard page, or
  const char* hi;    // the dynamic shared buffer with its alignment slack
  const char* user;  // the valid bytes [user, user + bytes)
  size_t bytes;
  Space space;
  const char* name = nullptr;  // static shared: the variable, its file and line
  const char* file = nullptr;
  int line = 0;
  unsigned poisoned_block = ~0u;       // static shared: the block serial last poisoned for
  std::vector<unsigned char> written;  // uninit: per valid byte, 1 once written
  std::vector<Shadow*> pages;          // race: this launch's shadow per kPage bytes, or null
};

std::map<const char*, Region> g_device;  // keyed by lo
std::vector<Region*> g_statics;          // static shared variables seen so far
Region g_dynamic;                        // the launch's dynamic shared memory
Region* g_last = nullptr;                // the region of the last access (most hit again)

// the launch
unsigned g_serial = 0, g_launch_serial = 1;  // this block's serial; the launch's first block's
std::vector<unsigned> g_block_of_serial;     // block linear index of each serial of this launch
std::vector<uint32_t> g_warp_epoch;          // per warp: barriers released (__syncwarp or __syncthreads)
std::vector<uint32_t> g_warp_bar;            // per warp: its epoch right after the last __syncthreads
std::vector<Shadow*> g_free_pages;           // pages of freed buffers, for reuse

constexpr uint64_t kEpochMask = (1u << 22) - 1;

Region* find(const char* c) {
  if (g_last && c >= g_last->lo && c < g_last->hi) return g_last;
  if (g_dynamic.lo && c >= g_dynamic.lo && c < g_dynamic.hi) return g_last = &g_dynamic;
  for (Region* r : g_statics)
    if (c >= r->lo && c < r->hi) return g_last = r;
  auto it = g_device.upper_bound(c);
  if (it == g_device.begin()) return nullptr;
  --it;
  if (c >= it->second.lo && c < it->second.hi) return g_last = &it->second;
  return nullptr;
}

std::string thread_name(unsigned serial, unsigned tid) {
  const unsigned bl =
      serial - g_launch_serial < g_block_of_serial.size() ? g_block_of_serial[serial - g_launch_serial] : 0;
  const unsigned gx = std::max(1u, grid_dim.x), gy = std::max(1u, grid_dim.y);
  const unsigned bx = std::max(1u, block_dim.x), by = std::max(1u, block_dim.y);
  char s[96];
  snprintf(s, sizeof(s), "thread (%u,%u,%u) of block (%u,%u,%u)", tid % bx, tid / bx % by, tid / (bx * by), bl % gx,
           bl / gx % gy, bl / (gx * gy));
  return s;
}

std::string buffer_name(const Region& r, size_t off) {
  char s[256];
  if (r.space == Space::Global) snprintf(s, sizeof(s), "byte %zu of a %zu-byte device buffer", off, r.bytes);
  else if (r.space == Space::DynamicShared)
    snprintf(s, sizeof(s), "byte %zu of dynamic shared memory (%zu bytes)", off, r.bytes);
  else snprintf(s, sizeof(s), "byte %zu of __shared__ %s (%s:%d)", off, r.name, r.file, r.line);
  return s;
}

// ---- races ----------------------------------------------------------------------------------
uint64_t my_tag() {
  return uint64_t(g_serial) << 32 | uint64_t(g_thread) << 22 | (g_warp_epoch[g_thread / 32] & kEpochMask);
}

// Does the access recorded in `tag` happen before the running thread's access now?
// Relevant: a record of this launch (device memory) or of this block (shared memory).
enum Order { Unrelated, Ordered, Concurrent };
Order order(uint64_t tag, Space space) {
  if (!tag) return Unrelated;
  const unsigned serial = unsigned(tag >> 32);
  if (serial != g_serial) {
    if (space != Space::Global || serial < g_launch_serial) return Unrelated;
    return Concurrent;  // another block of this launch
  }
  const int tid = int(tag >> 22 & 0x3ff);
  const uint32_t epoch = uint32_t(tag & kEpochMask);
  if (tid == g_thread) return Ordered;
  const int w = tid / 32;
  if (w == g_thread / 32) return epoch < (g_warp_epoch[w] & kEpochMask) ? Ordered : Concurrent;
  return epoch < (g_warp_bar[w] & kEpochMask) ? Ordered : Concurrent;
}

const char* rule(uint64_t tag) {
  const unsigned serial = unsigned(tag >> 32);
  if (serial != g_serial) return "another block of the same launch (blocks are never ordered within a launch)";
  const int tid = int(tag >> 22 & 0x3ff);
  return tid / 32 == g_thread / 32 ? "the same warp with no __syncwarp or __syncthreads between"
                                   : "another warp with no __syncthreads between";
}

void report_race(const char* kind, const Region& r, size_t off, const Cell& earlier, bool earlier_write, const void* pc,
                 bool write) {
  const unsigned serial = unsigned(earlier.tag >> 32);
  const unsigned tid = unsigned(earlier.tag >> 22 & 0x3ff);
  report("race", pc, pc_of(earlier.pc), "%s on %s in kernel %s: %s %s at %s; %s %s it at %s: %s", kind,
         buffer_name(r, off).c_str(), g_kernel, thread_name(g_serial, unsigned(g_thread)).c_str(),
         write ? "writes" : "reads", where(pc).c_str(), thread_name(serial, tid).c_str(),
         earlier_write ? "wrote" : "read", where(pc_of(earlier.pc)).c_str(), rule(earlier.tag));
}

Shadow* page(Region& r, size_t off) {
  const size_t p = off / kPage;
  if (r.pages.empty()) r.pages.assign((r.bytes + kPage - 1) / kPage, nullptr);
  Shadow*& s = r.pages[p];
  if (!s) {
    if (g_free_pages.empty()) {
      s = new Shadow[kPage];
    } else {
      s = g_free_pages.back();
      g_free_pages.pop_back();
    }
    memset(static_cast<void*>(s), 0, sizeof(Shadow) * kPage);
  }
  return s + off % kPage;
}

void race_access(Region& r, size_t off, size_t n, bool write, const void* pc) {
  const uint64_t me = my_tag();
  const int32_t here = pc_offset(pc);
  // An access of at most 16 bytes rarely crosses a shadow page: look the page up once.
  Shadow* first = (off % kPage) + n <= kPage ? page(r, off) : nullptr;
  auto cell = [&](size_t i) -> Shadow& { return first ? first[i] : *page(r, off + i); };
  uint64_t checked_w = 0, checked_r1 = 0, checked_r2 = 0;  // the bytes of one access mostly share records
  for (size_t i = 0; i < n; i++) {
    Shadow& s = cell(i);
    if (s.w.tag != checked_w && order(s.w.tag, r.space) == Concurrent) {
      report_race(write ? "write-after-write" : "read-after-write", r, off + i, s.w, true, pc, write);
      break;  // one finding per access
    }
    checked_w = s.w.tag;
    if (write) {
      if (s.r1.tag != checked_r1 && order(s.r1.tag, r.space) == Concurrent) {
        report_race("write-after-read", r, off + i, s.r1, false, pc, write);
        break;
      }
      if (s.r2.tag != checked_r2 && order(s.r2.tag, r.space) == Concurrent) {
        report_race("write-after-read", r, off + i, s.r2, false, pc, write);
        break;
      }
      checked_r1 = s.r1.tag;
      checked_r2 = s.r2.tag;
    }
  }
  for (size_t i = 0; i < n; i++) {
    Shadow& s = cell(i);
    if (write) {
      s.w = {me, here};
      s.r1.tag = s.r2.tag = 0;  // readers before this write: ordered before it, or reported
    } else if (s.r1.tag == me || order(s.r1.tag, r.space) != Concurrent) {
      s.r1 = {me, here};
    } else {
      s.r2 = {me, here};
    }
  }
}

// ---- one access ---------------------------------------------------------------------------
void check_access(Region& r, const char* c, size_t n, bool write, bool aligned, const void* pc, bool mark_written,
                  bool check_written) {
  if (c < r.user || c + n > r.user + r.bytes) {
    if (g_kinds & kBounds) {
      const bool global = r.space == Space::Global;
      report("bounds", pc, nullptr, "%zu-byte %s at byte %lld of %s%zu-byte %s (%s) in kernel %s, %s, at %s", n,
             write ? "write" : "read", (long long)(c - r.user), global ? "a " : "", r.bytes,
             global ? "device buffer" : "dynamic shared memory", c < r.user ? "before its start" : "past its end",
             g_kernel, thread_name(g_serial, unsigned(g_thread)).c_str(), where(pc).c_str());
    }
    return;  // nothing to track outside the buffer (past the mapping, the guard page faults)
  }
  const size_t off = size_t(c - r.user);
  if ((g_kinds & kMisaligned) && aligned && n > 1 && reinterpret_cast<uintptr_t>(c) % n != 0)
    report("misaligned", pc, nullptr,
           "%zu-byte %s at %s (address %% %zu = %zu) in kernel %s, %s, at %s: a GPU requires %zu-byte "
           "alignment",
           n, write ? "store" : "load", buffer_name(r, off).c_str(), n, size_t(reinterpret_cast<uintptr_t>(c) % n),
           g_kernel, thread_name(g_serial, unsigned(g_thread)).c_str(), where(pc).c_str(), n);
  if ((g_kinds & kUninit) && !r.written.empty()) {
    if (!write && check_written) {
      for (size_t i = 0; i < n; i++)
        if (!r.written[off + i]) {
          report("uninit", pc, nullptr, "read of never-written %s in kernel %s, %s, at %s",
                 buffer_name(r, off + i).c_str(), g_kernel, thread_name(g_serial, unsigned(g_thread)).c_str(),
                 where(pc).c_str());
          break;
        }
    }
    if (write && mark_written) memset(&r.written[off], 1, n);
  }
  if (g_kinds & kRace) race_access(r, off, n, write, pc);
}

}  // namespace

// An atomic read-modify-write: bounds, alignment and never-written memory, no race record.
void atomic(void* p, size_t n, const void* pc) {
  const char* c = static_cast<const char*>(p);
  Region* r = find(c);
  if (!r) return;
  g_checked++;
  if ((g_kinds & kStream) && r->space == Space::Global) streams::kernel_access(c, n, true);
  const unsigned kinds = g_kinds;
  g_kinds &= ~kRace;
  check_access(*r, c, n, false, true, pc, false, true);
  check_access(*r, c, n, true, true, pc, true, false);
  g_kinds = kinds;
}

void access(const void* p, size_t n, bool write, bool aligned, const void* pc) {
  const char* c = static_cast<const char*>(p);
  if (c >= g_stack_lo && c < g_stack_hi) return;  // the thread's own stack
  Region* r = find(c);
  if (!r) return;
  g_checked++;
  if ((g_kinds & kStream) && r->space == Space::Global) streams::kernel_access(c, n, write);
  check_access(*r, c, n, write, aligned, pc, true, true);
}

}  // namespace check

void vector_access(const void* p, size_t bytes, bool write) {
  if (check::g_thread >= 0) check::access(p, bytes, write, true, __builtin_return_address(0));
}

void atomic_access(void* p, size_t bytes) {
  if (check::g_thread >= 0) check::atomic(p, bytes, __builtin_return_address(0));
}

namespace check {

// ---- the scheduler's events ---------------------------------------------------------------
void launch_begin(const char* kernel, unsigned threads) {
  g_launches++;
  g_kernel = kernel;
  g_launch_serial = g_serial + 1;
  g_block_of_serial.clear();
  const unsigned warps = (threads + 31) / 32;
  g_warp_epoch.assign(warps, 0);
  g_warp_bar.assign(warps, 0);
}

void block_begin(unsigned block_linear, unsigned char* dyn, size_t dyn_size, unsigned char* buffer,
                 size_t buffer_size) {
  g_serial++;
  g_block_of_serial.push_back(block_linear);
  std::fill(g_warp_epoch.begin(), g_warp_epoch.end(), 0);
  std::fill(g_warp_bar.begin(), g_warp_bar.end(), 0);
  g_dynamic.lo = reinterpret_cast<const char*>(buffer);
  g_dynamic.hi = g_dynamic.lo + buffer_size;
  g_dynamic.user = reinterpret_cast<const char*>(dyn);
  g_dynamic.bytes = dyn_size;
  g_dynamic.space = Space::DynamicShared;
  if (g_kinds & kUninit) g_dynamic.written.assign(dyn_size, 0);
  if (g_dynamic.pages.size() < (dyn_size + kPage - 1) / kPage) g_dynamic.pages.resize((dyn_size + kPage - 1) / kPage);
  g_last = nullptr;
}

void barrier_released(int warp) {
  if (warp >= 0) {
    g_warp_epoch[size_t(warp)]++;
    return;
  }
  for (size_t w = 0; w < g_warp_epoch.size(); w++) g_warp_bar[w] = ++g_warp_epoch[w];
}

void launch_end() {
  g_dynamic.lo = g_dynamic.hi = nullptr;
  g_last = nullptr;
  g_kernel = "?";
}

// ---- device memory and static shared memory -------------------------------------------------
void allocated(const void* user, size_t bytes, const void* lo, const void* hi) {
  Region& r = g_device[static_cast<const char*>(lo)];
  r = Region();
  r.lo = static_cast<const char*>(lo);
  r.hi = static_cast<const char*>(hi);
  r.user = static_cast<const char*>(user);
  r.bytes = bytes;
  r.space = Space::Global;
  if (g_kinds & kUninit) r.written.assign(bytes, 0);
  g_last = nullptr;
}

void freed(const void* user) {
  for (auto it = g_device.begin(); it != g_device.end(); ++it)
    if (it->second.user == user) {
      for (Shadow* s : it->second.pages)
        if (s) g_free_pages.push_back(s);
      g_device.erase(it);
      g_last = nullptr;
      return;
    }
}

void host_wrote(const void* p, size_t bytes) {
  if (!(g_kinds & kUninit) || bytes == 0) return;
  const char* c = static_cast<const char*>(p);
  Region* r = find(c);
  if (!r || r->written.empty() || c < r->user || c + bytes > r->user + r->bytes) return;
  memset(&r->written[size_t(c - r->user)], 1, bytes);
}

// Each block has its own shared memory, garbage at the start: the first thread of a block that
// reaches the declaration fills the variable with 0xFF bytes (NaN) and marks it never written.
void static_shared(void* p, size_t bytes, const char* name, const char* file, int line) {
  if (!g_kinds || g_thread < 0) return;
  const char* c = static_cast<const char*>(p);
  Region* r = nullptr;
  for (Region* s : g_statics)
    if (s->user == c) r = s;
  if (!r) {
    r = new Region();
    r->lo = r->user = c;
    r->hi = c + bytes;
    r->bytes = bytes;
    r->space = Space::StaticShared;
    r->name = name;
    r->file = file;
    r->line = line;
    g_statics.push_back(r);
    g_last = nullptr;
  }
  if (r->poisoned_block == g_serial) return;
  r->poisoned_block = g_serial;
  if (g_kinds & kUninit) {
    memset(p, 0xff, bytes);
    r->written.assign(bytes, 0);
  }
}

void async_issued(void* dst, size_t bytes, const void* pc) {
  if (g_thread < 0 || !(g_kinds & kRace)) return;
  Region* r = find(static_cast<const char*>(dst));
  if (r) check_access(*r, static_cast<const char*>(dst), bytes, true, false, pc, false, false);
}

void async_landed(void* dst, const void* src, size_t bytes, size_t zfill, const void* pc) {
  if (g_thread < 0) return;
  if (bytes > zfill) access(src, bytes - zfill, false, false, pc);
  access(dst, bytes, true, false, pc);
}

}  // namespace check
}  // namespace nz_emu

// ============================================================================================
// the hooks GCC's -fsanitize=thread instrumentation calls (its runtime library is not linked)
using nz_emu::check::g_thread;
#define NZ_HOOK(name, n, write, aligned)                                                         \
  extern "C" void name(void* p) {                                                                \
    if (g_thread >= 0) nz_emu::check::access(p, n, write, aligned, __builtin_return_address(0)); \
  }
NZ_HOOK(__tsan_read1, 1, false, true)
NZ_HOOK(__tsan_read2, 2, false, true)
NZ_HOOK(__tsan_read4, 4, false, true)
NZ_HOOK(__tsan_read8, 8, false, true)
NZ_HOOK(__tsan_read16, 16, false, true)
NZ_HOOK(__tsan_write1, 1, true, true)
NZ_HOOK(__tsan_write2, 2, true, true)
NZ_HOOK(__tsan_write4, 4, true, true)
NZ_HOOK(__tsan_write8, 8, true, true)
NZ_HOOK(__tsan_write16, 16, true, true)
NZ_HOOK(__tsan_unaligned_read2, 2, false, false)
NZ_HOOK(__tsan_unaligned_read4, 4, false, false)
NZ_HOOK(__tsan_unaligned_read8, 8, false, false)
NZ_HOOK(__tsan_unaligned_read16, 16, false, false)
NZ_HOOK(__tsan_unaligned_write2, 2, true, false)
NZ_HOOK(__tsan_unaligned_write4, 4, true, false)
NZ_HOOK(__tsan_unaligned_write8, 8, true, false)
NZ_HOOK(__tsan_unaligned_write16, 16, true, false)
NZ_HOOK(__tsan_volatile_read1, 1, false, true)
NZ_HOOK(__tsan_volatile_read2, 2, false, true)
NZ_HOOK(__tsan_volatile_read4, 4, false, true)
NZ_HOOK(__tsan_volatile_read8, 8, false, true)
NZ_HOOK(__tsan_volatile_write1, 1, true, true)
NZ_HOOK(__tsan_volatile_write2, 2, true, true)
NZ_HOOK(__tsan_volatile_write4, 4, true, true)
NZ_HOOK(__tsan_volatile_write8, 8, true, true)
#undef NZ_HOOK
extern "C" void __tsan_read_range(void* p, unsigned long n) {
  if (g_thread >= 0) nz_emu::check::access(p, n, false, false, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void* p, unsigned long n) {
  if (g_thread >= 0) nz_emu::check::access(p, n, true, false, __builtin_return_address(0));
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
// Atomics (guard variables of function-local statics, std::atomic in host code): performed as
// asked, not checked.
extern "C" unsigned char __tsan_atomic8_load(const volatile unsigned char* a, int mo) { return __atomic_load_n(a, mo); }
extern "C" unsigned int __tsan_atomic32_load(const volatile unsigned int* a, int mo) { return __atomic_load_n(a, mo); }
extern "C" unsigned long __tsan_atomic64_load(const volatile unsigned long* a, int mo) {
  return __atomic_load_n(a, mo);
}
extern "C" void __tsan_atomic8_store(volatile unsigned char* a, unsigned char v, int mo) { __atomic_store_n(a, v, mo); }
extern "C" void __tsan_atomic32_store(volatile unsigned int* a, unsigned int v, int mo) { __atomic_store_n(a, v, mo); }
extern "C" void __tsan_atomic64_store(volatile unsigned long* a, unsigned long v, int mo) {
  __atomic_store_n(a, v, mo);
}
extern "C" unsigned int __tsan_atomic32_fetch_add(volatile unsigned int* a, unsigned int v, int mo) {
  return __atomic_fetch_add(a, v, mo);
}
extern "C" unsigned long __tsan_atomic64_fetch_add(volatile unsigned long* a, unsigned long v, int mo) {
  return __atomic_fetch_add(a, v, mo);
}
extern "C" unsigned int __tsan_atomic32_fetch_sub(volatile unsigned int* a, unsigned int v, int mo) {
  return __atomic_fetch_sub(a, v, mo);
}
extern "C" unsigned long __tsan_atomic64_fetch_sub(volatile unsigned long* a, unsigned long v, int mo) {
  return __atomic_fetch_sub(a, v, mo);
}
extern "C" void __tsan_atomic_thread_fence(int mo) { __atomic_thread_fence(mo); }
extern "C" void __tsan_atomic_signal_fence(int mo) { __atomic_signal_fence(mo); }
