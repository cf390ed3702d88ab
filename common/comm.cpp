// comm.cpp — the collectives: rank-ordered sums over MPI, each call counted in the comm ledger;
// on GPUs with one GPU per rank, the model-state ones are handed to NCCL (cuda/comm_nccl.cu), on
// the Comm's own NCCL communicator (the world's, or a group's).
// Which path runs is decided once, in comm_backend.cpp.
#include "comm.h"

#include <omp.h>

#include <climits>  // INT_MAX
#include <cstring>
#include <ctime>
#include <vector>

#include "runtime/check.h"           // NZ_CHECK
#include "kernels/cuda/comm_nccl.h"  // nz::nccl
#include "runtime/device.h"          // current_device, copy_bytes
#include "profile.h"                 // StepProfile: NZ_PROFILE=1 counts the time in collectives

namespace nz {

static MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16: return MPI_UINT16_T;
    case DType::F16: return MPI_UINT16_T;
    case DType::F64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

static bool on_gpu() { return current_device() == Device::CUDA; }

// Device memory: a buffer the ledger knows as on the device, when the run is on the GPU. Anything
// else (the model file's host copy of a unit) is host, which NCCL cannot send from or write to.
static bool on_device(const void* p) {
  if (!on_gpu()) return false;
  const BufferExtent* ext = Ledger::get().buffer_at(p);
  return ext && ext->loc == Location::Device;
}

// NCCL's device buffer for what arrives where NCCL cannot write (host memory, or a slot it still
// sends from), grown to the largest use.
void* Comm::nccl_staging(size_t bytes) {
  if (nccl_recv_staging_.bytes() < bytes) {
    nccl_recv_staging_.release();
    nccl_recv_staging_ = Buffer(Category::Scratch, Location::Device, bytes, "nccl receive staging");
  }
  return nccl_recv_staging_.data();
}

// The activity log (ledger.h): an all-gather into `out` started or waited for, named by its buffer.
static void note_gather(const char* what, const void* out) {
  const BufferExtent* ext = Ledger::get().buffer_at(out);
  Ledger::get().note(what, ext ? ext->name : "?");
}

// out[i] = c_0[i] + c_1[i] + ... + c_{N-1}[i], left to right, where c_r is slice r of `full`.
template <class T>
static void sum_slices_in_rank_order(const T* full, T* out, size_t shard, int n_ranks) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < shard; i++) {
    // begin exercise: comm_rank_ordered_sum
    acc_t<T> acc = load(full[i]);
    for (int r = 1; r < n_ranks; r++) acc += load(full[size_t(r) * shard + i]);
    out[i] = store<T>(acc);
    // end exercise: comm_rank_ordered_sum
  }
}

CallTraffic Comm::to_each_peer(uint64_t elems, uint64_t bytes) const {
  const uint64_t peers = uint64_t(size_ - 1);
  return CallTraffic::both_ways(peers * elems, peers * bytes).across_nodes(peers_across_nodes() * bytes);
}

void Comm::reduce_scatter(void* full, void* out_shard, size_t shard_elems, DType dt) {
  StepProfile::Scope profiled(StepProfile::Collectives);  // NZ_PROFILE: a collective's time (profile.h)
  const size_t esz = dtype_bytes(dt), shard_bytes = shard_elems * esz;
  const size_t full_bytes = shard_bytes * size_;
  check_span(full, full_bytes, "reduce_scatter: the full buffer (N slices)");
  check_span(out_shard, shard_bytes, "reduce_scatter: the output slice");
  stats_->add(CommOp::ReduceScatter, to_each_peer(shard_elems, shard_bytes));
  if (one_rank_on_gpu_) {  // the sum over one rank is its own contribution, bit for bit
    if (out_shard != full) copy_bytes(out_shard, Location::Device, full, Location::Device, shard_bytes);
    return;
  }
  if (nccl_) {  // one GPU per rank: NCCL sums on the GPUs, in its own order
    nccl::reduce_scatter(nccl_, full, out_shard, shard_elems, dt);
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
                  mpi_, &r.req);
    wait(r);
  }
  // 2. add the N contributions in rank order.
  void* host_out = on_gpu() ? host_full : out_shard;  // on the GPU path sum into slice 0, copy out
  switch (dt) {
    case DType::F32: sum_slices_in_rank_order((const float*)host_full, (float*)host_out, shard_elems, size_); break;
    case DType::BF16: sum_slices_in_rank_order((const bf16*)host_full, (bf16*)host_out, shard_elems, size_); break;
    case DType::F16: sum_slices_in_rank_order((const f16*)host_full, (f16*)host_out, shard_elems, size_); break;
    case DType::F64: sum_slices_in_rank_order((const double*)host_full, (double*)host_out, shard_elems, size_); break;
  }
  if (on_gpu()) copy_bytes(out_shard, Location::Device, host_out, Location::Host, shard_bytes);
}

void Comm::all_gather(const void* shard, void* out_full, size_t shard_elems, DType dt) {
  CommRequest r = all_gather_start(shard, out_full, shard_elems, dt);
  wait(r);
}

CommRequest Comm::all_gather_start(const void* shard, void* out_full, size_t shard_elems, DType dt) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  const size_t esz = dtype_bytes(dt), shard_bytes = shard_elems * esz;
  char* own_slice = static_cast<char*>(out_full) + size_t(rank_) * shard_bytes;
  check_span(shard, shard_bytes, "all_gather: the slice sent");
  check_span(out_full, shard_bytes * size_, "all_gather: the output (N slices)");
  CommRequest r;
  r.gathering_into = out_full;
  note_gather("gather_start", out_full);
  Ledger::get().set_gathering(out_full, true);  // untouchable until the wait
  stats_->add(CommOp::AllGather, to_each_peer(shard_elems, shard_bytes));
  if (one_rank_on_gpu_) {  // my slice is the whole: queued on the compute stream, nothing to wait
    if (shard != own_slice) copy_bytes(own_slice, Location::Device, shard, Location::Device, shard_bytes);
    return r;
  }
  if (nccl_ && !on_device(out_full)) {  // into host memory (the model file): through a device copy
    void* gathered = nccl_staging(shard_bytes * size_);
    nccl::all_gather(nccl_, shard, gathered, shard_elems, dt);
    nccl::join();  // the copy below, on the compute stream, sees the gather
    copy_bytes(out_full, Location::Host, gathered, Location::Device, shard_bytes * size_);
    return r;
  }
  if (nccl_) {  // queued on the comm stream; wait() makes the compute stream wait for it
    nccl::all_gather(nccl_, shard, out_full, shard_elems, dt);
    r.on_comm_stream = true;
    return r;
  }
  if (on_gpu()) {  // staged and blocking: the copy back needs the data
    char* host_full = static_cast<char*>(staging(shard_bytes * size_));
    copy_bytes(host_full + size_t(rank_) * shard_bytes, Location::Host, shard, Location::Device, shard_bytes);
    if (size_ > 1) {
      MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host_full, int(shard_elems), mpi_type(dt),
                     mpi_, &r.req);
      wait(r);
    }
    copy_bytes(out_full, Location::Device, host_full, Location::Host, shard_bytes * size_);
    return r;
  }
  if (shard != own_slice) memcpy(own_slice, shard, shard_bytes);
  if (size_ > 1)
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out_full, int(shard_elems), mpi_type(dt),
                   mpi_, &r.req);
  return r;
}

// Waiting politely: when there are more ranks than cores on this machine (4 ranks on a 2-core
// laptop), a rank spinning inside MPI steals the core another rank needs to finish its compute,
// and every collective waits for that rank. So after a short spin the waiter sleeps between polls.
void wait_politely(MPI_Request* req, bool sleep) {
  int done = 0;
  for (int spin = 0; spin < 64 && !done; spin++) MPI_Test(req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    if (sleep) {
      struct timespec ts = {0, 20000};  // 20 us
      nanosleep(&ts, nullptr);
    }
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
  }
}

void Comm::wait(CommRequest& r) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  if (r.gathering_into && r.active()) note_gather("gather_wait", r.gathering_into);
  if (r.gathering_into) Ledger::get().set_gathering(r.gathering_into, false);
  r.gathering_into = nullptr;
  if (r.on_comm_stream) {  // NCCL: kernels queued after this see the gathered data
    if (!held_sends_.empty()) issue_held_sends();  // a held send (send_start): issued now, joined
    else nccl::join();
    r.on_comm_stream = false;
    return;
  }
  if (!r.active()) return;
  wait_politely(&r.req, oversubscribed_);
  r.req = MPI_REQUEST_NULL;
  if (r.staged >= 0) send_staging_busy_[r.staged] = false, r.staged = -1;  // the send's host copy is free
}

void Comm::all_reduce(void* buf, size_t elems, DType dt) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  NZ_CHECK(elems % size_ == 0, "all_reduce of %zu elements over %d ranks: pad to a multiple", elems,
           size_);
  check_span(buf, elems * dtype_bytes(dt), "all_reduce: the buffer");
  const size_t shard = elems / size_;
  const size_t shard_bytes = shard * dtype_bytes(dt);
  void* own_slice = static_cast<char*>(buf) + size_t(rank_) * shard_bytes;
  if (nccl_ || one_rank_on_gpu_) {  // NCCL's own all-reduce; booked as the two halves would be
    stats_->add(CommOp::AllReduce, to_each_peer(2 * uint64_t(shard), 2 * uint64_t(shard_bytes)));
    if (one_rank_on_gpu_) return;  // in place over one rank: the sum is already there
    nccl::all_reduce(nccl_, buf, elems, dt);
    nccl::join();
    return;
  }
  // reduce-scatter then all-gather: the same bits as the two collectives called separately.
  const CommStats before = *stats_;
  reduce_scatter(buf, own_slice, shard, dt);
  all_gather(own_slice, buf, shard, dt);
  // Book it as one all-reduce (what the call was), moving what the two halves moved.
  CommStats delta = *stats_ - before;
  *stats_ = before;
  uint64_t e = delta.op[int(CommOp::ReduceScatter)].elems_sent + delta.op[int(CommOp::AllGather)].elems_sent;
  uint64_t b = delta.op[int(CommOp::ReduceScatter)].bytes_sent + delta.op[int(CommOp::AllGather)].bytes_sent;
  uint64_t x = delta.op[int(CommOp::ReduceScatter)].bytes_across_sent +
               delta.op[int(CommOp::AllGather)].bytes_across_sent;
  stats_->add(CommOp::AllReduce, CallTraffic::both_ways(e, b).across_nodes(x));
}

void Comm::sum_scalars(double* v, int n) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  std::vector<double> all(size_t(n) * size_);
  CommRequest req;
  MPI_Iallgather(v, n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, mpi_, &req.req);
  wait(req);
  for (int i = 0; i < n; i++) {
    double acc = all[i];
    for (int r = 1; r < size_; r++) acc += all[size_t(r) * n + i];
    v[i] = acc;
  }
  stats_->add(CommOp::Scalars, CallTraffic::both_ways(uint64_t(size_ - 1) * n, uint64_t(size_ - 1) * n * 8));
}

bool Comm::any_flag(bool mine) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  int flag = mine ? 1 : 0;
  MPI_Request req;
  MPI_Iallreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, mpi_, &req);
  CommRequest r;
  r.req = req;
  wait(r);
  stats_->add(CommOp::OverflowFlag, CallTraffic::both_ways(uint64_t(size_ - 1), uint64_t(size_ - 1) * 4));
  return flag != 0;
}

std::vector<double> Comm::gather_scalar(double x) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  std::vector<double> all(size_);
  CommRequest req;
  MPI_Iallgather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, mpi_, &req.req);
  wait(req);
  stats_->add(CommOp::Scalars, CallTraffic::both_ways(uint64_t(size_ - 1), uint64_t(size_ - 1) * 8));
  return all;
}

// ---- the control channel (not counted) ----

// Each one started non-blocking and waited for politely (wait_politely): ranks reach these at
// different times (start-up, the report at the end), and a blocking call would spin meanwhile.
void Comm::control_barrier() const {
  MPI_Request req;
  MPI_Ibarrier(mpi_, &req);
  wait_politely(&req, oversubscribed_);
}

int Comm::control_min(int mine) const {
  int out = mine;
  MPI_Request req;
  MPI_Iallreduce(&mine, &out, 1, MPI_INT, MPI_MIN, mpi_, &req);
  wait_politely(&req, oversubscribed_);
  return out;
}

uint64_t Comm::control_min(uint64_t mine) const {
  uint64_t out = mine;
  MPI_Request req;
  MPI_Iallreduce(&mine, &out, 1, MPI_UINT64_T, MPI_MIN, mpi_, &req);
  wait_politely(&req, oversubscribed_);
  return out;
}

void Comm::control_broadcast(void* data, size_t bytes, int root) const {
  NZ_CHECK(bytes <= size_t(INT_MAX), "control_broadcast: %zu bytes", bytes);
  if (!bytes) return;
  MPI_Request req;
  MPI_Ibcast(data, int(bytes), MPI_BYTE, root, mpi_, &req);
  wait_politely(&req, oversubscribed_);
}

std::string Comm::control_broadcast(const std::string& s) const {
  uint64_t n = s.size();
  control_broadcast(&n, sizeof n);
  std::string out = s;
  out.resize(n);
  control_broadcast(out.data(), n);
  return out;
}

void Comm::control_gather(const void* mine, size_t bytes, void* all) const {
  NZ_CHECK(bytes <= size_t(INT_MAX), "control_gather: %zu bytes", bytes);
  MPI_Request req;
  MPI_Igather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, 0, mpi_, &req);
  wait_politely(&req, oversubscribed_);
}

void Comm::abort_job(int code) const {
  if (size_ > 1) MPI_Abort(mpi_, code);
  exit(code);
}

void Comm::exit_quietly(int code) const {
  MPI_Finalize();
  exit(code);
}

CommRequest Comm::send_start(const void* buf, size_t elems, DType dt, int to, int tag) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  const size_t bytes = elems * dtype_bytes(dt);
  check_span(buf, bytes, "send: the buffer");
  const uint64_t across = node_of(to) != node_of(rank_) ? bytes : 0;
  stats_->add(CommOp::PointToPoint, CallTraffic::sent(elems, bytes).across_nodes(across));
  CommRequest r;
  if (nccl_) {  // held back for the next group (comm.h); wait() or the next recv issues it
    NZ_CHECK(on_device(buf), "send: NCCL sends device memory only");
    held_sends_.push_back({buf, elems, dt, to});
    r.on_comm_stream = true;
    return r;
  }
  const void* from = buf;
  if (on_device(buf)) {  // ranks sharing a GPU: from a pinned host copy of its own, free again at wait()
    size_t i = 0;
    while (i < send_staging_.size() && send_staging_busy_[i]) i++;
    if (i == send_staging_.size()) send_staging_.emplace_back(), send_staging_busy_.push_back(false);
    if (send_staging_[i].bytes() < bytes) {
      send_staging_[i].release();
      send_staging_[i] = Buffer(Category::Scratch, Location::Host, bytes, "mpi send staging (pinned)");
    }
    send_staging_busy_[i] = true;
    r.staged = int(i);
    copy_bytes(send_staging_[i].data(), Location::Host, buf, Location::Device, bytes);
    from = send_staging_[i].data();
  }
  MPI_Isend(from, int(elems), mpi_type(dt), to, tag, mpi_, &r.req);
  return r;
}

// NCCL: the held sends and, when given, one receive, in one group; the compute stream then waits
// for them (the received data is there for the kernels queued next, the sent buffers free again).
void Comm::issue_held_sends(void* recv_buf, size_t elems, DType dt, int from) {
  nccl::group_start();
  for (const HeldSend& h : held_sends_) nccl::send(nccl_, h.buf, h.elems, h.dt, h.to);
  if (recv_buf) nccl::recv(nccl_, recv_buf, elems, dt, from);
  nccl::group_end(nccl_);
  held_sends_.clear();
  nccl::join();
}

void Comm::recv(void* buf, size_t elems, DType dt, int from, int tag) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  const size_t bytes = elems * dtype_bytes(dt);
  check_span(buf, bytes, "recv: the buffer");
  stats_->add(CommOp::PointToPoint, CallTraffic::received(bytes));
  if (nccl_) {
    if (on_device(buf)) {
      issue_held_sends(buf, elems, dt, from);
      return;
    }
    void* got = nccl_staging(bytes);
    issue_held_sends(got, elems, dt, from);
    copy_bytes(buf, Location::Host, got, Location::Device, bytes);
    return;
  }
  const bool staged = on_device(buf);  // ranks sharing a GPU: through the pinned staging buffer
  void* into = staged ? staging(bytes) : buf;
  CommRequest r;
  MPI_Irecv(into, int(elems), mpi_type(dt), from, tag, mpi_, &r.req);
  wait(r);  // politely: a stage waiting for its neighbour leaves the core to the neighbour
  if (staged) copy_bytes(buf, Location::Device, into, Location::Host, bytes);
}

CommRequest Comm::all_gather_packed_start(const void* mine, void* out_all, size_t bytes_each, uint64_t elems_each) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  NZ_CHECK(!nccl_ && !on_gpu(), "the quantized all-gather runs on the CPU backend only");
  NZ_CHECK(bytes_each <= size_t(INT_MAX), "all_gather_packed: %zu bytes per rank", bytes_each);
  check_span(mine, bytes_each, "all_gather_packed: the bytes sent");
  check_span(out_all, bytes_each * size_, "all_gather_packed: the output (N parts)");
  CommRequest r;
  r.gathering_into = out_all;
  note_gather("gather_start", out_all);
  stats_->add(CommOp::AllGather, to_each_peer(elems_each, bytes_each));
  char* own = static_cast<char*>(out_all) + size_t(rank_) * bytes_each;
  if (mine != own) memcpy(own, mine, bytes_each);
  if (size_ > 1)
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out_all, int(bytes_each), MPI_BYTE, mpi_, &r.req);
  return r;
}

void Comm::all_to_all_packed(void* buf, size_t bytes_each, uint64_t elems_each) {
  StepProfile::Scope profiled(StepProfile::Collectives);
  NZ_CHECK(!nccl_ && !on_gpu(), "the quantized all-to-all runs on the CPU backend only");
  NZ_CHECK(bytes_each <= size_t(INT_MAX), "all_to_all_packed: %zu bytes per rank", bytes_each);
  check_span(buf, bytes_each * size_, "all_to_all_packed: the buffer (N parts)");
  stats_->add(CommOp::AllToAll, to_each_peer(elems_each, bytes_each));
  if (size_ == 1) return;
  CommRequest r;
  MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, int(bytes_each), MPI_BYTE, mpi_, &r.req);
  wait(r);
}

void Comm::all_to_all(void* buf, size_t elems_each, DType dt) {
  if (!on_gpu()) return all_to_all_packed(buf, elems_each * dtype_bytes(dt), elems_each);
  StepProfile::Scope profiled(StepProfile::Collectives);
  const size_t each = elems_each * dtype_bytes(dt), all = each * size_;
  NZ_CHECK(elems_each <= size_t(INT_MAX), "all_to_all: %zu elements per rank", elems_each);
  check_span(buf, all, "all_to_all: the buffer (N parts)");
  stats_->add(CommOp::AllToAll, to_each_peer(elems_each, each));
  if (size_ == 1) return;  // my slot is already mine
  char* slots = static_cast<char*>(buf);
  if (nccl_) {  // one GPU per rank: a send and a receive per peer, one group
    char* got = static_cast<char*>(nccl_staging(all));
    nccl::group_start();
    for (int j = 0; j < size_; j++) {
      if (j == rank_) continue;
      nccl::send(nccl_, slots + j * each, elems_each, dt, j);  // slot j: for rank j
      nccl::recv(nccl_, got + j * each, elems_each, dt, j);    // what rank j had for me
    }
    nccl::group_end(nccl_);
    nccl::join();  // the copies below, on the compute stream, see the receives
    for (int j = 0; j < size_; j++)
      if (j != rank_) copy_bytes(slots + j * each, Location::Device, got + j * each, Location::Device, each);
    return;
  }
  // ranks sharing a GPU: through pinned host memory, MPI's all-to-all in place (synchronous copies)
  void* host = staging(all);
  copy_bytes(host, Location::Host, buf, Location::Device, all);
  CommRequest r;
  MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, int(elems_each), mpi_type(dt), mpi_, &r.req);
  wait(r);
  copy_bytes(buf, Location::Device, host, Location::Host, all);
}

std::string Comm::gather_strings(const std::string& mine, const char* separator) {
  int len = int(mine.size());
  std::vector<int> lens(size_), offs(size_);
  MPI_Request req;
  MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, mpi_, &req);
  wait_politely(&req, oversubscribed_);
  std::vector<char> all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; r++) offs[r] = total, total += lens[r];
    all.resize(total);
  }
  MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, mpi_, &req);
  wait_politely(&req, oversubscribed_);
  if (rank_ != 0) return {};
  std::string out;
  for (int r = 0; r < size_; r++) {
    if (r) out += separator;
    out.append(all.data() + offs[r], lens[r]);
  }
  return out;
}

}  // namespace nz
