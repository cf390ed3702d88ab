// comm_nccl.cu — NCCL reduce-scatter, all-gather and all-reduce on a dedicated comm stream,
// ordered against the compute (default) stream with events. See comm_nccl.h.
#include <cuda_runtime.h>  // cudaStream_t, cudaEvent_t
#include <nccl.h>          // ncclCommInitRank, ncclReduceScatter, ncclAllGather, ncclAllReduce

#include <cstring>  // memcpy

#include "comm_nccl.h"
#include "cuda_check.h"  // NZ_CUDA_CHECK, nz::fatal

#define NZ_NCCL_CHECK(call)                                                                   \
  do {                                                                                        \
    ncclResult_t nz_res_ = (call);                                                            \
    if (nz_res_ != ncclSuccess)                                                               \
      ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) in %s", int(nz_res_),               \
                  ncclGetErrorString(nz_res_), #call);                                        \
  } while (0)

namespace nz {
namespace nccl {
namespace {

ncclComm_t g_comm = nullptr;
cudaStream_t g_stream = nullptr;  // the comm stream
cudaEvent_t g_inputs_ready = nullptr, g_outputs_ready = nullptr;

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;  // same bits as nz::bf16
    case DType::F16: return ncclFloat16;  // same bits as nz::f16 (__half)
    case DType::F64: return ncclFloat64;
  }
  return ncclFloat32;
}

// The comm stream waits for everything queued so far on the compute stream: the collective's
// inputs (a unit's gradient, an updated parameter slice) are written by kernels queued there.
void after_compute() {
  NZ_CHECK(g_comm != nullptr, "NCCL collective before nccl::init");
  NZ_CUDA_CHECK(cudaEventRecord(g_inputs_ready, 0));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(g_stream, g_inputs_ready, 0));
}

}  // namespace

bool compiled() { return true; }

void gpu_bus_id(char id[kBusIdBytes]) {
  int ordinal = 0;
  NZ_CUDA_CHECK(cudaGetDevice(&ordinal));
  NZ_CUDA_CHECK(cudaDeviceGetPCIBusId(id, int(kBusIdBytes), ordinal));
}

void unique_id(char id[kUniqueIdBytes]) {
  static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");
  ncclUniqueId uid;
  NZ_NCCL_CHECK(ncclGetUniqueId(&uid));
  memcpy(id, &uid, kUniqueIdBytes);
}

void init(const char id[kUniqueIdBytes], int nranks, int rank) {
  ncclUniqueId uid;
  memcpy(&uid, id, kUniqueIdBytes);
  // Non-blocking stream: it does not wait for the default stream implicitly, so collectives can
  // overlap compute; the events below order the two where it matters.
  NZ_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  NZ_CUDA_CHECK(cudaEventCreateWithFlags(&g_inputs_ready, cudaEventDisableTiming));
  NZ_CUDA_CHECK(cudaEventCreateWithFlags(&g_outputs_ready, cudaEventDisableTiming));
  NZ_NCCL_CHECK(ncclCommInitRank(&g_comm, nranks, uid, rank));  // collective over all ranks
}

void finalize() {
  if (!g_comm) return;
  NZ_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  NZ_NCCL_CHECK(ncclCommDestroy(g_comm));
  NZ_CUDA_CHECK(cudaEventDestroy(g_inputs_ready));
  NZ_CUDA_CHECK(cudaEventDestroy(g_outputs_ready));
  NZ_CUDA_CHECK(cudaStreamDestroy(g_stream));
  g_comm = nullptr;
}

// recvcount = shard_elems; NCCL's in-place case is out_shard == full + rank * shard_elems.
void reduce_scatter(const void* full, void* out_shard, size_t shard_elems, DType dt) {
  after_compute();
  NZ_NCCL_CHECK(ncclReduceScatter(full, out_shard, shard_elems, nccl_type(dt), ncclSum, g_comm, g_stream));
}

// sendcount = shard_elems; in place when shard == out_full + rank * shard_elems.
void all_gather(const void* shard, void* out_full, size_t shard_elems, DType dt) {
  after_compute();
  NZ_NCCL_CHECK(ncclAllGather(shard, out_full, shard_elems, nccl_type(dt), g_comm, g_stream));
}

void all_reduce(void* buf, size_t elems, DType dt) {
  after_compute();
  NZ_NCCL_CHECK(ncclAllReduce(buf, buf, elems, nccl_type(dt), ncclSum, g_comm, g_stream));
}

// The compute stream waits for every collective issued so far: kernels queued after this read
// their outputs. The host does not wait (copies to the host are on the compute stream too).
void join() {
  if (!g_comm) return;
  NZ_CUDA_CHECK(cudaEventRecord(g_outputs_ready, g_stream));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(0, g_outputs_ready, 0));
}

}  // namespace nccl
}  // namespace nz
