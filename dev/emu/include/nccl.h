// nccl.h — nz_emu: the NCCL calls nanoZeRO makes, over MPI_COMM_WORLD on the CPU
// (dev/emu/emu.cpp). Sums run along a ring as NCCL's do: the chunk that ends on rank r is summed
// starting from rank r+1, so the result is NOT the rank-ordered sum of the MPI path, and bf16 is
// rounded after every addition. ncclCommInitRank checks that every rank passed the same unique id
// (the MPI broadcast of the bootstrap worked); ncclCommSplit is MPI_Comm_split of its parent's ranks
// (the same colors and keys). ncclSend / ncclRecv are synchronous as NCCL's are
// (a send completes only once its receive is posted: MPI_Issend), and match in issue order between
// two ranks (no tags); inside ncclGroupStart .. ncclGroupEnd they run together at ncclGroupEnd, so a
// program that NCCL would deadlock deadlocks here too. NZ_EMU_NO_NCCL=1 makes any NCCL call fatal
// (a run that must make none); NZ_EMU_NCCL_STUCK=init a non-blocking creation that never
// completes. See cuda_runtime.h in this directory.
#pragma once
#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
struct nz_emu_nccl;
typedef nz_emu_nccl* ncclComm_t;
enum ncclResult_t { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 };
enum ncclDataType_t { ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum ncclRedOp_t { ncclSum = 0 };

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
// The one field of NCCL's ncclConfig_t used here: blocking = 0 makes creation non-blocking (the call
// returns ncclInProgress and ncclCommGetAsyncError says when the communicator is ready).
struct ncclConfig_t {
  int blocking;
};
#define NCCL_CONFIG_INITIALIZER {1}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
// The ranks of comm passing the same color, ranked by key (ties: by rank in comm), as MPI_Comm_split.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
