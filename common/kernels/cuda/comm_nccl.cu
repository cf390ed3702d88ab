// comm_nccl.cu — NCCL reduce-scatter, all-gather, all-reduce and send/recv on a dedicated comm stream,
// ordered against the compute (default) stream with events. See comm_nccl.h.
#include <cuda_runtime.h>  // cudaStream_t, cudaEvent_t
#include <nccl.h>          // ncclCommInitRankConfig, ncclCommSplit, ncclReduceScatter, ncclAllGather, ...

#include <algorithm>  // std::find
#include <chrono>   // steady_clock: the time limit of wait_joined
#include <cstdio>   // snprintf
#include <cstdlib>  // getenv, strtod
#include <cstring>  // memcpy
#include <thread>   // sleep_for
#include <vector>

#include "comm_nccl.h"
#include "cuda_check.h"  // NZ_CUDA_CHECK, nz::fatal

// Every communicator is non-blocking (created): any call on it may return ncclInProgress while NCCL
// finishes it in the background; settle() waits for that on communicator c (nullptr: a call on
// none, such as ncclGetUniqueId), so a call checked here is done.
#define NZ_NCCL_CHECK(c, call)                                                                \
  do {                                                                                        \
    ncclResult_t nz_res_ = settle(c, call, #call);                                            \
    if (nz_res_ != ncclSuccess)                                                               \
      ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) in %s", int(nz_res_),               \
                  ncclGetErrorString(nz_res_), #call);                                        \
  } while (0)

namespace nz {
namespace nccl {

// One NCCL communicator: the world's, or a group's. `on` names it in the messages: "" for the
// world, " on the tensor group" for a group.
struct Communicator {
  ncclComm_t comm = nullptr;
  char on[64] = "";
};

namespace {

std::vector<Communicator*> g_live;  // every communicator not yet destroyed: the watchdog polls each
cudaStream_t g_stream = nullptr;  // the comm stream, shared by every communicator (comm_nccl.h)
cudaEvent_t g_inputs_ready = nullptr, g_outputs_ready = nullptr;
// The last collective issued, and the last one the compute stream was joined to: the names a
// failure or a time-out reports (wait_joined).
long g_issued = 0;
char g_last_issued[160] = "none", g_last_joined[160] = "none";
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

// The run is about to end on an NCCL failure: every communicator is aborted, which releases the GPU
// from its collectives (a peer that died would otherwise hold them forever).
void abort_all() {
  for (Communicator* c : g_live) {
    ncclCommAbort(c->comm);
    delete c;
  }
  g_live.clear();
}

// A call on the non-blocking communicator c that returned ncclInProgress: poll c's state until NCCL
// has finished it (enqueueing a collective, a group), within NZ_NCCL_TIMEOUT.
ncclResult_t settle(Communicator* c, ncclResult_t r, const char* call) {
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress && c) {
    if (seconds_since(t0) > timeout_seconds()) {
      abort_all();
      ::nz::fatal(__FILE__, __LINE__, "NCCL %s%s still in progress after %.0f s: a rank has likely died or stopped. "
                  "HINT: look for a rank that failed first; NZ_NCCL_TIMEOUT=seconds changes the limit", call, c->on,
                  seconds_since(t0));
    }
    std::this_thread::yield();
    if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess) break;
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
void after_compute(Communicator* c, const char* op, size_t elems, DType dt) {
  NZ_CHECK(c != nullptr && g_stream != nullptr, "NCCL collective before nccl::init");
  NZ_CUDA_CHECK(cudaEventRecord(g_inputs_ready, 0));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(g_stream, g_inputs_ready, 0));
  snprintf(g_last_issued, sizeof g_last_issued, "%s #%ld%s (%zu %s elements)", op, ++g_issued, c->on, elems,
           dtype_name(dt));
}

// NZ_NCCL_INIT_TIMEOUT: seconds the creation of a communicator may take (default 120).
double init_timeout_seconds() {
  const char* env = getenv("NZ_NCCL_INIT_TIMEOUT");
  const double s = env ? strtod(env, nullptr) : 0.0;
  return s > 0 ? s : 120.0;
}

// The creation of c, started non-blocking (`state`: what the creating call returned), finished.
// Creation is collective over the ranks, and it can hang: a rank that never arrives, a network NCCL
// cannot reach (its bootstrap has no time limit of its own). So it is polled up to
// NZ_NCCL_INIT_TIMEOUT seconds, and then aborted with one line instead of a silent hang. `what`:
// the call and the rank, for that line.
Communicator* created(Communicator* c, ncclResult_t state, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  while (state == ncclInProgress) {
    if (seconds_since(t0) > init_timeout_seconds()) {
      ncclCommAbort(c->comm);
      abort_all();
      ::nz::fatal(__FILE__, __LINE__,
                  "NCCL communicator creation (%s) has not completed after %.0f s: a rank did not start or NCCL "
                  "cannot reach the others. HINT: check that every rank runs and sees its GPU (NCCL_DEBUG=INFO "
                  "says where it waits), or run one process without mpirun (no NCCL); NZ_NCCL_INIT_TIMEOUT=seconds "
                  "changes the limit", what, seconds_since(t0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclResult_t q = ncclCommGetAsyncError(c->comm, &state); q != ncclSuccess) state = q;
  }
  if (state != ncclSuccess) {
    if (c->comm) ncclCommAbort(c->comm);
    abort_all();
    ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) creating the communicator (%s)", int(state),
                ncclGetErrorString(state), what);
  }
  g_live.push_back(c);
  return c;
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
  NZ_NCCL_CHECK(nullptr, ncclGetUniqueId(&uid));
  memcpy(id, &uid, kUniqueIdBytes);
}

Communicator* init(const char id[kUniqueIdBytes], int nranks, int rank) {
  ncclUniqueId uid;
  memcpy(&uid, id, kUniqueIdBytes);
  // Non-blocking stream: it does not wait for the default stream implicitly, so collectives can
  // overlap compute; the events below order the two where it matters.
  NZ_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  NZ_CUDA_CHECK(cudaEventCreateWithFlags(&g_inputs_ready, cudaEventDisableTiming));
  NZ_CUDA_CHECK(cudaEventCreateWithFlags(&g_outputs_ready, cudaEventDisableTiming));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // creation polled with a time limit (created)
  Communicator* c = new Communicator;
  const ncclResult_t state = ncclCommInitRankConfig(&c->comm, nranks, uid, rank, &config);
  char what[96];
  snprintf(what, sizeof what, "ncclCommInitRankConfig, rank %d of %d", rank, nranks);
  return created(c, state, what);
}

// No new unique id and no MPI broadcast: NCCL splits over the parent's own connections. Every rank of
// the parent calls this (Comm's group constructor is collective over the parent too).
Communicator* split(Communicator* parent, int color, int key, const char* name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // as the world's: creation polled with a time limit
  Communicator* c = new Communicator;
  snprintf(c->on, sizeof c->on, " on the %s", name);
  const ncclResult_t state = ncclCommSplit(parent->comm, color, key, &c->comm, &config);
  char what[96];
  snprintf(what, sizeof what, "ncclCommSplit for the %s, color %d key %d", name, color, key);
  return created(c, state, what);
}

void destroy(Communicator* c) {
  if (!c) return;
  join();
  wait_joined();  // a failed peer ends here with a name, not in the synchronize below
  NZ_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  g_live.erase(std::find(g_live.begin(), g_live.end(), c));
  const ncclResult_t destroyed = ncclCommDestroy(c->comm);  // not settle(): the handle is gone after
  delete c;
  if (destroyed != ncclSuccess)
    ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) in ncclCommDestroy", int(destroyed),
                ncclGetErrorString(destroyed));
  if (!g_live.empty()) return;  // the stream and its events serve the communicators left
  NZ_CUDA_CHECK(cudaEventDestroy(g_inputs_ready));
  NZ_CUDA_CHECK(cudaEventDestroy(g_outputs_ready));
  NZ_CUDA_CHECK(cudaStreamDestroy(g_stream));
  g_stream = nullptr;
}

// recvcount = shard_elems; NCCL's in-place case is out_shard == full + rank * shard_elems.
void reduce_scatter(Communicator* c, const void* full, void* out_shard, size_t shard_elems, DType dt) {
  after_compute(c, "reduce-scatter", shard_elems, dt);
  NZ_NCCL_CHECK(c, ncclReduceScatter(full, out_shard, shard_elems, nccl_type(dt), ncclSum, c->comm, g_stream));
}

// sendcount = shard_elems; in place when shard == out_full + rank * shard_elems.
void all_gather(Communicator* c, const void* shard, void* out_full, size_t shard_elems, DType dt) {
  after_compute(c, "all-gather", shard_elems, dt);
  NZ_NCCL_CHECK(c, ncclAllGather(shard, out_full, shard_elems, nccl_type(dt), c->comm, g_stream));
}

void all_reduce(Communicator* c, void* buf, size_t elems, DType dt) {
  after_compute(c, "all-reduce", elems, dt);
  NZ_NCCL_CHECK(c, ncclAllReduce(buf, buf, elems, nccl_type(dt), ncclSum, c->comm, g_stream));
}

void send(Communicator* c, const void* buf, size_t elems, DType dt, int peer) {
  after_compute(c, "send", elems, dt);
  NZ_NCCL_CHECK(c, ncclSend(buf, elems, nccl_type(dt), peer, c->comm, g_stream));
}

void recv(Communicator* c, void* buf, size_t elems, DType dt, int peer) {
  after_compute(c, "recv", elems, dt);  // the buffer may still be read by kernels queued before
  NZ_NCCL_CHECK(c, ncclRecv(buf, elems, nccl_type(dt), peer, c->comm, g_stream));
}

void group_start() { NZ_NCCL_CHECK(nullptr, ncclGroupStart()); }
void group_end(Communicator* c) { NZ_NCCL_CHECK(c, ncclGroupEnd()); }

// The compute stream waits for every collective issued so far: kernels queued after this read
// their outputs. The host does not wait (copies to the host are on the compute stream too).
void join() {
  if (!g_stream) return;
  NZ_CUDA_CHECK(cudaEventRecord(g_outputs_ready, g_stream));
  NZ_CUDA_CHECK(cudaStreamWaitEvent(0, g_outputs_ready, 0));
  memcpy(g_last_joined, g_last_issued, sizeof g_last_joined);
  g_joined_pending = true;
}

// A collective whose peer has failed never completes: NCCL reports the failure only through
// ncclCommGetAsyncError, and a host blocked in cudaMemcpy or cudaDeviceSynchronize behind it would
// hang without a word. So before the host blocks on the GPU it waits here, polling, for the
// collectives the compute stream has joined (those its next copy waits for anyway: no extra
// serialisation), and ends the run naming the collective on an asynchronous error of any
// communicator (the collective it waits for may sit behind another communicator's on the comm
// stream) or after the time limit. When they are done already this costs one cudaEventQuery.
void wait_joined() {
  if (!g_stream || !g_joined_pending) return;
  const auto t0 = std::chrono::steady_clock::now();
  const double limit = timeout_seconds();
  for (;;) {
    const cudaError_t q = cudaEventQuery(g_outputs_ready);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) NZ_CUDA_CHECK(q);
    for (Communicator* c : g_live) {
      ncclResult_t async = ncclSuccess;
      NZ_NCCL_CHECK(c, ncclCommGetAsyncError(c->comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_all();  // releases the GPU from the collective; the run ends below
        ::nz::fatal(__FILE__, __LINE__, "NCCL error %d (%s) in %s (the last collective joined; last issued: %s)",
                    int(async), ncclGetErrorString(async), g_last_joined, g_last_issued);
      }
    }
    const double waited = seconds_since(t0);
    if (waited > limit) {
      abort_all();
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
