// streams.cpp — nz_emu's stream-order check (streams.h says what it checks and how).
//
// Timelines: the legacy default stream (0), each stream made by cudaStreamCreate*, and each host
// thread that calls the runtime. Each has a vector clock: entry t is how many operations of
// timeline t it is ordered after. An operation is (its timeline, its number there); it is ordered
// before whatever holds a clock with at least that number at its timeline.
#include "streams.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "check.h"

namespace nz_emu {
namespace streams {

namespace {

using Clock = std::vector<uint32_t>;

struct Timeline {
  std::string name;
  Clock clock;
  bool stream = true;     // false: a host thread
  bool blocking = false;  // a stream that waits for (and is waited for by) the legacy default stream
};
std::vector<Timeline> g_timelines = {{"the default stream", {}, true, false}};
std::map<const void*, int> g_stream_timeline;  // cudaStream_t -> timeline
int g_streams_made = 0;
thread_local int t_host = -1;

struct Op {
  int timeline;
  uint32_t number;
  std::string name;  // "kernel gelu_forward_kernel on stream 2"
};
std::vector<Op> g_ops(1);  // op 0: none
uint32_t g_current = 0;    // the operation running now
std::map<const void*, Clock> g_events;

uint32_t at(const Clock& c, int t) { return size_t(t) < c.size() ? c[size_t(t)] : 0; }
void join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); i++) into[i] = std::max(into[i], from[i]);
}
bool ordered_before(uint32_t op, const Clock& c) { return at(c, g_ops[op].timeline) >= g_ops[op].number; }

int host_timeline() {
  if (t_host < 0) {
    static int hosts = 0;
    t_host = int(g_timelines.size());
    g_timelines.push_back({"host thread " + std::to_string(++hosts), {}, false, false});
  }
  return t_host;
}
Clock& host_clock() { return g_timelines[size_t(host_timeline())].clock; }

int timeline_of(cudaStream_t s) {
  if (!s) return 0;
  auto it = g_stream_timeline.find(s);
  return it == g_stream_timeline.end() ? 0 : it->second;
}

// What queuing on timeline t from the calling host thread orders it after: the host's view, and
// for the legacy stream and blocking streams, each other's queued work.
void queue_on(int t) {
  const Clock& host = host_clock();  // first: a new host thread's timeline may grow the vector
  join(g_timelines[size_t(t)].clock, host);
  if (t == 0) {
    for (size_t i = 1; i < g_timelines.size(); i++)
      if (g_timelines[i].blocking) join(g_timelines[0].clock, g_timelines[i].clock);
  } else if (g_timelines[size_t(t)].blocking) {
    join(g_timelines[size_t(t)].clock, g_timelines[0].clock);
  }
}

// ---- memory -------------------------------------------------------------------------------
// Per byte: the last operation that wrote it, and up to three that read it since.
struct Cell {
  uint32_t w, r[3];
};
constexpr size_t kShadowPage = 1024;

struct Pending {  // an operation on pinned memory the host has not yet seen completed
  size_t lo, hi;
  uint32_t op;
  bool write;
};

struct Region {
  const char* lo = nullptr;
  size_t bytes = 0;
  bool pinned = false;
  size_t mapped = 0;  // pinned: the mapping's bytes (whole pages)
  std::vector<Cell*> pages;
  std::vector<Pending> pending;
  bool touched = false;  // pinned: the running operation added pending entries
};
std::map<const char*, Region> g_regions;
Region* g_last = nullptr;
std::vector<Region*> g_touched;
int g_open = 0;  // pinned_open depth

size_t page_bytes() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

Region* region_of(const char* c) {
  if (g_last && c >= g_last->lo && c < g_last->lo + g_last->bytes) return g_last;
  auto it = g_regions.upper_bound(c);
  if (it == g_regions.begin()) return nullptr;
  --it;
  if (c >= it->first && c < it->first + it->second.bytes) return g_last = &it->second;
  return nullptr;
}

Cell& cell(Region& r, size_t off) {
  if (r.pages.empty()) r.pages.assign((r.bytes + kShadowPage - 1) / kShadowPage, nullptr);
  Cell*& p = r.pages[off / kShadowPage];
  if (!p) p = new Cell[kShadowPage]();
  return p[off % kShadowPage];
}

std::string place(const Region& r, size_t off) {
  char s[128];
  snprintf(s, sizeof(s), "byte %zu of a %zu-byte %s buffer", off, r.bytes, r.pinned ? "pinned host" : "device");
  return s;
}

void report(const char* kind, const Region& r, size_t off, uint32_t earlier, bool write) {
  const std::string key = std::string(kind) + "|" + g_ops[g_current].name + "|" + g_ops[earlier].name;
  check::finding("stream-race", key.c_str(),
                 "%s on %s: %s %s it; %s %s it, and nothing orders the two (an event recorded after the one "
                 "and waited for before the other, or a synchronisation of the host between them)",
                 kind, place(r, off).c_str(), g_ops[g_current].name.c_str(), write ? "writes" : "reads",
                 g_ops[earlier].name.c_str(), std::string(kind).find("after-write") != std::string::npos ? "wrote" : "read");
}

// The running operation's access to [off, off + n) of r
void access(Region& r, size_t off, size_t n, bool write) {
  const uint32_t me = g_current;
  const Clock& now = g_timelines[size_t(g_ops[me].timeline)].clock;
  if (off + n > r.bytes) n = r.bytes - off;
  bool reported = false;
  for (size_t i = 0; i < n; i++) {
    Cell& c = cell(r, off + i);
    if (!reported && c.w && c.w != me && !ordered_before(c.w, now)) {
      report(write ? "write-after-write" : "read-after-write", r, off + i, c.w, write);
      reported = true;
    }
    if (write) {
      for (uint32_t rd : c.r)
        if (!reported && rd && rd != me && !ordered_before(rd, now)) {
          report("write-after-read", r, off + i, rd, write);
          reported = true;
        }
      c.w = me;
      c.r[0] = c.r[1] = c.r[2] = 0;
    } else if (c.r[0] != me && c.r[1] != me && c.r[2] != me) {
      // A slot that is free or holds a read ordered before this one (a later write ordered after
      // this read is ordered after that one too); else the oldest reader is forgotten.
      int k = 2;
      for (int j = 0; j < 3; j++)
        if (!c.r[j] || ordered_before(c.r[j], now)) {
          k = j;
          break;
        }
      c.r[k] = me;
    }
  }
  if (r.pinned) {
    r.pending.push_back({off, off + n, me, write});
    if (!r.touched) g_touched.push_back(&r), r.touched = true;
  }
}

void op_access(const void* p, size_t bytes, bool write) {
  if (!g_current || bytes == 0) return;
  const char* c = static_cast<const char*>(p);
  Region* r = region_of(c);
  if (r) access(*r, size_t(c - r->lo), bytes, write);
}

// Pinned pages: unreadable while an operation that writes them is pending for the host,
// read-only while one reads them, open otherwise (or while the emulator itself copies).
void protect(Region& r) {
  if (g_open > 0) return;
  const size_t page = page_bytes(), pages = r.mapped / page;
  std::vector<int> prot(pages, PROT_READ | PROT_WRITE);
  for (const Pending& p : r.pending)
    for (size_t i = p.lo / page; i < pages && i * page < p.hi; i++)
      prot[i] = p.write ? PROT_NONE : (prot[i] & PROT_READ);
  for (size_t i = 0; i < pages;) {
    size_t j = i;
    while (j < pages && prot[j] == prot[i]) j++;
    mprotect(const_cast<char*>(r.lo) + i * page, (j - i) * page, prot[i]);
    i = j;
  }
}

// The host has seen more: drop the pending operations now ordered before it.
void host_advanced() {
  const Clock& h = host_clock();
  for (auto& kv : g_regions) {
    Region& r = kv.second;
    if (!r.pinned || r.pending.empty()) continue;
    const size_t before = r.pending.size();
    r.pending.erase(std::remove_if(r.pending.begin(), r.pending.end(),
                                   [&](const Pending& p) { return ordered_before(p.op, h); }),
                    r.pending.end());
    if (r.pending.size() != before) protect(r);
  }
}

std::string stream_name(int t) { return g_timelines[size_t(t)].name; }

}  // namespace

bool on() { return (check::g_kinds & check::kStream) != 0; }

void stream_created(cudaStream_t s, unsigned flags) {
  if (!on()) return;
  const bool blocking = !(flags & cudaStreamNonBlocking);
  g_stream_timeline[s] = int(g_timelines.size());
  g_timelines.push_back({"stream " + std::to_string(++g_streams_made) + (blocking ? "" : " (non-blocking)"), {}, true,
                         blocking});
}

void event_recorded(cudaEvent_t e, cudaStream_t s) {
  if (!on()) return;
  const int t = timeline_of(s);
  queue_on(t);
  g_events[e] = g_timelines[size_t(t)].clock;
}

void event_destroyed(cudaEvent_t e) {
  if (on()) g_events.erase(e);
}

void stream_waits_event(cudaStream_t s, cudaEvent_t e) {
  if (!on()) return;
  const int t = timeline_of(s);
  queue_on(t);
  auto it = g_events.find(e);
  if (it != g_events.end()) join(g_timelines[size_t(t)].clock, it->second);  // never recorded: no wait
}

void host_waits_stream(cudaStream_t s) {
  if (!on()) return;
  Clock& host = host_clock();  // first, as in queue_on
  join(host, g_timelines[size_t(timeline_of(s))].clock);
  host_advanced();
}

void host_waits_event(cudaEvent_t e) {
  if (!on()) return;
  auto it = g_events.find(e);
  if (it != g_events.end()) join(host_clock(), it->second);
  host_advanced();
}

void host_waits_device() {
  if (!on()) return;
  Clock& h = host_clock();
  for (size_t i = 0; i < g_timelines.size(); i++)
    if (g_timelines[i].stream) join(h, g_timelines[i].clock);
  host_advanced();
}

void begin(cudaStream_t s, const char* what, const char* detail) {
  if (!on()) return;
  const int t = timeline_of(s);
  queue_on(t);
  Clock& c = g_timelines[size_t(t)].clock;
  if (c.size() <= size_t(t)) c.resize(size_t(t) + 1, 0);
  const uint32_t number = ++c[size_t(t)];
  std::string name = what;
  if (detail && *detail) name += std::string(" ") + detail;
  g_ops.push_back({t, number, name + " on " + stream_name(t)});
  g_current = uint32_t(g_ops.size() - 1);
}

void reads(const void* p, size_t bytes) { op_access(p, bytes, false); }
void writes(const void* p, size_t bytes) { op_access(p, bytes, true); }

void kernel_access(const void* p, size_t bytes, bool write) { op_access(p, bytes, write); }

void end() {
  if (!on()) return;
  for (Region* r : g_touched) {
    r->touched = false;
    protect(*r);
  }
  g_touched.clear();
  g_current = 0;
}

void device_allocated(const void* p, size_t bytes) {
  if (!on() || !p) return;
  Region r;
  r.lo = static_cast<const char*>(p);
  r.bytes = bytes;
  r.pinned = false;
  g_regions[r.lo] = r;
  g_last = nullptr;
}

void device_freed(const void* p) {
  if (!on()) return;
  auto it = g_regions.find(static_cast<const char*>(p));
  if (it == g_regions.end()) return;
  for (Cell* c : it->second.pages) delete[] c;
  g_regions.erase(it);
  g_last = nullptr;
}

void* pinned_allocate(size_t bytes) {
  if (!on()) return nullptr;
  const size_t page = page_bytes(), mapped = std::max(page, (bytes + page - 1) / page * page);
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  Region r;
  r.lo = static_cast<const char*>(p);
  r.bytes = bytes;
  r.pinned = true;
  r.mapped = mapped;
  g_regions[static_cast<const char*>(p)] = r;
  g_last = nullptr;
  return p;
}

bool pinned_free(void* p) {
  if (!on()) return false;
  auto it = g_regions.find(static_cast<const char*>(p));
  if (it == g_regions.end() || !it->second.pinned) return false;
  for (Cell* c : it->second.pages) delete[] c;
  munmap(p, it->second.mapped);
  g_regions.erase(it);
  g_last = nullptr;
  return true;
}

bool pinned(const void* p) {
  if (!on()) return false;
  Region* r = region_of(static_cast<const char*>(p));
  return r && r->pinned;
}

void pinned_open() {
  if (!on() || g_open++ > 0) return;
  for (auto& kv : g_regions)
    if (kv.second.pinned && !kv.second.pending.empty())
      mprotect(const_cast<char*>(kv.second.lo), kv.second.mapped, PROT_READ | PROT_WRITE);
}

void pinned_close() {
  if (!on() || --g_open > 0) return;
  for (auto& kv : g_regions)
    if (kv.second.pinned && !kv.second.pending.empty()) protect(kv.second);
}

bool host_fault(const void* addr) {
  if (!on()) return false;
  const char* a = static_cast<const char*>(addr);
  Region* r = nullptr;
  for (auto& kv : g_regions)
    if (kv.second.pinned && a >= kv.first && a < kv.first + kv.second.mapped) r = &kv.second;
  if (!r) return false;
  const size_t off = size_t(a - r->lo), page = page_bytes(), first = off / page * page;
  // The operation pending on that very byte (a page may also hold bytes nobody is copying)
  for (const Pending& p : r->pending) {
    if (off < p.lo || off >= p.hi) continue;
    const std::string key = "host|" + g_ops[p.op].name;
    check::finding("stream-race", key.c_str(),
                   "%s on %s: %s accesses it while %s, which %s it, is not ordered before the host (no "
                   "cudaStreamSynchronize, cudaEventSynchronize or cudaDeviceSynchronize after it)",
                   p.write ? "host access after a write" : "host write after a read", place(*r, off).c_str(),
                   g_timelines[size_t(host_timeline())].name.c_str(), g_ops[p.op].name.c_str(),
                   p.write ? "writes" : "reads");
    break;
  }
  // Let the access go on: the page open, and what was pending on it forgotten.
  r->pending.erase(std::remove_if(r->pending.begin(), r->pending.end(),
                                  [&](const Pending& p) { return p.lo < first + page && p.hi > first; }),
                   r->pending.end());
  mprotect(const_cast<char*>(r->lo) + first, page, PROT_READ | PROT_WRITE);
  return true;
}

unsigned long long operations() { return g_ops.size() - 1; }

}  // namespace streams
}  // namespace nz_emu
