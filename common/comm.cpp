// comm.cpp — the MPI collectives, with rank-ordered sums and the comm ledger; on GPUs with one
// GPU per rank, the model-state collectives are handed to NCCL (cuda/comm_nccl.cu).
#include "comm.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

#include "check.h"
#include "cuda/comm_nccl.h"  // nz::nccl (stubs below in a build without CUDA)
#include "device.h"
#include "json.h"
#include "ledger.h"

namespace nz {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::AllReduce: return "all_reduce";
    case CommOp::ReduceScatter: return "reduce_scatter";
    case CommOp::AllGather: return "all_gather";
    case CommOp::Broadcast: return "broadcast";
    case CommOp::Scalars: return "scalars";
    default: return "?";
  }
}

uint64_t CommStats::model_elems_sent() const {
  uint64_t s = 0;
  for (int i = 0; i < kNumCommOps; i++)
    if (CommOp(i) != CommOp::Scalars) s += op[i].elems_sent;
  return s;
}

uint64_t CommStats::model_bytes_sent() const {
  uint64_t s = 0;
  for (int i = 0; i < kNumCommOps; i++)
    if (CommOp(i) != CommOp::Scalars) s += op[i].bytes_sent;
  return s;
}

CommStats CommStats::operator-(const CommStats& o) const {
  CommStats d;
  for (int i = 0; i < kNumCommOps; i++) {
    d.op[i].calls = op[i].calls - o.op[i].calls;
    d.op[i].elems_sent = op[i].elems_sent - o.op[i].elems_sent;
    d.op[i].bytes_sent = op[i].bytes_sent - o.op[i].bytes_sent;
    d.op[i].bytes_recv = op[i].bytes_recv - o.op[i].bytes_recv;
  }
  d.link.to_host_bytes = link.to_host_bytes - o.link.to_host_bytes;
  d.link.to_device_bytes = link.to_device_bytes - o.link.to_device_bytes;
  d.link.to_host_elems = link.to_host_elems - o.link.to_host_elems;
  d.link.to_device_elems = link.to_device_elems - o.link.to_device_elems;
  return d;
}

std::string CommStats::to_json() const {
  JsonWriter j;
  j.begin_object();
  for (int i = 0; i < kNumCommOps; i++) {
    j.key(comm_op_name(CommOp(i)));
    j.begin_object();
    j.kv("calls", op[i].calls);
    j.kv("elems_sent", op[i].elems_sent);
    j.kv("bytes_sent", op[i].bytes_sent);
    j.kv("bytes_recv", op[i].bytes_recv);
    j.end_object();
  }
  j.kv("model_elems_sent", model_elems_sent());
  j.kv("model_bytes_sent", model_bytes_sent());
  j.kv("to_host_bytes", link.to_host_bytes);
  j.kv("to_device_bytes", link.to_device_bytes);
  j.kv("to_host_elems", link.to_host_elems);
  j.kv("to_device_elems", link.to_device_elems);
  j.end_object();
  return j.str();
}

static MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16: return MPI_UINT16_T;
    case DType::F64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

Comm::Comm(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) MPI_Init(argc, argv);
  Ledger::get();  // exists before this Comm, so it outlives the staging buffer
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm node;  // the ranks on this machine: picks the GPU and the threads per rank
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  oversubscribed_ = local_size_ > int(std::thread::hardware_concurrency());
}

Comm::~Comm() {
  staging_.release();
  if (nccl_) nccl::finalize();
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
  const char* force = getenv("NZ_COMM");
  if (force && *force && strcmp(force, "mpi") != 0)
    user_error("NZ_COMM=%s: unknown collectives backend; valid: mpi (forces the MPI path on GPUs), "
               "or leave it unset", force);
  // NCCL needs one GPU per rank (it refuses two ranks on one GPU); sharing ranks take the MPI path.
  nccl_ = all_own && nccl::compiled() && !(force && *force);
  if (!nccl_) return;
  char id[nccl::kUniqueIdBytes] = {};
  if (rank_ == 0) nccl::unique_id(id);
  MPI_Bcast(id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);  // NCCL is bootstrapped over MPI
  nccl::init(id, size_, rank_);
}

double Comm::sum_on_my_gpu(double x) {
  if (gpu_comm_ == MPI_COMM_NULL) return x;
  double sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, gpu_comm_);
  return sum;
}

void Comm::count(CommOp op, uint64_t elems_sent, uint64_t bytes_sent, uint64_t bytes_recv) {
  CommCounts& c = stats_.op[int(op)];
  c.calls++;
  c.elems_sent += elems_sent;
  c.bytes_sent += bytes_sent;
  c.bytes_recv += bytes_recv;
}

void Comm::count_link(bool to_host, size_t elems, size_t bytes) {
  if (to_host) {
    stats_.link.to_host_elems += elems;
    stats_.link.to_host_bytes += bytes;
  } else {
    stats_.link.to_device_elems += elems;
    stats_.link.to_device_bytes += bytes;
  }
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

static bool on_gpu() { return current_device() == Device::CUDA; }

#ifndef NZ_HAVE_CUDA
// ---- stubs: a build without CUDA never chooses NCCL ----
namespace nccl {
[[noreturn]] static void no_nccl() { fatal(__FILE__, __LINE__, "NCCL backend not compiled in"); }
bool compiled() { return false; }
void gpu_bus_id(char*) { no_nccl(); }
void unique_id(char*) { no_nccl(); }
void init(const char*, int, int) { no_nccl(); }
void finalize() {}
void reduce_scatter(const void*, void*, size_t, DType) { no_nccl(); }
void all_gather(const void*, void*, size_t, DType) { no_nccl(); }
void all_reduce(void*, size_t, DType) { no_nccl(); }
void join() {}
}  // namespace nccl
#endif

// out[i] = c_0[i] + c_1[i] + ... + c_{N-1}[i], left to right, where c_r is slice r of `full`.
template <class T>
static void sum_slices_in_rank_order(const T* full, T* out, size_t shard, int n_ranks) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < shard; i++) {
    acc_t<T> acc = load(full[i]);
    for (int r = 1; r < n_ranks; r++) acc += load(full[size_t(r) * shard + i]);
    out[i] = store<T>(acc);
  }
}

void Comm::reduce_scatter(void* full, void* out_shard, size_t shard_elems, DType dt) {
  const size_t esz = dtype_bytes(dt), shard_bytes = shard_elems * esz;
  const size_t full_bytes = shard_bytes * size_;
  count(CommOp::ReduceScatter, uint64_t(size_ - 1) * shard_elems, uint64_t(size_ - 1) * shard_bytes,
        uint64_t(size_ - 1) * shard_bytes);
  if (nccl_) {  // one GPU per rank: NCCL sums on the GPUs, in its own order
    nccl::reduce_scatter(full, out_shard, shard_elems, dt);
    nccl::join();
    return;
  }
  void* host_full = full;
  if (on_gpu()) {
    host_full = staging(full_bytes);
    copy_bytes(host_full, Location::Host, full, Location::Device, full_bytes);
  }
  // 1. all-to-all, in place: afterwards slice r of host_full holds rank r's contribution to MY slice.
  if (size_ > 1) {
    CommRequest r;
    MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host_full, int(shard_elems), mpi_type(dt),
                  MPI_COMM_WORLD, &r.req);
    wait(r);
  }
  // 2. add the N contributions in rank order.
  void* host_out = on_gpu() ? host_full : out_shard;  // on the GPU path sum into slice 0, copy out
  switch (dt) {
    case DType::F32: sum_slices_in_rank_order((const float*)host_full, (float*)host_out, shard_elems, size_); break;
    case DType::BF16: sum_slices_in_rank_order((const bf16*)host_full, (bf16*)host_out, shard_elems, size_); break;
    case DType::F64: sum_slices_in_rank_order((const double*)host_full, (double*)host_out, shard_elems, size_); break;
  }
  if (on_gpu()) copy_bytes(out_shard, Location::Device, host_out, Location::Host, shard_bytes);
}

void Comm::all_gather(const void* shard, void* out_full, size_t shard_elems, DType dt) {
  CommRequest r = all_gather_start(shard, out_full, shard_elems, dt);
  wait(r);
}

CommRequest Comm::all_gather_start(const void* shard, void* out_full, size_t shard_elems, DType dt) {
  const size_t esz = dtype_bytes(dt), shard_bytes = shard_elems * esz;
  char* own_slice = static_cast<char*>(out_full) + size_t(rank_) * shard_bytes;
  CommRequest r;
  count(CommOp::AllGather, uint64_t(size_ - 1) * shard_elems, uint64_t(size_ - 1) * shard_bytes,
        uint64_t(size_ - 1) * shard_bytes);
  if (nccl_) {  // queued on the comm stream; wait() makes the compute stream wait for it
    nccl::all_gather(shard, out_full, shard_elems, dt);
    r.on_comm_stream = true;
    return r;
  }
  if (on_gpu()) {  // staged and blocking: the copy back needs the data
    char* host_full = static_cast<char*>(staging(shard_bytes * size_));
    copy_bytes(host_full + size_t(rank_) * shard_bytes, Location::Host, shard, Location::Device, shard_bytes);
    if (size_ > 1) {
      MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host_full, int(shard_elems), mpi_type(dt),
                     MPI_COMM_WORLD, &r.req);
      wait(r);
    }
    copy_bytes(out_full, Location::Device, host_full, Location::Host, shard_bytes * size_);
    return r;
  }
  if (shard != own_slice) memcpy(own_slice, shard, shard_bytes);
  if (size_ > 1)
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out_full, int(shard_elems), mpi_type(dt),
                   MPI_COMM_WORLD, &r.req);
  return r;
}

// Waiting politely: when there are more ranks than cores on this machine (4 ranks on a 2-core
// laptop), a rank spinning inside MPI steals the core another rank needs to finish its compute,
// and every collective waits for that rank. So after a short spin the waiter sleeps between polls.
void Comm::wait(CommRequest& r) {
  if (r.on_comm_stream) {  // NCCL: kernels queued after this see the gathered data
    nccl::join();
    r.on_comm_stream = false;
    return;
  }
  if (!r.active()) return;
  int done = 0;
  for (int spin = 0; spin < 64 && !done; spin++) MPI_Test(&r.req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    if (oversubscribed_) {
      struct timespec ts = {0, 20000};  // 20 us
      nanosleep(&ts, nullptr);
    }
    MPI_Test(&r.req, &done, MPI_STATUS_IGNORE);
  }
  r.req = MPI_REQUEST_NULL;
}

void Comm::all_reduce(void* buf, size_t elems, DType dt) {
  NZ_CHECK(elems % size_ == 0, "all_reduce of %zu elements over %d ranks: pad to a multiple", elems,
           size_);
  const size_t shard = elems / size_;
  const size_t shard_bytes = shard * dtype_bytes(dt);
  void* own_slice = static_cast<char*>(buf) + size_t(rank_) * shard_bytes;
  if (nccl_) {  // NCCL's own all-reduce; booked as the two halves would be
    count(CommOp::AllReduce, 2 * uint64_t(size_ - 1) * shard, 2 * uint64_t(size_ - 1) * shard_bytes,
          2 * uint64_t(size_ - 1) * shard_bytes);
    nccl::all_reduce(buf, elems, dt);
    nccl::join();
    return;
  }
  // reduce-scatter then all-gather: the same bits as the two collectives called separately.
  const CommStats before = stats_;
  reduce_scatter(buf, own_slice, shard, dt);
  all_gather(own_slice, buf, shard, dt);
  // Book it as one all-reduce (what the call was), moving what the two halves moved.
  CommStats delta = stats_ - before;
  stats_ = before;
  uint64_t e = delta.op[int(CommOp::ReduceScatter)].elems_sent + delta.op[int(CommOp::AllGather)].elems_sent;
  uint64_t b = delta.op[int(CommOp::ReduceScatter)].bytes_sent + delta.op[int(CommOp::AllGather)].bytes_sent;
  count(CommOp::AllReduce, e, b, b);
}

void Comm::broadcast(void* buf, size_t bytes, int root) {
  MPI_Bcast(buf, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
  count(CommOp::Broadcast, rank_ == root ? uint64_t(size_ - 1) * bytes : 0,
        rank_ == root ? uint64_t(size_ - 1) * bytes : 0, rank_ == root ? 0 : bytes);
}

void Comm::barrier() {
  CommRequest r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r.req);
  wait(r);
}

void Comm::sum_scalars(double* v, int n) {
  std::vector<double> all(size_t(n) * size_);
  CommRequest req;
  MPI_Iallgather(v, n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, MPI_COMM_WORLD, &req.req);
  wait(req);
  for (int i = 0; i < n; i++) {
    double acc = all[i];
    for (int r = 1; r < size_; r++) acc += all[size_t(r) * n + i];
    v[i] = acc;
  }
  count(CommOp::Scalars, uint64_t(size_ - 1) * n, uint64_t(size_ - 1) * n * 8, uint64_t(size_ - 1) * n * 8);
}

std::vector<double> Comm::gather_scalar(double x) {
  std::vector<double> all(size_);
  CommRequest req;
  MPI_Iallgather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD, &req.req);
  wait(req);
  count(CommOp::Scalars, uint64_t(size_ - 1), uint64_t(size_ - 1) * 8, uint64_t(size_ - 1) * 8);
  return all;
}

std::string Comm::gather_strings(const std::string& mine, const char* separator) {
  int len = int(mine.size());
  std::vector<int> lens(size_), offs(size_);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<char> all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; r++) offs[r] = total, total += lens[r];
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  if (rank_ != 0) return {};
  std::string out;
  for (int r = 0; r < size_; r++) {
    if (r) out += separator;
    out.append(all.data() + offs[r], lens[r]);
  }
  return out;
}

}  // namespace nz
