// watchdog.h — a job that stops making progress ends, naming the rank that holds it up, instead of
// hanging.
//
// Progress means being alive, not finishing a phase in time: the work itself calls heartbeat() as
// each small piece of it completes (a unit's forward or backward, an optimizer unit, a chunk of a
// file written), so an evaluation of many windows or a long checkpoint write is slow, never stuck.
//
// Each rank publishes two heartbeats in a small shared-memory page: its *pulse*, refreshed ten
// times a second by a background thread (it stops only when the whole process stops: SIGSTOP, a
// frozen machine), and its *progress*: the time of its last heartbeat, with the phase and step it
// is in. A rank waiting in a collective makes no progress of its own, but while the peer it waits
// for still does, the job is alive. So the job is stuck when no rank has made progress for
// --watchdog seconds. Then every rank reads everyone's heartbeats: a rank whose pulse is stale
// (3 s old) stopped; otherwise the rank furthest behind (at the earliest step, with the fewest
// heartbeats in it: every rank does the same work) is the one holding the job up, and the others
// got further, then waited for it. A pulse neither fresh nor stale yet is waited for, so a rank
// stopped a moment before a short --watchdog runs out is named, not the live ranks waiting for it.
// The lowest live rank that is not the culprit prints one line naming it (if it cannot, the next
// one does, a second later), and every waiting rank exits (code 3), which makes mpirun end the
// rest. So a stuck job ends within --watchdog + 1 seconds of the last progress of any rank, a
// stopped one within max(--watchdog, 3) + 1 seconds. What has no heartbeat inside —
// one collective, one fsync, on a GPU the device work queued between two host waits — must fit
// in --watchdog.
//
// The heartbeat pages live in files that are unlinked as soon as every rank has opened them, so
// nothing is left behind. They need the ranks on one machine (shared memory): on several machines
// the watchdog is off, with a note.
#pragma once
#include <atomic>
#include <thread>

#include "runtime/heartbeat.h"  // heartbeat: what the watchdog watches for

namespace nz {

class Comm;

class Watchdog {
 public:
  Watchdog(Comm& comm, int seconds);  // collective
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // The training loop is at `phase` of `step` (0-based; -1 during set-up): a heartbeat, and what
  // the report says about this rank.
  void progress(int step, const char* phase);

  struct Beat;  // one rank's heartbeats (watchdog.cpp)

 private:
  void watch();
  void report(int culprit, bool stopped, double now);  // the one line naming the culprit
  int rank_ = 0, world_ = 1;
  double limit_s_;
  Beat* mine_ = nullptr;
  Beat** all_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace nz
