// test_cuda_comm.cpp — the collectives on GPU buffers, on whichever path Comm chose:
//   NCCL (every rank has its own GPU), MPI staged through pinned host memory (ranks share a GPU,
//   or NZ_COMM=mpi), or none (one rank: device copies, no NCCL call; NZ_COMM=nccl forces NCCL). Run it under mpirun with 1..4
//   ranks (tests/cuda/gpu_check.sh does: -np 1 takes no NCCL, NZ_COMM=mpi -np 1 and -np 2, 4 on one
//   GPU take the MPI path).
//
//  - sums: the MPI path is bitwise the rank-ordered sum, as on the CPU; NCCL adds in an order of
//    its own, so there the bound is the one any summation order meets: for fp32,
//    |got - rank-ordered| <= 2 (N-1) 2^-24 sum_q |c_q| per element; bf16 contributions are summed
//    by NCCL in bf16 (a rounding per hop), so 2 N 2^-8 sum_q |c_q|;
//  - gathers: exact on both paths (no arithmetic); so is the all-to-all (ulysses' sequence slices:
//    NCCL's grouped sends and receives, or MPI_Alltoall through pinned memory), on the world and on
//    a group whose ranks are not the world's in order;
//  - ordering: a gather started right after device work that writes its input sees that input,
//    and device work queued after wait() sees its output (NCCL runs on its own stream);
//  - the comm ledger counts exactly what the CPU path counts;
//  - a group's collectives take the world's path: NCCL on a communicator of its own, or MPI.
// Without a visible GPU every test skips (the binary also runs, skipping, in `make test`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>  // getenv
#include <cstring>
#include <string>
#include <vector>

#include "comm.h"
#include "runtime/device.h"  // select_device, nz::cuda_rt (device memory)
#include "runtime/rng.h"

using namespace nz;

namespace {

bool gpu_visible() { return cuda_rt::compiled() && cuda_rt::device_count() > 0; }

// Created on first use and never destroyed: at exit the CUDA runtime may be unloaded before a
// static's destructor could free the staging buffer or the NCCL communicator.
Comm& comm() {
  static Comm* c = [] {
    Comm* c = new Comm(nullptr, nullptr);
    if (gpu_visible()) {
      select_device("cuda", c->local_rank(), false);
      c->use_device_backend();
      if (c->rank() == 0)
        printf("collectives on the GPU: %s, %d ranks, %d on this GPU\n", c->uses_nccl() ? "NCCL" : "MPI (staged)",
               c->size(), c->ranks_on_my_gpu());
    }
    return c;
  }();
  return *c;
}

class CudaComm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the GPU collectives tests";
    comm();
  }
};

// n elements of T on the GPU, freed on scope exit. A ledger Buffer, as the trainers' device memory
// is: Comm tells device memory from host memory by the ledger (comm.cpp, on_device).
template <class T>
struct DeviceVec {
  size_t n;
  Buffer buf;
  T* p;
  explicit DeviceVec(size_t n_)
      : n(n_), buf(Category::Scratch, Location::Device, n_ * sizeof(T), "test buffer"), p(buf.as<T>()) {}
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) { cuda_rt::memcpy_any(p, h.data(), n * sizeof(T)); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cuda_rt::memcpy_any(h.data(), p, n * sizeof(T));
    return h;
  }
};

// Rank r's contribution (as in test_mpi_comm.cpp): magnitudes 1e4, 1, 1e-4, so the order of a sum
// shows in the low bits.
std::vector<float> contribution(int r, size_t n, uint64_t seed) {
  Rng rng(seed, r);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = rng.normal() * (i % 3 == 0 ? 1e4f : i % 3 == 1 ? 1.0f : 1e-4f);
  return x;
}

// The fp32 sum of the contributions of world ranks `ranks`, in that order, and sum_q |c_q| (the
// scale of the summation-order bound).
void ordered_sum(const std::vector<int>& ranks, size_t n, uint64_t seed, std::vector<float>* sum,
                 std::vector<double>* abs_sum) {
  *sum = contribution(ranks[0], n, seed);
  abs_sum->assign(n, 0.0);
  for (size_t q = 0; q < ranks.size(); q++) {
    std::vector<float> c = contribution(ranks[q], n, seed);
    for (size_t i = 0; i < n; i++) {
      if (q > 0) (*sum)[i] += c[i];
      (*abs_sum)[i] += std::fabs(double(c[i]));
    }
  }
}
// The rank-ordered sum over the world: ranks 0, 1, ..., N-1.
void rank_ordered(int N, size_t n, uint64_t seed, std::vector<float>* sum, std::vector<double>* abs_sum) {
  std::vector<int> ranks(N);
  for (int q = 0; q < N; q++) ranks[q] = q;
  ordered_sum(ranks, n, seed, sum, abs_sum);
}

// Bitwise on the MPI path; within 2 (N-1) 2^-24 sum|c| on NCCL. Returns the number of bad elements.
size_t count_outside(const float* got, const float* want, const double* abs_sum, size_t n, int N) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (comm().uses_nccl()) bad += !(std::fabs(double(got[i]) - want[i]) <= 2.0 * (N - 1) * 0x1p-24 * abs_sum[i]);
    else bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
  }
  return bad;
}

const size_t kShardSizes[] = {1, 7, 1001, 65537};

}  // namespace

TEST_F(CudaComm, ReduceScatterIsTheRankOrderedSum) {
  const int N = comm().size(), r = comm().rank();
  for (size_t shard : kShardSizes) {
    DeviceVec<float> full(contribution(r, shard * N, 11 + shard));
    DeviceVec<float> out(shard);
    comm().reduce_scatter(full.p, out.p, shard, DType::F32);
    std::vector<float> want;
    std::vector<double> abs_sum;
    rank_ordered(N, shard * N, 11 + shard, &want, &abs_sum);
    std::vector<float> got = out.get();
    EXPECT_EQ(count_outside(got.data(), want.data() + r * shard, abs_sum.data() + r * shard, shard, N), 0u)
        << "shard " << shard;
  }
}

TEST_F(CudaComm, InPlaceAllReduceIsTheRankOrderedSumOnEveryRank) {
  const int N = comm().size(), r = comm().rank();
  for (size_t shard : kShardSizes) {
    const size_t n = shard * N;
    DeviceVec<float> buf(contribution(r, n, 5 + shard));
    comm().all_reduce(buf.p, n, DType::F32);
    std::vector<float> want;
    std::vector<double> abs_sum;
    rank_ordered(N, n, 5 + shard, &want, &abs_sum);
    std::vector<float> got = buf.get();
    EXPECT_EQ(count_outside(got.data(), want.data(), abs_sum.data(), n, N), 0u) << "shard " << shard;
    // every rank holds the same bits (on NCCL too: the all-reduce result is broadcast)
    std::vector<float> rank0 = got;
    MPI_Bcast(rank0.data(), int(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    EXPECT_EQ(memcmp(rank0.data(), got.data(), n * sizeof(float)), 0) << "ranks disagree, shard " << shard;
  }
}

TEST_F(CudaComm, Bf16ReduceScatter) {
  const int N = comm().size(), r = comm().rank();
  const size_t shard = 333, n = shard * N;
  std::vector<bf16> host(n);
  std::vector<float> c = contribution(r, n, 99);
  for (size_t i = 0; i < n; i++) host[i] = f32_to_bf16(c[i]);
  DeviceVec<bf16> full(host);
  // in place: the output is this rank's own slice of the input
  comm().reduce_scatter(full.p, full.p + r * shard, shard, DType::BF16);
  std::vector<bf16> got = full.get();
  for (size_t i = 0; i < shard; i++) {
    float acc = 0;
    double abs_sum = 0;
    for (int q = 0; q < N; q++) {
      float x = bf16_to_f32(f32_to_bf16(contribution(q, n, 99)[r * shard + i]));
      acc = q == 0 ? x : acc + x;
      abs_sum += std::fabs(x);
    }
    const bf16 g = got[r * shard + i];
    if (comm().uses_nccl())  // bf16 sums with a rounding per hop
      ASSERT_LE(std::fabs(double(bf16_to_f32(g)) - acc), 2.0 * N * 0x1p-8 * abs_sum) << "element " << i;
    else  // fp32 accumulation in rank order, one rounding: as on the CPU
      ASSERT_EQ(g.bits, f32_to_bf16(acc).bits) << "element " << i;
  }
}

TEST_F(CudaComm, AllGatherConcatenatesShardsInRankOrder) {
  const int N = comm().size(), r = comm().rank();
  for (size_t shard : kShardSizes) {
    std::vector<float> mine(shard);
    for (size_t i = 0; i < shard; i++) mine[i] = float(r * 1000003 + i);
    DeviceVec<float> all(std::vector<float>(shard * N, -1.0f));
    DeviceVec<float> src(mine);
    comm().all_gather(src.p, all.p, shard, DType::F32);  // from a separate buffer
    std::vector<float> got = all.get();
    size_t bad = 0;
    for (int q = 0; q < N; q++)
      for (size_t i = 0; i < shard; i++) bad += got[q * shard + i] != float(q * 1000003 + i);
    EXPECT_EQ(bad, 0u) << "shard " << shard;
  }
}

// The ordering that stage3's prefetch relies on. Device-to-device copies are queued on the
// default (compute) stream without blocking the host, like kernels: big copies first keep that
// stream busy for a millisecond or so, then the copy that writes the gather's input. The gather must see that input, and a
// copy queued after wait() must see the gather's output. On the emulator (NZ_TEST_QUICK=1,
// tests/cuda/emu_check.sh) every copy completes at its call, so the shard is 256 KB and the busy
// copies 1 MB: their sizes only matter to a GPU's timing, and the emulator's stream check
// (NZ_EMU_CHECK=stream) tells whether the three are ordered.
TEST_F(CudaComm, StartedGatherIsOrderedWithTheComputeStream) {
  const int N = comm().size(), r = comm().rank();
  const bool quick = getenv("NZ_TEST_QUICK") && std::string(getenv("NZ_TEST_QUICK")) == "1";
  const size_t shard = size_t(1) << (quick ? 16 : 20), busy = size_t(1) << (quick ? 20 : 28);  // 4 MB; 256 MB
  DeviceVec<char> big_a(busy), big_b(busy);
  std::vector<float> mine(shard);
  for (size_t i = 0; i < shard; i++) mine[i] = float(r) + float(i % 1000) * 1e-3f;
  DeviceVec<float> staged(mine), shard_buf(std::vector<float>(shard, -7.0f));
  DeviceVec<float> full(std::vector<float>(shard * N, -1.0f)), copy_of_full(shard * N);
  for (int rep = 0; rep < 2; rep++) {
    for (int k = 0; k < 8; k++) cuda_rt::memcpy_any(big_b.p, big_a.p, busy);  // keep the compute stream busy
    cuda_rt::memcpy_any(shard_buf.p, staged.p, shard * sizeof(float));  // writes the gather's input
    CommRequest req = comm().all_gather_start(shard_buf.p, full.p, shard, DType::F32);
    comm().wait(req);
    cuda_rt::memcpy_any(copy_of_full.p, full.p, shard * N * sizeof(float));  // reads its output
    std::vector<float> got = copy_of_full.get();
    size_t bad = 0;
    for (int q = 0; q < N; q++)
      for (size_t i = 0; i < shard; i++) bad += got[q * shard + i] != float(q) + float(i % 1000) * 1e-3f;
    EXPECT_EQ(bad, 0u) << "repetition " << rep;
  }
}

TEST_F(CudaComm, LedgerCountsWhatTheCpuPathCounts) {
  const int N = comm().size();
  const size_t shard = 101;
  DeviceVec<float> buf(std::vector<float>(shard * N, 1.0f)), out(shard);
  CommStats before = comm().stats();
  comm().reduce_scatter(buf.p, out.p, shard, DType::F32);
  comm().all_gather(out.p, buf.p, shard, DType::F32);
  comm().all_reduce(buf.p, shard * N, DType::F32);
  CommRequest req = comm().all_gather_start(out.p, buf.p, shard, DType::F32);
  comm().wait(req);
  CommStats d = comm().stats() - before;
  // ring-equivalent volumes: (N-1)/N of the buffer for RS and AG, twice that for all-reduce
  EXPECT_EQ(d.op[int(CommOp::ReduceScatter)].calls, 1u);
  EXPECT_EQ(d.op[int(CommOp::ReduceScatter)].elems_sent, uint64_t(N - 1) * shard);
  EXPECT_EQ(d.op[int(CommOp::AllGather)].calls, 2u);
  EXPECT_EQ(d.op[int(CommOp::AllGather)].elems_sent, uint64_t(2) * (N - 1) * shard);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].calls, 1u);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].elems_sent, uint64_t(2) * (N - 1) * shard);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].bytes_sent, uint64_t(2) * (N - 1) * shard * 4);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].bytes_recv, uint64_t(2) * (N - 1) * shard * 4);
  EXPECT_EQ(d.model_elems_sent(), uint64_t(5) * (N - 1) * shard);
}

// The backend rule (comm.h): one rank alone makes no NCCL call (its collectives stay on the
// device) unless NZ_COMM forces a backend; else NCCL exactly when no two ranks share a GPU and
// NZ_COMM does not force MPI. Here (one machine, every rank seeing every GPU) ranks share a GPU
// when there are more ranks than GPUs.
TEST_F(CudaComm, NcclExactlyWhenEveryRankHasItsOwnGpu) {
  const char* force = getenv("NZ_COMM");
  const bool forced_mpi = force && strcmp(force, "mpi") == 0, forced_nccl = force && strcmp(force, "nccl") == 0;
  const int gpus = cuda_rt::device_count(), n = comm().local_size();
  const bool own_gpu = n <= gpus;
  EXPECT_EQ(comm().one_rank_on_gpu(), comm().size() == 1 && !forced_mpi && !forced_nccl);
  EXPECT_EQ(comm().uses_nccl(), own_gpu && !forced_mpi && (comm().size() > 1 || forced_nccl));
  // local rank r uses GPU r % gpus: the ranks on mine are those with the same remainder
  EXPECT_EQ(comm().ranks_on_my_gpu(), (n - 1 - comm().local_rank() % gpus) / gpus + 1);
  EXPECT_EQ(comm().gpus_in_use(), std::min(n, gpus) * (comm().size() / n));
}

// One rank (no NCCL, run under NZ_EMU_NO_NCCL=1 on the emulator): every collective is the value
// itself, bit for bit, in fp32 and bf16, out of place and in place, and nothing goes through host
// memory (the MPI path's pinned staging buffer, host scratch in the ledger, is never made).
TEST_F(CudaComm, OneRankCollectivesAreDeviceCopies) {
  if (!comm().one_rank_on_gpu()) GTEST_SKIP() << "more than one rank, or NZ_COMM set";
  const uint64_t host_scratch = Ledger::get().peak(Category::Scratch, Location::Host);
  for (size_t n : kShardSizes) {
    const std::vector<float> x = contribution(0, n, 77 + n);
    DeviceVec<float> full(x), out(n), gathered(n), reduced(x);
    comm().reduce_scatter(full.p, out.p, n, DType::F32);
    comm().all_gather(out.p, gathered.p, n, DType::F32);
    comm().all_reduce(reduced.p, n, DType::F32);
    CommRequest req = comm().all_gather_start(full.p, full.p, n, DType::F32);  // in place: nothing to do
    comm().wait(req);
    for (const DeviceVec<float>* v : {&full, &out, &gathered, &reduced})
      EXPECT_EQ(memcmp(v->get().data(), x.data(), n * sizeof(float)), 0) << n << " elements";
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; i++) b[i] = uint16_t(0x3f80 + i * 37);  // bf16 bits, any
    DeviceVec<uint16_t> bfull(b), bout(n);
    comm().reduce_scatter(bfull.p, bout.p, n, DType::BF16);
    EXPECT_EQ(bout.get(), b) << n << " bf16 elements";
  }
  EXPECT_EQ(Ledger::get().peak(Category::Scratch, Location::Host), host_scratch) << "a collective staged through host memory";
}

// All-to-all in place (ulysses/train.cpp): before, slot j of rank r holds what r has for rank j; after,
// slot q holds what rank q had for me. On the world, and on groups of two consecutive ranks ranked
// in reverse (group rank 0 is the higher world rank: NCCL's peers are then not the group's ranks).
// fp32 and bf16 (NCCL's bf16 type), a 1-element slot and an odd one; counted as AllToAll, (N-1) slots.
float a2a_value(int from, int to, size_t i) { return float(from * 1000 + to * 10) + float(i % 7); }

void expect_all_to_all(Comm& c, int world_rank, bool pairs, const char* what) {
  const int N = c.size(), me = c.rank();
  for (size_t each : {size_t(1), size_t(333)}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      std::vector<float> mine(each * N);
      for (int j = 0; j < N; j++)
        for (size_t i = 0; i < each; i++) mine[j * each + i] = a2a_value(world_rank, j, i);
      const size_t e = dtype_bytes(dt);
      std::vector<char> bytes(mine.size() * e);
      for (size_t k = 0; k < mine.size(); k++) {
        if (dt == DType::F32) memcpy(&bytes[k * e], &mine[k], e);
        else { const bf16 b = store<bf16>(mine[k]); memcpy(&bytes[k * e], &b, e); }
      }
      DeviceVec<char> buf(bytes);
      const CommStats before = c.stats();
      c.all_to_all(buf.p, each, dt);
      const CommStats d = c.stats() - before;
      EXPECT_EQ(d.op[int(CommOp::AllToAll)].calls, 1u) << what;
      EXPECT_EQ(d.op[int(CommOp::AllToAll)].elems_sent, uint64_t(N - 1) * each) << what;
      const std::vector<char> got = buf.get();
      // the world rank of the group's rank q: consecutive pairs, ranked in reverse (or the world)
      std::vector<int> world_of(N);
      for (int q = 0; q < N; q++) world_of[q] = pairs ? world_rank + (me - q) : q;
      size_t bad = 0;
      for (int q = 0; q < N; q++)
        for (size_t i = 0; i < each; i++) {
          const float want = a2a_value(world_of[q], me, i);
          const size_t k = q * each + i;
          float g;
          if (dt == DType::F32) memcpy(&g, &got[k * e], e);
          else { bf16 b; memcpy(&b, &got[k * e], e); g = load(b); }
          bad += g != (dt == DType::F32 ? want : load(store<bf16>(want)));
        }
      EXPECT_EQ(bad, 0u) << what << ": " << each << " elements per slot, " << dtype_name(dt);
    }
  }
}

TEST_F(CudaComm, AllToAllMovesEverySlotToItsRank) {
  expect_all_to_all(comm(), comm().rank(), false, "world");
  const int r = comm().rank();
  Comm pairs(comm(), /*color*/ r / 2, /*key: reversed*/ -r);  // the last rank alone when N is odd
  expect_all_to_all(pairs, r, true, "pairs ranked in reverse");
}

// A group's collectives (the tensor rung's tensor and data-parallel groups, tensor/train.cpp) take
// the world's path: where every rank has its own GPU, NCCL, on an NCCL communicator of the group's
// own, with nothing staged through host memory (the MPI path's pinned staging buffer, host scratch
// in the ledger, is never made); where ranks share a GPU, the MPI path (on the emulator, run under
// NZ_EMU_NO_NCCL=1: no NCCL call). On pairs of consecutive ranks ranked in reverse (group rank 0 is
// the higher world rank; the last rank alone when N is odd) the results are the MPI path's: the
// sums are the group's rank-ordered sums (bitwise on MPI, within the summation-order bound on
// NCCL), the gathers come in the group's rank order, into device memory and into host memory (the
// model file's pieces), and a pair's sends and receives arrive, both ranks sending first.
TEST_F(CudaComm, GroupCollectivesTakeTheWorldsPath) {
  const int r = comm().rank();
  const uint64_t host_scratch = Ledger::get().peak(Category::Scratch, Location::Host);
  Comm pairs(comm(), /*color*/ r / 2, /*key: reversed*/ -r, "pair group");
  const int N = pairs.size(), me = pairs.rank();
  EXPECT_EQ(pairs.uses_nccl(), comm().uses_nccl()) << "a group's path differs from the world's";
  std::vector<int> world_of(N);  // the world rank of the group's rank q
  for (int q = 0; q < N; q++) world_of[q] = r + (me - q);
  for (size_t shard : {size_t(7), size_t(1001)}) {
    const size_t n = shard * N;
    std::vector<float> want;
    std::vector<double> abs_sum;
    ordered_sum(world_of, n, 3 + shard, &want, &abs_sum);
    DeviceVec<float> reduced(contribution(r, n, 3 + shard));
    pairs.all_reduce(reduced.p, n, DType::F32);
    EXPECT_EQ(count_outside(reduced.get().data(), want.data(), abs_sum.data(), n, N), 0u) << "all-reduce, " << shard;
    DeviceVec<float> full(contribution(r, n, 3 + shard)), mine(shard);
    pairs.reduce_scatter(full.p, mine.p, shard, DType::F32);
    EXPECT_EQ(count_outside(mine.get().data(), want.data() + me * shard, abs_sum.data() + me * shard, shard, N), 0u)
        << "reduce-scatter, " << shard;
    // every rank's world rank, gathered into device memory and into host memory
    DeviceVec<float> ids(std::vector<float>(shard, float(r))), gathered(n);
    std::vector<float> on_host(n, -1.0f), want_ids(n);
    for (size_t k = 0; k < n; k++) want_ids[k] = float(world_of[k / shard]);
    pairs.all_gather(ids.p, gathered.p, shard, DType::F32);
    pairs.all_gather(ids.p, on_host.data(), shard, DType::F32);
    EXPECT_EQ(gathered.get(), want_ids) << "all-gather into device memory, " << shard;
    EXPECT_EQ(on_host, want_ids) << "all-gather into host memory, " << shard;
  }
  if (N == 2) {  // both send first, then receive (on NCCL: each send issued with the receive, comm.h)
    DeviceVec<float> out(std::vector<float>(5, float(r))), in(5);
    CommRequest sent = pairs.send_start(out.p, 5, DType::F32, 1 - me, /*tag*/ 7);
    pairs.recv(in.p, 5, DType::F32, 1 - me, 7);
    pairs.wait(sent);
    EXPECT_EQ(in.get(), std::vector<float>(5, float(world_of[1 - me]))) << "a pair's send and receive";
  }
  if (comm().uses_nccl())
    EXPECT_EQ(Ledger::get().peak(Category::Scratch, Location::Host), host_scratch)
        << "a group's collective went through host memory on the NCCL path";
}
