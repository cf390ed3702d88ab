// comm.h — collectives over MPI (and NCCL on GPUs), each one counted in the comm ledger.
//
// Determinism: every reduction adds the contributions in rank order 0, 1, ..., N-1, for every
// element, whatever the collective. So all_reduce == reduce_scatter + all_gather bit for bit, and
// the ZeRO stages compute the same numbers as plain data parallelism (docs/stages.md, "Exactly the
// same model", says exactly when, with gradient accumulation).
//
// How reduce_scatter does it on MPI: one in-place all-to-all moves every rank's contribution to
// slice r onto rank r (each rank sends (N-1)/N of the buffer, the same volume as a ring), then
// rank r adds the N contributions itself, left to right. No extra buffer: the caller's bucket is
// the receive buffer.
//
// On the CUDA backend (use_device_backend): one rank alone makes no NCCL call and no host round
// trip (a sum over one rank is the value itself: a device copy when out of place). When every rank has its own GPU the buffers stay on
// the GPU and NCCL moves them (cuda/comm_nccl.h), a group's on an NCCL communicator of its own —
// NCCL does not add in rank order, so there the stages agree with stage0_ddp within a tolerance,
// not bit for bit. When ranks share a GPU (4 ranks
// on one GPU) the MPI path above runs unchanged on copies in pinned host memory, and stays bitwise.
// The comm ledger counts the same elements on either path.
//
// Buffer sizes are in elements of the given dtype. A "full" buffer is N * shard_elems elements;
// slice r is elements [r * shard_elems, (r + 1) * shard_elems).
//
// One class, three files: comm.cpp the collectives; comm_backend.cpp start-up and the choice of
// backend (which ranks share a GPU, NCCL or MPI, the pinned staging buffer); comm_stats.h/.cpp
// the comm ledger the collectives count into.
#pragma once
#include <mpi.h>  // MPI_Request

#include <cstddef>
#include <string>
#include <vector>

#include "comm_stats.h"  // CommStats, the comm ledger
#include "kernels/dtype.h"
#include "ledger.h"  // Buffer (the pinned staging copy of the MPI path on GPUs)

namespace nz {

namespace nccl {
struct Communicator;  // one NCCL communicator (kernels/cuda/comm_nccl.h)
}

// A non-blocking collective in flight (stage3's prefetch): an MPI request, or an NCCL call queued
// on the comm stream.
struct CommRequest {
  MPI_Request req = MPI_REQUEST_NULL;
  bool on_comm_stream = false;
  const void* gathering_into = nullptr;  // an all-gather's output, named in the activity log (ledger.h)
  int staged = -1;  // a send on the MPI path on GPUs: its pinned host copy (Comm's send staging)
  bool active() const { return req != MPI_REQUEST_NULL || on_comm_stream; }
};

// Waits for req; with sleep, a short spin and then sleeps between the polls (comm.cpp).
void wait_politely(MPI_Request* req, bool sleep);

class Comm {
 public:
  // MPI_Init once per process, then learn rank, size and the node-local rank.
  Comm(int* argc, char*** argv);
  // A group of the parent's ranks: those that pass the same `color`, ranked by `key` (MPI_Comm_split;
  // collective over the parent). Its collectives run over the group only, still summing in the
  // group's rank order on the MPI path, and are counted in the parent's comm ledger. When the
  // parent runs on NCCL (one GPU per rank), the group gets an NCCL communicator of its own, split
  // off the parent's (ncclCommSplit, the same colors and keys), and its collectives and sends run
  // on NCCL as the world's do; otherwise the group takes the parent's path. `name` says which group
  // in NCCL's messages (a collective that never completes: "all-reduce #12 on the tensor group").
  Comm(Comm& parent, int color, int key, const char* name = "group");
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Nodes, for the comm ledger's split of bytes inside a node and across nodes (ZeRO++, whose point
  // is to keep traffic off the slow links between nodes). By default the machines the ranks run on:
  // ranks with the same host name (MPI_Get_processor_name) share a node, numbered in rank order.
  // set_node_size(G) simulates nodes on one machine instead: ranks 0..G-1 are node 0, G..2G-1 node 1,
  // and so on. A group keeps its ranks' nodes.
  void set_node_size(int G);
  int host_nodes() const { return host_nodes_; }  // machines the ranks of the world run on
  // The ranks per machine when every machine runs as many and its ranks are consecutive (ranks 0..G-1
  // on the first, G..2G-1 on the next): the nodes set_node_size(G) would simulate. 0 otherwise.
  int ranks_per_host() const;
  int node_of(int r) const;              // the node of rank r of this Comm
  uint64_t peers_across_nodes() const;   // ranks of this Comm on another node than mine
  // Call once the device is chosen (select_device). On CUDA, when no two ranks share a GPU,
  // switches the model-state collectives to NCCL (rank 0's unique id broadcast over MPI);
  // otherwise they stay on MPI, staged through pinned host memory. NZ_COMM=mpi forces the MPI
  // path. A no-op on the CPU. Collective: every rank calls it, before any group is made (a group
  // takes its parent's path when it is made).
  void use_device_backend();
  bool uses_nccl() const { return nccl_ != nullptr; }
  // One rank on the CUDA backend: every collective is a device copy (out of place) or nothing.
  bool one_rank_on_gpu() const { return one_rank_on_gpu_; }
  int gpus_in_use() const { return gpus_in_use_; }           // distinct GPUs over all ranks (0: CPU)
  int ranks_on_my_gpu() const { return ranks_on_my_gpu_; }  // 1 unless ranks share a GPU
  // Sum of x over the ranks that share this rank's GPU (memory reconciliation). Not counted.
  double sum_on_my_gpu(double x);

  // Every collective first checks the memory it is given against the ledger (check_span): a buffer
  // too small for the elements, or released, stops the job with the buffer's name.
  //
  // Sum over ranks of `full` (N * shard_elems elements); this rank's slice of the sum lands in
  // `out_shard`. `full` is used as the receive buffer and left overwritten. out_shard may be
  // this rank's own slice of `full`.
  void reduce_scatter(void* full, void* out_shard, size_t shard_elems, DType dt);
  // out_full = concatenation of every rank's shard. `shard` may be this rank's slice of out_full.
  // On NCCL, out_full may be host memory (the model file's pieces, gathered over a tensor group):
  // NCCL gathers into a device buffer of the Comm's, copied to out_full before the call returns.
  void all_gather(const void* shard, void* out_full, size_t shard_elems, DType dt);
  CommRequest all_gather_start(const void* shard, void* out_full, size_t shard_elems, DType dt);
  void wait(CommRequest& r);
  // Sum over ranks, in place. elems must be a multiple of size() (units are padded to it).
  void all_reduce(void* buf, size_t elems, DType dt);
  // Sum n doubles over ranks, in rank order, in place (loss, squared norm). Counted as Scalars.
  void sum_scalars(double* v, int n);
  // True on every rank when `mine` is true on any rank: an all-reduce MAX of one 4-byte flag (fp16's
  // overflow check, loss_scale.h). Counted as OverflowFlag: each rank sends N-1 elements.
  bool any_flag(bool mine);
  // Every rank's value, on every rank (per-rank peaks for the log line). Counted as Scalars.
  std::vector<double> gather_scalar(double x);
  // Every rank's string, concatenated on rank 0 (reports). Not counted.
  std::string gather_strings(const std::string& mine, const char* separator);

  // ---- the control channel: what the ranks agree on to run the job, not model state ----
  // Flags, run ids, rank 0's verdicts and file names, barriers. Blocking, on MPI, and never
  // counted: the comm ledger stays the ledger of the model's traffic, which the formulas predict.
  void control_barrier() const;
  int control_min(int mine) const;            // the smallest over the ranks, on every rank
  uint64_t control_min(uint64_t mine) const;
  void control_broadcast(void* data, size_t bytes, int root = 0) const;  // rank root's bytes, on every rank
  std::string control_broadcast(const std::string& s) const;             // rank 0's string, on every rank
  // Ends this rank quietly with `code` (MPI finalized): the other ranks' half of an error one rank
  // reports (check.h, user_error_this_rank).
  [[noreturn]] void exit_quietly(int code) const;
  // Ends the whole job now with `code` (MPI_Abort when there are other ranks): a failure in the
  // middle of a step that the other ranks cannot wait for (offload's disk, offload_store.h).
  [[noreturn]] void abort_job(int code) const;
  // Every rank's `bytes` bytes at `mine`, in rank order, into `all` on rank 0 (size() * bytes).
  void control_gather(const void* mine, size_t bytes, void* all) const;

  // Point to point (the pipeline's activations forward and their gradients backward, pipeline.h),
  // counted as PointToPoint: the sender counts what it sends, the receiver what it receives.
  // send_start returns at once; the buffer must stay unchanged until wait() on the request (a
  // blocking send could deadlock two pipeline segments that both send before they receive). recv blocks.
  // `tag` tells apart messages between the same two ranks that may be in flight together.
  // On the CUDA backend, the two paths of the collectives. NCCL: it has no tags (the messages
  // between two ranks match in the order they are issued: the same order on both sides, as the
  // pipeline's schedules keep it) and a send waits for its receive, so a send is held back and
  // issued in one NCCL group with this rank's next receive (or at wait()): two neighbours that
  // both send first then run both directions together instead of waiting for each other. MPI
  // (ranks sharing a GPU): each send goes out from its own pinned host copy, so several can be in
  // flight, and a receive lands in the staging buffer and is copied up. Host memory (the model file
  // on rank 0) is received as it is on the CPU, or through a device copy on NCCL.
  CommRequest send_start(const void* buf, size_t elems, DType dt, int to, int tag);
  void recv(void* buf, size_t elems, DType dt, int from, int tag);

  // ZeRO++'s quantized collectives (zeropp/train.cpp): they move bytes (int8 or int4 codes and
  // their fp32 scales, kernels/quantize.h), not elements of a storage type. Each rank contributes
  // bytes_each bytes standing for elems_each parameters: the ledger counts those elements (the
  // formulas' unit) and the real bytes. CPU backend only.
  //   all_gather_packed: out_all = every rank's bytes, in rank order (AllGather in the ledger).
  //   all_to_all_packed: in place; before, slot r (bytes_each bytes at r * bytes_each) is for rank
  //     r; after, slot r holds what rank r had for me (AllToAll in the ledger).
  CommRequest all_gather_packed_start(const void* mine, void* out_all, size_t bytes_each, uint64_t elems_each);
  void all_to_all_packed(void* buf, size_t bytes_each, uint64_t elems_each);

  // All-to-all of elements of a storage type, in place (ulysses/train.cpp's sequence slices): as
  // all_to_all_packed, with elems_each elements of dt in each rank's slot (AllToAll in the ledger).
  // On the CUDA backend, device memory, on any Comm (a group too): NCCL has no all-to-all, so with
  // one GPU per rank it is one NCCL group of a send and a receive per peer (as DeepSpeed's is), the
  // receives landing in a device buffer of the Comm's (NCCL cannot receive where it still sends
  // from) and copied back; ranks sharing a GPU go through pinned host memory and MPI_Alltoall.
  void all_to_all(void* buf, size_t elems_each, DType dt);

  const CommStats& stats() const { return *stats_; }
  // Offload's copies over the host<->device link: no collective, but the same ledger.
  void count_to_host(size_t elems, size_t bytes) { stats_->add_link(/*to_host=*/true, elems, bytes); }
  void count_to_device(size_t elems, size_t bytes) { stats_->add_link(/*to_host=*/false, elems, bytes); }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool oversubscribed_ = false;  // more ranks than cores on this machine: sleep while waiting
  void* staging(size_t bytes);   // MPI path on GPUs: pinned host copy of a device buffer
  // The comm ledger's count of a collective that sends `elems` elements (`bytes`) to each peer and
  // receives as many from each: reduce-scatter, all-gather, all-to-all (one slice per peer).
  CallTraffic to_each_peer(uint64_t elems, uint64_t bytes) const;
  Buffer staging_;
  // point to point on GPUs: the sends held back for NCCL's next group; the MPI path's host copies
  struct HeldSend {
    const void* buf;
    size_t elems;
    DType dt;
    int to;
  };
  std::vector<HeldSend> held_sends_;
  void issue_held_sends(void* recv_buf = nullptr, size_t elems = 0, DType dt = DType::F32, int from = -1);
  std::vector<Buffer> send_staging_;
  std::vector<bool> send_staging_busy_;
  Buffer nccl_recv_staging_;  // NCCL receives into device memory only
  void* nccl_staging(size_t bytes);  // nccl_recv_staging_, grown to `bytes`
  nccl::Communicator* nccl_ = nullptr;  // this Comm's NCCL communicator; null: not on NCCL
  bool one_rank_on_gpu_ = false;  // size 1 on CUDA: collectives stay on the device, no NCCL
  int gpus_in_use_ = 0, ranks_on_my_gpu_ = 1;
  MPI_Comm gpu_comm_ = MPI_COMM_NULL;  // the ranks sharing this rank's GPU
  MPI_Comm mpi_ = MPI_COMM_WORLD;       // the ranks of this Comm: all, or a group of them
  CommStats own_stats_;
  CommStats* stats_ = &own_stats_;      // a group counts into its parent's ledger
  std::vector<int> node_of_;            // each rank's node (host names, or set_node_size); empty: one node
  int host_nodes_ = 1;                  // distinct host names among the world's ranks
};

}  // namespace nz
