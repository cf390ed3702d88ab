// watchdog.h — a job whose rank stops making progress ends, naming the rank, instead of hanging.
//
// Each rank publishes two heartbeats in a small shared-memory page: its *pulse*, refreshed every
// half second by a background thread (it stops only when the whole process stops: SIGSTOP, a
// frozen machine), and its *progress*, refreshed by the training loop at every phase of every
// step. When a rank's own progress has been stale for --watchdog seconds (it is waiting in a
// collective that never completes), it reads everyone's heartbeats: a rank whose pulse is stale
// stopped; otherwise the rank whose progress is oldest is the one holding the job up. The lowest
// rank that is not the culprit prints one line naming it, and every waiting rank exits (code 3),
// which makes mpirun end the rest. So a stuck job ends within --watchdog + 1 seconds of its last
// progress.
//
// The heartbeat pages live in files that are unlinked as soon as every rank has opened them, so
// nothing is left behind. They need the ranks on one machine (shared memory): on several machines
// the watchdog is off, with a note.
#pragma once
#include <atomic>
#include <thread>

#include "comm.h"

namespace nz {

class Watchdog {
 public:
  Watchdog(Comm& comm, int seconds);  // collective
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // The training loop made progress: it is at `phase` of `step` (0-based; -1 during set-up).
  void progress(int step, const char* phase);

  struct Beat;  // one rank's heartbeats (watchdog.cpp)

 private:
  void watch();
  int rank_ = 0, world_ = 1;
  double limit_s_;
  Beat* mine_ = nullptr;
  Beat** all_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace nz
