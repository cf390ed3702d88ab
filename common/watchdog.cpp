// watchdog.cpp — heartbeats in shared memory and the thread that watches them (watchdog.h).
#include "watchdog.h"

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap
#include <unistd.h>    // ftruncate, unlink, _exit

#include <algorithm>  // std::max
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>  // placement new: the Beat in its shared page
#include <string>
#include <vector>

#include "comm.h"  // Comm: rank, size, ranks on this machine

namespace nz {

// One rank's page, written by that rank (its work and its watching thread) and read by the others'
// watching threads, so every number is an atomic: lock-free ones, which work between processes
// through shared memory (each access is one plain load or store of the machine). Relaxed order: each
// field is read on its own. The phase's text is diagnostics only; a reader may see it mid-change.
struct Watchdog::Beat {
  std::atomic<double> pulse_s;     // the watching thread's last tick (CLOCK_MONOTONIC, one per machine)
  std::atomic<double> progress_s;  // this rank's last heartbeat, as of that tick
  std::atomic<uint64_t> beats;     // its heartbeats so far, as of that tick
  std::atomic<uint64_t> beats_at_step;  // ... when `step` began
  std::atomic<int> step;
  std::atomic<int> reported;       // this rank has printed the watchdog's line
  char phase[20];
};
static_assert(std::atomic<double>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int>::is_always_lock_free,
              "the watchdog shares its atomics between processes: they must be lock-free");

namespace {
// seconds: the watching thread's period (also how late a rank's progress is seen by the others);
// a pulse this old means a stopped process; a pulse this fresh a live one (between the two it is
// no evidence yet: a stopped rank, or a busy machine); how long each rank that may report waits for
// the one before it
constexpr double kTick = 0.1, kPulseStale = 3.0, kPulseFresh = 0.5, kSpeakerFirst = 1.0;
}  // namespace

Watchdog::Watchdog(Comm& comm, int seconds) : rank_(comm.rank()), world_(comm.size()), limit_s_(seconds) {
  if (comm.local_size() != comm.size()) {
    if (rank_ == 0) fprintf(stderr, "note: --watchdog is off: it needs every rank on one machine\n");
    return;
  }
  // Rank 0 makes a private directory; every rank maps a page there, then all of them are unlinked.
  char dir[256] = "";
  if (rank_ == 0) {
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/nanozero-watchdog.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) dir[0] = 0;
  }
  comm.control_broadcast(dir, sizeof dir);
  if (!dir[0]) return;  // no temporary directory: no watchdog
  auto path = [&](int r) { return std::string(dir) + "/rank." + std::to_string(r); };
  auto map = [&](int r, bool create) -> Beat* {
    int fd = open(path(r).c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDONLY, 0600);
    if (fd < 0) return nullptr;
    if (create && ftruncate(fd, sizeof(Beat)) != 0) return close(fd), nullptr;
    void* p = mmap(nullptr, sizeof(Beat), create ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    close(fd);  // the mapping keeps the page
    if (p == MAP_FAILED) return nullptr;
    return create ? new (p) Beat{} : static_cast<Beat*>(p);  // the owner constructs its page
  };
  mine_ = map(rank_, true);
  if (mine_) {
    heartbeat();
    mine_->pulse_s = mine_->progress_s = monotonic_s();
    mine_->beats = mine_->beats_at_step = heartbeat_count();
    mine_->step = -1;
    snprintf(mine_->phase, sizeof mine_->phase, "setup");
  }
  comm.control_barrier();
  all_ = new Beat*[world_];
  int ok = mine_ != nullptr;
  for (int r = 0; r < world_; r++) ok = (all_[r] = map(r, false)) && ok;
  const int all_ok = comm.control_min(ok);  // (also: everyone has opened them)
  if (rank_ == 0) {
    for (int r = 0; r < world_; r++) unlink(path(r).c_str());
    rmdir(dir);
  }
  if (!all_ok) {
    if (rank_ == 0) fprintf(stderr, "note: --watchdog is off: cannot share heartbeats in %s\n", dir);
    return;
  }
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (all_)
    for (int r = 0; r < world_; r++)
      if (all_[r]) munmap(all_[r], sizeof(Beat));
  delete[] all_;
  if (mine_) munmap(mine_, sizeof(Beat));
}

void Watchdog::progress(int step, const char* phase) {
  if (mine_ && step != mine_->step) {
    mine_->beats_at_step = heartbeat_count();
    mine_->step = step;
  }
  heartbeat();
  if (mine_) snprintf(mine_->phase, sizeof mine_->phase, "%s", phase);
}

// One line, printed once: the live ranks other than the culprit may each print it, lowest first,
// each waiting kSpeakerFirst for the one before it (which may itself have been stopped since), and
// any rank that sees the line printed leaves. A rank alone prints its own line.
void Watchdog::report(int culprit, bool stopped, double now) {
  std::vector<int> speakers;
  for (int r = 0; r < world_; r++)
    if (r == rank_ || (r != culprit && now - all_[r]->pulse_s <= kPulseFresh)) speakers.push_back(r);
  if (world_ > 1 && rank_ == culprit) speakers.erase(std::find(speakers.begin(), speakers.end(), rank_));
  const size_t turn = std::find(speakers.begin(), speakers.end(), rank_) - speakers.begin();  // size(): none
  auto someone_reported = [&] {
    for (int r = 0; r < world_; r++)
      if (all_[r]->reported) return true;
    return false;
  };
  for (double waited = 0; waited < kSpeakerFirst * double(turn) && !someone_reported(); waited += kTick) {
    mine_->pulse_s = monotonic_s();  // still alive while it waits
    usleep(useconds_t(kTick * 1e6));
  }
  if (turn == speakers.size() || someone_reported()) return;
  const Beat& b = *all_[culprit];
  char where[64];
  if (b.step >= 0) snprintf(where, sizeof where, "in phase '%.20s' of step %d", b.phase, b.step + 1);
  else snprintf(where, sizeof where, "during set-up");
  fprintf(stderr,
          "error: watchdog: rank %d %s (last progress %.0f s ago, %s); no rank has made progress for %g s "
          "(--watchdog), so the job ends\n",
          culprit, stopped ? "stopped responding: it is suspended or frozen" : "has made no progress",
          now - b.progress_s, where, limit_s_);
  fflush(stderr);
  mine_->reported = 1;
}

void Watchdog::watch() {
  while (!stop_) {
    usleep(useconds_t(kTick * 1e6));
    const double now = monotonic_s();
    mine_->pulse_s = now;
    mine_->beats = heartbeat_count();
    mine_->progress_s = last_heartbeat_s();
    // The job is alive while any rank makes progress: waiting in a collective for a rank that is
    // slow but alive is not being stuck.
    double newest = 0;
    for (int r = 0; r < world_; r++) newest = std::max(newest, double(all_[r]->progress_s));
    if (now - newest <= limit_s_) continue;
    // No rank has made progress for the limit: find who holds the job up. A stopped process first
    // (no pulse). A pulse neither fresh nor stale yet is waited for: with a --watchdog under
    // kPulseStale, a rank stopped a moment ago still looks alive, and the live ranks behind it
    // would be named instead. So a stopped rank ends the job after max(--watchdog, kPulseStale).
    int culprit = -1;
    bool undecided = false;
    for (int r = 0; r < world_; r++) {
      const double age = now - all_[r]->pulse_s;
      if (age > kPulseStale && culprit < 0) culprit = r;
      else if (age > kPulseFresh) undecided = true;
    }
    if (culprit < 0 && undecided) continue;
    const bool stopped = culprit >= 0;
    // Else the rank furthest behind: every rank does the same work, heartbeat for heartbeat, so the
    // one at the earliest step with the fewest heartbeats in it is where the others wait (the last
    // heartbeat's time alone cannot tell: the ranks run milliseconds apart).
    if (!stopped) {
      auto behind = [](const Beat& a, const Beat& b) {  // a is behind b
        const uint64_t in_a = a.beats - a.beats_at_step, in_b = b.beats - b.beats_at_step;
        if (a.step != b.step) return a.step < b.step;
        if (in_a != in_b) return in_a < in_b;
        return a.progress_s < b.progress_s;
      };
      culprit = 0;
      for (int r = 1; r < world_; r++)
        if (behind(*all_[r], *all_[culprit])) culprit = r;
    }
    report(culprit, stopped, now);
    _exit(3);  // mpirun sees a rank fail and ends the others, the stopped one included
  }
}

}  // namespace nz
