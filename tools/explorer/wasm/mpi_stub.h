// mpi_stub.h — <mpi.h> for the browser build of zero_estimate (tools/explorer, docs/explorer.md): a
// page has no MPI, and zero_estimate starts none. The build copies it to $(BUILD)/explorer/include/mpi.h
// (Makefile): in the tree it has a name of its own, so it is never taken for MPI's header. The library files it links (runtime/check.cpp, pipeline.cpp)
// include <mpi.h> for their multi-rank paths; here MPI is never initialized, so check.cpp's user_error()
// and fatal() take their single-process path (print the line, exit), and nothing else is reached.
#pragma once

typedef int MPI_Comm;
typedef int MPI_Request;
#define MPI_COMM_WORLD 0
#define MPI_COMM_NULL (-1)
#define MPI_REQUEST_NULL (-1)

inline int MPI_Initialized(int* flag) { return *flag = 0; }
inline int MPI_Finalized(int* flag) { return *flag = 0; }
int MPI_Init(int*, char***);
int MPI_Finalize(void);
int MPI_Abort(MPI_Comm, int);
int MPI_Comm_rank(MPI_Comm, int*);
int MPI_Comm_size(MPI_Comm, int*);
int MPI_Comm_split(MPI_Comm, int, int, MPI_Comm*);
