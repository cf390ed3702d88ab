// check.cpp — fatal() for broken invariants, user_error() for bad input.
#include "check.h"

#include <mpi.h>  // MPI_Abort, MPI_Initialized

#include <cstdarg>

namespace nz {

void fatal(const char* file, int line, const char* fmt, ...) {
  fprintf(stderr, "nanozero: internal error at %s:%d: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  fflush(stderr);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 1);  // take the other ranks down too: no hang
  exit(1);
}

void user_error(const char* fmt, ...) {
  fprintf(stderr, "error: ");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  fflush(stderr);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();  // every rank validates the same input and exits the same way
  exit(2);
}

}  // namespace nz
