// check.cpp — fatal() for broken invariants, user_error() for bad input.
#include "runtime/check.h"

// MPI_Abort, MPI_Finalize, MPI_Initialized: the one file outside Comm that calls MPI itself. An
// error can stop the job from anywhere, before a Comm exists or with none at hand; these calls end
// processes and carry no data, so nothing here belongs in the comm ledger.
#include <mpi.h>

#include <unistd.h>  // usleep

#include <algorithm>  // std::min
#include <cstdarg>
#include <exception>  // std::set_terminate, std::current_exception
#include <new>        // std::bad_alloc
#include <string>

#include <atomic>

namespace nz {

namespace {
constexpr int kMaxCleanups = 8;
std::atomic<void (*)()> fatal_cleanups[kMaxCleanups];
std::atomic<int> n_fatal_cleanups{0};
}  // namespace

void at_fatal_exit(void (*cleanup)()) {
  const int i = n_fatal_cleanups.fetch_add(1);
  NZ_CHECK(i < kMaxCleanups, "at_fatal_exit: more than %d cleanups registered", kMaxCleanups);
  fatal_cleanups[i].store(cleanup);
}

// What the rooms registered with at_fatal_exit: fatal() and job_error() end the job with
// MPI_Abort, which runs no exit handlers.
static void run_fatal_cleanups() {
  const int cleanups = std::min(n_fatal_cleanups.load(), kMaxCleanups);
  for (int i = 0; i < cleanups; i++)
    if (void (*cleanup)() = fatal_cleanups[i].load()) cleanup();
}

void fatal(const char* file, int line, const char* fmt, ...) {
  // One write of the whole line: when every rank fails at once, the first MPI_Abort may end the
  // others mid-message, and a line written in pieces would be cut after its prefix.
  char msg[2048];
  int n = snprintf(msg, sizeof msg, "nanozero: internal error at %s:%d: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && size_t(n) < sizeof msg) vsnprintf(msg + n, sizeof msg - size_t(n), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
  run_fatal_cleanups();
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    // The launcher forwards each rank's stderr through a pipe; MPI_Abort has it kill the job, and
    // a line still in the pipe can be lost with it. A fifth of a second lets it through first.
    usleep(200 * 1000);
    MPI_Abort(MPI_COMM_WORLD, 1);  // take the other ranks down too: no hang
  }
  exit(1);
}

// Prints the line (if `speak`), then ends this rank with `code`.
[[noreturn]] static void user_error_v(bool speak, const char* fmt, va_list ap, int code = 2) {
  if (speak) {
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
  }
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();  // every rank validates the same input and exits the same way
  exit(code);  // (exit handlers remove any temporary file still being written: atomic_file.h)
}

// This rank's number while MPI is up, else 0 (an error before MPI_Init or after MPI_Finalize).
static int rank_if_running() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void user_error(const char* fmt, ...) {
  // Every rank checks the same input and reaches the same verdict: rank 0 says it once.
  va_list ap;
  va_start(ap, fmt);
  user_error_v(rank_if_running() == 0, fmt, ap);
}

void user_error_this_rank(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  user_error_v(true, fmt, ap);
}

void run_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  user_error_v(rank_if_running() == 0, fmt, ap, 1);
}

void job_error(const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "error: %s\n", msg);
  fflush(stderr);
  run_fatal_cleanups();
  int init = 0, fin = 0, size = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) {
    usleep(200 * 1000);  // as in fatal(): let the line through the launcher's pipe first
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (init && !fin) MPI_Finalize();
  exit(2);
}

// No exception from a library (oneDNN, the C++ library's streams and allocator, JSON parsing) ever
// reaches std::terminate's bare "terminate called after throwing ..." and an abort: whatever
// escapes a program's main becomes one line and a clean end of the job, through fatal(). Installed
// before main by this file's static initialiser; every program links this file.
[[noreturn]] static void on_uncaught_exception() {
  const char* what = "an unknown exception";
  std::string text;
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      what = "out of memory (std::bad_alloc): use a smaller model, batch or --seq, or more ranks";
    } catch (const std::exception& x) {
      text = x.what();
      what = text.c_str();
    } catch (...) {
    }
  } else {
    what = "std::terminate called with no exception";
  }
  fatal(__FILE__, __LINE__, "uncaught exception: %s", what);
}

[[maybe_unused]] static const bool terminate_handler_installed = [] {
  std::set_terminate(on_uncaught_exception);
  return true;
}();

// Line-buffered stdout, unbuffered stderr, before main (and before anything is printed): a
// process killed at a time limit with its output redirected to a file (the GPU check's rows, a
// batch job) would otherwise lose the last few kilobytes of finished lines still in the buffer.
[[maybe_unused]] static const bool output_line_buffered = [] {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  setvbuf(stderr, nullptr, _IONBF, 0);
  return true;
}();

std::string fmt_bytes(double b) {
  char buf[32];
  if (b >= 1e9) snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else if (b >= 1e3) snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  else snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

}  // namespace nz
