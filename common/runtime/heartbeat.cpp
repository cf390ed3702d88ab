// heartbeat.cpp — this process's heartbeats: a count and the time of the last (heartbeat.h).
#include "runtime/heartbeat.h"

#include <time.h>  // clock_gettime

#include <atomic>

namespace nz {

namespace {
// The work writes them; the watchdog's thread copies them into its shared page once a tick, so a
// heartbeat costs a clock read and two atomic operations.
std::atomic<uint64_t> g_beats{0};
std::atomic<double> g_last_beat_s{0};
}  // namespace

double monotonic_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void heartbeat() {
  g_beats.fetch_add(1, std::memory_order_relaxed);
  g_last_beat_s.store(monotonic_s(), std::memory_order_relaxed);
}

uint64_t heartbeat_count() { return g_beats.load(std::memory_order_relaxed); }
double last_heartbeat_s() { return g_last_beat_s.load(std::memory_order_relaxed); }

}  // namespace nz
