// check.h — fatal checks that name the file and line, one-line user errors, and the byte counts
// their messages print.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

namespace nz {
// Internal invariant broken: print where, and abort the whole job.
[[noreturn]] void fatal(const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
// Bad input from the user: one line (what, expected what, what to do), exit code 2. Every rank
// calls it on the same input; rank 0 prints the line.
[[noreturn]] void user_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// The same, printed by the calling rank whatever its number (a failure found on one rank only).
[[noreturn]] void user_error_this_rank(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// A run that trained but could not write what it was asked to (the model file, the report, any
// checkpoint): one line, exit code 1, not 2 (the input was fine, and a relaunch may succeed; what
// was written stays). Every rank calls it at the same point; rank 0 prints the line.
[[noreturn]] void run_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// A failure in the middle of a step that this rank alone sees (a NaN in the parameters it is about
// to quantize): this rank prints the one line, and the whole job ends with code 2 (MPI_Abort), so
// no rank waits in a collective for it.
[[noreturn]] void job_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Bytes for messages: "1.50 MB", "512 B".
std::string fmt_bytes(double bytes);
// Cleanup that fatal() and job_error() run before they end the job: MPI_Abort runs no exit
// handlers. Registered by the room that owns what is to be cleaned (io/atomic_file.cpp: unfinished
// temporary files); at most eight, safe to call from any thread before the first fatal().
void at_fatal_exit(void (*cleanup)());
}  // namespace nz

#define NZ_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) ::nz::fatal(__FILE__, __LINE__, __VA_ARGS__);     \
  } while (0)
