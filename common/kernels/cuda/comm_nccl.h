// comm_nccl.h — the NCCL collectives behind nz::Comm when every rank has its own GPU
// (comm_nccl.cu; plain C++ header, no CUDA or NCCL headers). Comm decides when to use them, keeps
// the comm ledger and the rank-ordered MPI path; these functions only move bytes.
//
// Communicators: the world's (init), and one per group of ranks that Comm splits off (split, as
// MPI_Comm_split splits the MPI one): the tensor groups, the data-parallel groups, ulysses' sequence
// groups. Every collective names the communicator it runs on.
//
// Streams: every kernel of this project runs on the default stream (the "compute stream"). NCCL
// runs on its own "comm stream", so that a gather started early (stage3's prefetch) overlaps the
// compute queued before it. Each call first makes the comm stream wait for the work already on
// the compute stream (its inputs are ready); join() makes the compute stream wait for everything
// issued on the comm stream so far (its outputs are ready for whatever is queued next).
// No call blocks the host. Every communicator shares the one comm stream: each rank issues its
// collectives in the same program order as the MPI path runs them one after the other, so one
// stream, run in issue order, cannot deadlock two communicators against each other.
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
// GPU it already selected: the world's communicator.
struct Communicator;  // one NCCL communicator (comm_nccl.cu)
void unique_id(char id[kUniqueIdBytes]);
Communicator* init(const char id[kUniqueIdBytes], int nranks, int rank);
// A group of parent's ranks: those passing the same color, ranked by key (ncclCommSplit: collective
// over the parent's ranks, the same rule as MPI_Comm_split, so a rank's NCCL rank in the group is
// its MPI rank there). `name` says which group in the messages ("tensor group").
Communicator* split(Communicator* parent, int color, int key, const char* name);
// Waits for the comm stream and destroys the communicator; the last one destroyed takes the stream.
void destroy(Communicator* c);

// Shapes as in comm.h: a "full" buffer is nranks * shard_elems elements, slice r belongs to rank r.
// Device pointers only. In place is allowed: out_shard / shard may be this rank's slice of full.
void reduce_scatter(Communicator* c, const void* full, void* out_shard, size_t shard_elems, DType dt);
void all_gather(Communicator* c, const void* shard, void* out_full, size_t shard_elems, DType dt);
void all_reduce(Communicator* c, void* buf, size_t elems, DType dt);
// Point to point (the pipeline's activations and their gradients): NCCL matches the sends and
// receives between two ranks in the order they are issued (there are no tags), and a send does not
// complete before its receive is posted. So a rank that must send and receive issues both inside
// one group (group_start .. group_end): NCCL runs them together, and two neighbours that both send
// first do not wait for each other forever.
void send(Communicator* c, const void* buf, size_t elems, DType dt, int peer);
void recv(Communicator* c, void* buf, size_t elems, DType dt, int peer);
void group_start();
void group_end(Communicator* c);  // the group's calls were on c
void join();  // the compute stream waits for every collective issued so far
// Before the host blocks on the GPU (a copy to the host, a synchronize; device.cpp calls it): wait
// for the collectives joined so far, ending the run with the collective's name on an NCCL
// asynchronous error on any communicator or after NZ_NCCL_TIMEOUT seconds (default 600), aborting
// every communicator. No-op without NCCL.
void wait_joined();

}  // namespace nccl
}  // namespace nz
