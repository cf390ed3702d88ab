// comm_nccl.h — the NCCL collectives behind nz::Comm when every rank has its own GPU
// (comm_nccl.cu; plain C++ header, no CUDA or NCCL headers). Comm decides when to use them, keeps
// the comm ledger and the rank-ordered MPI path; these functions only move bytes.
//
// Streams: every kernel of this project runs on the default stream (the "compute stream"). NCCL
// runs on its own "comm stream", so that a gather started early (stage3's prefetch) overlaps the
// compute queued before it. Each call first makes the comm stream wait for the work already on
// the compute stream (its inputs are ready); join() makes the compute stream wait for everything
// issued on the comm stream so far (its outputs are ready for whatever is queued next).
// No call blocks the host.
//
// Sums are NOT rank-ordered: NCCL adds along its rings and trees, in an order of its choosing, and
// rounds bf16 at every hop. So on NCCL the stages agree with stage0_ddp within a tolerance, not
// bit for bit (the MPI path keeps the bitwise guarantee).
#pragma once
#include <cstddef>

#include "kernels/dtype.h"  // nz::DType

namespace nz {
namespace nccl {

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
constexpr size_t kBusIdBytes = 32;

bool compiled();  // false in a build without CUDA (stubs in comm_backend.cpp)
// The PCI bus id of this rank's GPU ("0000:3b:00.0"): ranks whose ids are equal share a GPU,
// and NCCL cannot be used (it needs one GPU per rank).
void gpu_bus_id(char id[kBusIdBytes]);
// Rank 0 creates the id; the caller broadcasts it (over MPI); then every rank calls init on the
// GPU it already selected. One communicator per process.
void unique_id(char id[kUniqueIdBytes]);
void init(const char id[kUniqueIdBytes], int nranks, int rank);
void finalize();  // waits for the comm stream, destroys the communicator and the stream

// Shapes as in comm.h: a "full" buffer is nranks * shard_elems elements, slice r belongs to rank r.
// Device pointers only. In place is allowed: out_shard / shard may be this rank's slice of full.
void reduce_scatter(const void* full, void* out_shard, size_t shard_elems, DType dt);
void all_gather(const void* shard, void* out_full, size_t shard_elems, DType dt);
void all_reduce(void* buf, size_t elems, DType dt);
// Point to point (the pipeline's activations and their gradients): NCCL matches the sends and
// receives between two ranks in the order they are issued (there are no tags), and a send does not
// complete before its receive is posted. So a rank that must send and receive issues both inside
// one group (group_start .. group_end): NCCL runs them together, and two neighbours that both send
// first do not wait for each other forever.
void send(const void* buf, size_t elems, DType dt, int peer);
void recv(void* buf, size_t elems, DType dt, int peer);
void group_start();
void group_end();
void join();  // the compute stream waits for every collective issued so far
// Before the host blocks on the GPU (a copy to the host, a synchronize; device.cpp calls it): wait
// for the collectives joined so far, ending the run with the collective's name on an NCCL
// asynchronous error or after NZ_NCCL_TIMEOUT seconds (default 600). No-op without NCCL.
void wait_joined();

}  // namespace nccl
}  // namespace nz
