// comm_nccl.cu — NCCL reduce-scatter, all-gather, all-reduce and send/recv on a dedicated comm stream,
// ordered against the compute (default) stream with events. See comm_nccl.h.
#include <cuda_runtime.h>  // cudaStream_t, cudaEvent_t
#include <nccl.h>          // ncclCommInitRank, ncclReduceScatter, ncclAllGather, ncclAllReduce, ncclSend

#include <chrono>   // steady_clock: the time limit of wait_joined
#include <cstdio>   // snprintf
#include <cstdlib>  // getenv, strtod
#include <cstring>  // memcpy
#include <thread>   // sleep_for

#include "comm_nccl.h"
#include "cuda_check.h"  // NZ_CUDA_CHECK, nz::fatal

// The communicator is non-blocking (init): any call on it may return ncclInProgress while NCCL
// finishes it in the background; settle() waits for that, so a call checked here is done.
#define NZ_NCCL_CHECK(call)                                                                   \
  do {                                                                                        \
    ncclResult_t nz_res_ = settle(call, #call);                                               \
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
// The last collective issued, and the last one the compute stream was joined to: the names a
// failure or a time-out reports (wait_joined).
long g_issued = 0;
char g_last_issued[96] = "none", g_last_joined[96] = "none";
bool g_joined_pending = false;  // outputs_ready recorded and not yet seen complete by the host

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// NZ_NCCL_TIMEOUT: seconds a joined collective may take before the run is ended (default 600).
double timeout_seconds() {
  const char* env = getenv("NZ_NCCL_TIMEOUT");
  const double s = env ? strtod(env, nullptr) : 0.0;
  return s > 0 ? s : 600.0;
}

// A call on the non-blocking communicator that returned ncclInProgress: poll its state until NCCL
// has finished it (enqueueing a collective, a group), within NZ_NCCL_TIMEOUT.
ncclResult_t settle(ncclResult_t r, const char* call) {
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress && g_comm) {
    if (seconds_since(t0) > timeout_seconds()) {
      ncclCommAbort(g_comm);
      g_comm = nullptr;
      ::nz::fatal(__FILE__, __LINE__, "NCCL %s still in progress after %.0f s: a rank has likely died or stopped. "
                  "HINT: look for a rank that failed first; NZ_NCCL_TIMEOUT=seconds changes the limit", call,
                  seconds_since(t0));
    }
    std::this_thread::yield();
    if (ncclCommGetAsyncError(g_comm, &r) != ncclSuccess) break;
  }
  return r;
}

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
void after_compute(const char* op, size_t elems, DType dt) {
  NZ_CHECK(g_comm != nullptr, "NCCL collective before nccl::init");
  NZ_CUDA_CHECK(cudaEventRecord(g_inputs_ready, 0));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(g_stream, g_inputs_ready, 0));
  snprintf(g_last_issued, sizeof g_last_issued, "%s #%ld (%zu %s elements)", op, ++g_issued, elems,
           dt == DType::BF16 ? "bf16" : dt == DType::F64 ? "fp64" : "fp32");
}

// NZ_NCCL_INIT_TIMEOUT: seconds the creation of the communicator may take (default 120).
double init_timeout_seconds() {
  const char* env = getenv("NZ_NCCL_INIT_TIMEOUT");
  const double s = env ? strtod(env, nullptr) : 0.0;
  return s > 0 ? s : 120.0;
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
  // Collective over all ranks, and it can hang: a rank that never arrives, a network NCCL cannot
  // reach (its bootstrap has no time limit of its own). So creation is non-blocking, polled up to
  // NZ_NCCL_INIT_TIMEOUT seconds, and then aborted with one line instead of a silent hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t state = ncclCommInitRankConfig(&g_comm, nranks, uid, rank, &config);
  while (state == ncclInProgress) {
    if (seconds_since(t0) > init_timeout_seconds()) {
      ncclCommAbort(g_comm);
      g_comm = nullptr;
      ::nz::fatal(__FILE__, __LINE__,
                  "NCCL communicator creation (ncclCommInitRankConfig, rank %d of %d) has not completed after "
                  "%.0f s: a rank did not start or NCCL cannot reach the others. HINT: check that every rank "
                  "runs and sees its GPU (NCCL_DEBUG=INFO says where it waits), or run one process without "
                  "mpirun (no NCCL); NZ_NCCL_INIT_TIMEOUT=seconds changes the limit",
                  rank, nranks, seconds_since(t0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclResult_t q = ncclCommGetAsyncError(g_comm, &state); q != ncclSuccess) state = q;
  }
  if (state != ncclSuccess) {
    if (g_comm) ncclCommAbort(g_comm);
    g_comm = nullptr;
    ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) creating the communicator (rank %d of %d)", int(state),
                ncclGetErrorString(state), rank, nranks);
  }
}

void finalize() {
  if (!g_comm) return;
  join();
  wait_joined();  // a failed peer ends here with a name, not in the synchronize below
  NZ_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  const ncclResult_t destroyed = ncclCommDestroy(g_comm);  // not settle(): the handle is gone after
  g_comm = nullptr;
  if (destroyed != ncclSuccess)
    ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) in ncclCommDestroy", int(destroyed),
                ncclGetErrorString(destroyed));
  NZ_CUDA_CHECK(cudaEventDestroy(g_inputs_ready));
  NZ_CUDA_CHECK(cudaEventDestroy(g_outputs_ready));
  NZ_CUDA_CHECK(cudaStreamDestroy(g_stream));
  g_comm = nullptr;
}

// recvcount = shard_elems; NCCL's in-place case is out_shard == full + rank * shard_elems.
void reduce_scatter(const void* full, void* out_shard, size_t shard_elems, DType dt) {
  after_compute("reduce-scatter", shard_elems, dt);
  NZ_NCCL_CHECK(ncclReduceScatter(full, out_shard, shard_elems, nccl_type(dt), ncclSum, g_comm, g_stream));
}

// sendcount = shard_elems; in place when shard == out_full + rank * shard_elems.
void all_gather(const void* shard, void* out_full, size_t shard_elems, DType dt) {
  after_compute("all-gather", shard_elems, dt);
  NZ_NCCL_CHECK(ncclAllGather(shard, out_full, shard_elems, nccl_type(dt), g_comm, g_stream));
}

void all_reduce(void* buf, size_t elems, DType dt) {
  after_compute("all-reduce", elems, dt);
  NZ_NCCL_CHECK(ncclAllReduce(buf, buf, elems, nccl_type(dt), ncclSum, g_comm, g_stream));
}

void send(const void* buf, size_t elems, DType dt, int peer) {
  after_compute("send", elems, dt);
  NZ_NCCL_CHECK(ncclSend(buf, elems, nccl_type(dt), peer, g_comm, g_stream));
}

void recv(void* buf, size_t elems, DType dt, int peer) {
  after_compute("recv", elems, dt);  // the buffer may still be read by kernels queued before
  NZ_NCCL_CHECK(ncclRecv(buf, elems, nccl_type(dt), peer, g_comm, g_stream));
}

void group_start() { NZ_NCCL_CHECK(ncclGroupStart()); }
void group_end() { NZ_NCCL_CHECK(ncclGroupEnd()); }

// The compute stream waits for every collective issued so far: kernels queued after this read
// their outputs. The host does not wait (copies to the host are on the compute stream too).
void join() {
  if (!g_comm) return;
  NZ_CUDA_CHECK(cudaEventRecord(g_outputs_ready, g_stream));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(0, g_outputs_ready, 0));
  memcpy(g_last_joined, g_last_issued, sizeof g_last_joined);
  g_joined_pending = true;
}

// A collective whose peer has failed never completes: NCCL reports the failure only through
// ncclCommGetAsyncError, and a host blocked in cudaMemcpy or cudaDeviceSynchronize behind it would
// hang without a word. So before the host blocks on the GPU it waits here, polling, for the
// collectives the compute stream has joined (those its next copy waits for anyway: no extra
// serialisation), and ends the run naming the collective on an asynchronous error or after the
// time limit. When they are done already this costs one cudaEventQuery.
void wait_joined() {
  if (!g_comm || !g_joined_pending) return;
  const auto t0 = std::chrono::steady_clock::now();
  const double limit = timeout_seconds();
  for (;;) {
    const cudaError_t q = cudaEventQuery(g_outputs_ready);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) NZ_CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    NZ_NCCL_CHECK(ncclCommGetAsyncError(g_comm, &async));
    const double waited = seconds_since(t0);
    if (async != ncclSuccess && async != ncclInProgress) {
      ncclCommAbort(g_comm);  // releases the GPU from the collective; the run ends below
      g_comm = nullptr;
      ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) in %s (the last collective joined; last issued: %s)",
                  int(async), ncclGetErrorString(async), g_last_joined, g_last_issued);
    }
    if (waited > limit) {
      ncclCommAbort(g_comm);
      g_comm = nullptr;
      ::nz::fatal(__FILE__, __LINE__,
                  "NCCL %s has not completed after %.0f s: a rank has likely died or stopped (last issued: %s). "
                  "HINT: look for a rank that failed first; NZ_NCCL_TIMEOUT=seconds changes the limit",
                  g_last_joined, waited, g_last_issued);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  g_joined_pending = false;
}

}  // namespace nccl
}  // namespace nz
