// exercise_support.cpp — linked into every trainer the exercise grader builds (scripts/exercises.py),
// never into the real ones. When the learner's trainer dies, it says where: on a fatal signal
// (a segmentation fault, glibc's abort on a corrupted heap) and when the job is aborted through
// MPI_Abort (every NZ_CHECK that fails: a slice past its buffer's end, a released unit used), it
// prints the call stack as "nz_grader: frame <file> +0x<offset>" lines on stderr. The grader turns
// them into lines of the learner's file with addr2line (the learner's code is compiled with -g).
#include <dlfcn.h>     // dladdr
#include <execinfo.h>  // backtrace
#include <mpi.h>       // PMPI_Abort: MPI's own MPI_Abort, under its profiling name
#include <signal.h>
#include <unistd.h>    // write

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

int g_rank = -1;

void say(const char* s) { (void)!write(2, s, strlen(s)); }

// The stack of this thread, one line per frame: the object file and the offset in it (what
// addr2line takes for a position-independent executable). A return address points after its call:
// 1 is taken off each caller's so that the line found is the call's.
void print_stack(const char* why) {
  char line[1024];
  snprintf(line, sizeof line, "nz_grader: rank %d: %s\n", g_rank, why);
  say(line);
  void* frames[64];
  const int n = backtrace(frames, 64);
  for (int i = 1; i < n; i++) {  // (0 is print_stack itself)
    Dl_info info;
    uintptr_t at = uintptr_t(frames[i]) - (i > 1 ? 1 : 0);
    if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
    snprintf(line, sizeof line, "nz_grader: frame %s +0x%lx\n", info.dli_fname,
             (unsigned long)(at - uintptr_t(info.dli_fbase)));
    say(line);
  }
}

void on_signal(int sig) {
  char why[64];
  snprintf(why, sizeof why, "signal %d (%s)", sig, strsignal(sig));
  print_stack(why);
  signal(sig, SIG_DFL);  // then die of it, as without this handler
  raise(sig);
}

__attribute__((constructor)) void install() {
  const char* r = getenv("PMI_RANK");  // set by the MPI launcher before main
  g_rank = r ? atoi(r) : 0;
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside a signal handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, on_signal);
}

}  // namespace

// fatal() (check.h) ends the job with MPI_Abort: the stack first.
extern "C" int MPI_Abort(MPI_Comm comm, int code) {
  print_stack("MPI_Abort");
  return PMPI_Abort(comm, code);
}
