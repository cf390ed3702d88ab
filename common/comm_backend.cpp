// comm_backend.cpp — which transport carries the collectives of comm.cpp: MPI start-up and the
// node-local ranks, which ranks share a GPU, NCCL (one GPU per rank) or MPI through a pinned
// host staging buffer (ranks sharing a GPU), and the NCCL stubs of a build without CUDA.
#include <signal.h>        // signal (SIGXFSZ)
#include <sys/resource.h>  // getrlimit (RLIMIT_FSIZE)

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runtime/check.h"           // user_error, fatal
#include "comm.h"
#include "kernels/cuda/comm_nccl.h"  // nz::nccl (stubs below in a build without CUDA)
#include "runtime/device.h"          // current_device
#include "ledger.h"          // Buffer, for the staging copy

namespace nz {

namespace {

// A file-size limit (ulimit -f) makes a write fail (EFBIG) instead of killing the process
// (SIGXFSZ), from the very start: MPI's start-up already writes files (its shared-memory
// segments: about 4.3 MB each with MPICH over UCX), so this comes before MPI_Init. A limit that
// small makes MPI_Init itself fail, with the library's own messages: one line says why first.
void file_size_limit_is_a_failed_write() {
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim;
  constexpr rlim_t kMpiStartupBytes = 16 << 20;  // comfortably above what MPI's start-up writes
  if (getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= kMpiStartupBytes) return;
  const char* rank = getenv("PMI_RANK");  // the launcher's rank: MPI's own is not known yet
  if (!rank) rank = getenv("OMPI_COMM_WORLD_RANK");
  if (rank && strcmp(rank, "0") != 0) return;
  fprintf(stderr, "note: the file-size limit (ulimit -f) is %s: writes past it fail, and MPI's start-up writes "
          "shared-memory files of a few MB; if it fails with 'File too large', raise the limit (ulimit -f "
          "unlimited)\n", fmt_bytes(double(lim.rlim_cur)).c_str());
}

}  // namespace

Comm::Comm(int* argc, char*** argv) {
  file_size_limit_is_a_failed_write();
  int init = 0;
  MPI_Initialized(&init);
  if (!init) MPI_Init(argc, argv);
  Ledger::get();  // exists before this Comm, so it outlives the staging buffer
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // The ranks on this machine (they pick the GPU and the threads per rank): those with my host's
  // name, exchanged non-blocking and waited for with sleeps (comm.cpp, wait_politely). The ranks
  // arrive here as each finishes loading its libraries, and an early one spinning inside a blocking
  // call (MPI_Comm_split_type) would take the core a late one needs to get here. Once per run.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> hosts(size_t(size_) * sizeof host);
  MPI_Request req;
  MPI_Iallgather(host, int(sizeof host), MPI_CHAR, hosts.data(), int(sizeof host), MPI_CHAR, MPI_COMM_WORLD,
                 &req);
  wait_politely(&req, true);
  local_rank_ = local_size_ = 0;
  for (int r = 0; r < size_; r++) {
    const bool here = strncmp(&hosts[size_t(r) * sizeof host], host, sizeof host) == 0;
    local_size_ += here;
    local_rank_ += here && r < rank_;
  }
  // The same names give the nodes: node k is the k-th distinct host name in rank order. On one
  // machine that is one node, as before; set_node_size replaces it with simulated nodes.
  std::vector<std::string> names;
  node_of_.resize(size_);
  for (int r = 0; r < size_; r++) {
    std::string name(&hosts[size_t(r) * sizeof host], strnlen(&hosts[size_t(r) * sizeof host], sizeof host));
    size_t k = 0;
    while (k < names.size() && names[k] != name) k++;
    if (k == names.size()) names.push_back(name);
    node_of_[r] = int(k);
  }
  host_nodes_ = int(names.size());
  oversubscribed_ = local_size_ > int(std::thread::hardware_concurrency());
}

Comm::Comm(Comm& parent, int color, int key, const char* name)
    : local_rank_(parent.local_rank_), local_size_(parent.local_size_), oversubscribed_(parent.oversubscribed_),
      stats_(parent.stats_) {
  MPI_Comm_split(parent.mpi_, color, key, &mpi_);
  MPI_Comm_rank(mpi_, &rank_);
  MPI_Comm_size(mpi_, &size_);
  // the group's ranks keep the nodes they have in the parent (the comm ledger's inside/across split)
  MPI_Group parent_group, group;
  MPI_Comm_group(parent.mpi_, &parent_group);
  MPI_Comm_group(mpi_, &group);
  std::vector<int> mine(size_), in_parent(size_);
  for (int r = 0; r < size_; r++) mine[r] = r;
  MPI_Group_translate_ranks(group, size_, mine.data(), parent_group, in_parent.data());
  node_of_.resize(size_);
  for (int r = 0; r < size_; r++) node_of_[r] = parent.node_of(in_parent[r]);
  MPI_Group_free(&group);
  MPI_Group_free(&parent_group);
  // One GPU per rank (the parent on NCCL): an NCCL communicator of the group's own, split off the
  // parent's as the MPI one was, so its NCCL ranks are its MPI ranks. Ranks sharing a GPU: none,
  // the group's collectives take the MPI path through pinned host memory, as the parent's do.
  if (parent.nccl_) nccl_ = nccl::split(parent.nccl_, color, key, name);
}

void Comm::set_node_size(int G) {
  NZ_CHECK(G >= 1 && size_ % G == 0, "set_node_size: %d ranks in nodes of %d", size_, G);
  node_of_.resize(size_);
  for (int r = 0; r < size_; r++) node_of_[r] = r / G;
}

int Comm::node_of(int r) const { return node_of_.empty() ? 0 : node_of_[r]; }

int Comm::ranks_per_host() const {
  if (host_nodes_ < 1 || size_ % host_nodes_ != 0) return 0;
  const int G = size_ / host_nodes_;
  for (int r = 0; r < size_; r++)
    if (node_of(r) != r / G) return 0;
  return G;
}

uint64_t Comm::peers_across_nodes() const {
  uint64_t n = 0;
  for (int r = 0; r < size_; r++) n += node_of(r) != node_of(rank_);
  return n;
}

Comm::~Comm() {
  if (mpi_ != MPI_COMM_WORLD) {  // a group: MPI itself belongs to the parent
    nccl::destroy(nccl_);  // after the group's collectives (a no-op without NCCL)
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&mpi_);
    return;
  }
  staging_.release();
  send_staging_.clear();
  nccl_recv_staging_.release();
  nccl::destroy(nccl_);
  int fin = 0;
  MPI_Finalized(&fin);
  if (gpu_comm_ != MPI_COMM_NULL && !fin) MPI_Comm_free(&gpu_comm_);
  if (!fin) MPI_Finalize();
}

void Comm::use_device_backend() {
  if (current_device() != Device::CUDA) return;
  // Which ranks on this machine share my GPU? Compare the GPUs' bus ids rather than trusting
  // local_rank % GPUs: a scheduler that gives each rank its own CUDA_VISIBLE_DEVICES shows every
  // rank "GPU 0", and yet no two share one.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  char mine[nccl::kBusIdBytes] = {};
  nccl::gpu_bus_id(mine);
  std::vector<char> ids(size_t(local_size_) * sizeof mine);
  MPI_Allgather(mine, int(sizeof mine), MPI_CHAR, ids.data(), int(sizeof mine), MPI_CHAR, node);
  int first = local_rank_;  // the lowest local rank on my GPU
  for (int r = local_size_ - 1; r >= 0; r--)
    if (memcmp(&ids[size_t(r) * sizeof mine], mine, sizeof mine) == 0) first = r;
  MPI_Comm_split(node, first, rank_, &gpu_comm_);  // the ranks on my GPU
  MPI_Comm_free(&node);
  MPI_Comm_size(gpu_comm_, &ranks_on_my_gpu_);
  int first_on_gpu = first == local_rank_, own_gpu = ranks_on_my_gpu_ == 1, all_own = 0;
  MPI_Allreduce(&first_on_gpu, &gpus_in_use_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&own_gpu, &all_own, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const char* env = getenv("NZ_COMM");
  const std::string force = env ? env : "";
  if (!force.empty() && force != "mpi" && force != "nccl")
    user_error("NZ_COMM=%s: unknown collectives backend; valid: mpi (forces the MPI path on GPUs), nccl "
               "(NCCL even for one rank: its tests on a one-GPU machine), or leave it unset", env);
  // One rank: nothing to bootstrap and nothing to exchange, so no NCCL at all (a single process
  // started without mpirun needs no NCCL library that works); its collectives are device copies
  // or nothing (comm.cpp), never a round trip through host memory. NZ_COMM=mpi still forces the
  // staged MPI path, and NZ_COMM=nccl NCCL (their tests run on one rank too).
  one_rank_on_gpu_ = size_ == 1 && force.empty();
  if (one_rank_on_gpu_) return;
  // NCCL needs one GPU per rank (it refuses two ranks on one GPU); sharing ranks take the MPI path.
  if (!all_own || !nccl::compiled() || force == "mpi") return;
  char id[nccl::kUniqueIdBytes] = {};
  if (rank_ == 0) nccl::unique_id(id);
  MPI_Bcast(id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);  // NCCL is bootstrapped over MPI
  nccl_ = nccl::init(id, size_, rank_);
  set_before_host_wait(nccl::wait_joined);  // a failed peer ends the host's next wait with a name
}

double Comm::sum_on_my_gpu(double x) {
  if (gpu_comm_ == MPI_COMM_NULL) return x;
  double sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, gpu_comm_);
  return sum;
}

// ---- staging: MPI works on host memory; on the CUDA backend without NCCL (ranks sharing a GPU)
// device data is copied through one host buffer, pinned (raw_alloc on CUDA), grown to the largest
// unit. Tracked in the ledger as host scratch, not model state. cudaMemcpy to and from pinned
// memory returns only when the copy is done, so the buffer is free again when a call returns. ----
void* Comm::staging(size_t bytes) {
  if (staging_.bytes() < bytes) {
    staging_.release();  // the old one first: never both at once
    staging_ = Buffer(Category::Scratch, Location::Host, bytes, "mpi staging (pinned)");
  }
  return staging_.data();
}

#ifndef NZ_HAVE_CUDA
// ---- stubs: a build without CUDA never chooses NCCL ----
namespace nccl {
[[noreturn]] static void no_nccl() { fatal(__FILE__, __LINE__, "NCCL backend not compiled in"); }
bool compiled() { return false; }
void gpu_bus_id(char*) { no_nccl(); }
void unique_id(char*) { no_nccl(); }
Communicator* init(const char*, int, int) { no_nccl(); }
Communicator* split(Communicator*, int, int, const char*) { no_nccl(); }
void destroy(Communicator*) {}
void reduce_scatter(Communicator*, const void*, void*, size_t, DType) { no_nccl(); }
void all_gather(Communicator*, const void*, void*, size_t, DType) { no_nccl(); }
void all_reduce(Communicator*, void*, size_t, DType) { no_nccl(); }
void send(Communicator*, const void*, size_t, DType, int) { no_nccl(); }
void recv(Communicator*, void*, size_t, DType, int) { no_nccl(); }
void group_start() { no_nccl(); }
void group_end(Communicator*) { no_nccl(); }
void wait_joined() {}
void join() {}
}  // namespace nccl
#endif

}  // namespace nz
