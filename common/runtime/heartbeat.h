// heartbeat.h — a piece of work is done: the progress that the watchdog (watchdog.h) watches for.
// The work itself calls heartbeat() as each small piece of it completes (a unit's forward or
// backward, an optimizer unit, a chunk of a file written); the watchdog's thread reads the count
// and the time of the last one. On its own floor so that everything can beat without knowing
// the watchdog or the ranks it watches.
#pragma once
#include <cstdint>

namespace nz {

// A piece of work is done: this rank is alive and getting somewhere. Cheap (a clock read and two
// atomic operations), callable from any thread, with or without a watchdog. Never call it while waiting
// for another rank (in a collective): waiting is not progress.
void heartbeat();

// This process's heartbeats so far, and the time of the last (monotonic_s's clock).
uint64_t heartbeat_count();
double last_heartbeat_s();

// Seconds on CLOCK_MONOTONIC: one clock per machine, shared by the processes on it.
double monotonic_s();

}  // namespace nz
