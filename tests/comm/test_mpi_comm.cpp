// test_mpi_comm.cpp — the collectives under mpirun with 1..4 ranks: rank-ordered sums, bitwise
// all_reduce == reduce_scatter + all_gather, odd sizes, and exact comm-ledger counts.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <vector>

#include "comm.h"
#include "ledger.h"
#include "runtime/rng.h"

using namespace nz;

namespace {

Comm& comm() {
  static Comm c(nullptr, nullptr);
  return c;
}

// Rank r's contribution, reproducible on every rank (so each rank can compute the truth).
// Values of very different magnitudes, so that the order of the sum shows in the low bits.
std::vector<float> contribution(int r, size_t n, uint64_t seed) {
  Rng rng(seed, r);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = rng.normal() * (i % 3 == 0 ? 1e4f : i % 3 == 1 ? 1.0f : 1e-4f);
  return x;
}

// The reference: ((c0 + c1) + c2) + ... in fp32, computed by this rank alone.
std::vector<float> serial_rank_order_sum(int N, size_t n, uint64_t seed) {
  std::vector<float> s = contribution(0, n, seed);
  for (int r = 1; r < N; r++) {
    std::vector<float> c = contribution(r, n, seed);
    for (size_t i = 0; i < n; i++) s[i] += c[i];
  }
  return s;
}

bool bitwise_equal(const float* a, const float* b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

const size_t kShardSizes[] = {1, 7, 1001, 4099};

}  // namespace

TEST(Comm, ReduceScatterIsTheRankOrderedSum) {
  const int N = comm().size(), r = comm().rank();
  for (size_t shard : kShardSizes) {
    std::vector<float> full = contribution(r, shard * N, 11 + shard);
    std::vector<float> out(shard);
    comm().reduce_scatter(full.data(), out.data(), shard, DType::F32);
    std::vector<float> truth = serial_rank_order_sum(N, shard * N, 11 + shard);
    EXPECT_TRUE(bitwise_equal(out.data(), truth.data() + r * shard, shard)) << "shard " << shard;
  }
}

TEST(Comm, AllReduceEqualsReduceScatterThenAllGatherBitwise) {
  const int N = comm().size(), r = comm().rank();
  for (size_t shard : kShardSizes) {
    const size_t n = shard * N;
    std::vector<float> a = contribution(r, n, 5 + shard), b = a;
    comm().all_reduce(a.data(), n, DType::F32);
    std::vector<float> mine(shard);
    comm().reduce_scatter(b.data(), mine.data(), shard, DType::F32);
    std::vector<float> gathered(n);
    comm().all_gather(mine.data(), gathered.data(), shard, DType::F32);
    EXPECT_TRUE(bitwise_equal(a.data(), gathered.data(), n)) << "shard " << shard;
    std::vector<float> truth = serial_rank_order_sum(N, n, 5 + shard);
    EXPECT_TRUE(bitwise_equal(a.data(), truth.data(), n)) << "all_reduce is not the rank-ordered sum";
  }
}

TEST(Comm, Bf16SumsInFp32AndRoundsOnce) {
  const int N = comm().size(), r = comm().rank();
  const size_t shard = 333, n = shard * N;
  std::vector<bf16> full(n);
  std::vector<float> c = contribution(r, n, 99);
  for (size_t i = 0; i < n; i++) full[i] = f32_to_bf16(c[i]);
  std::vector<bf16> out(shard);
  comm().reduce_scatter(full.data(), out.data(), shard, DType::BF16);
  for (size_t i = 0; i < shard; i++) {
    float acc = 0;
    for (int q = 0; q < N; q++) {
      float x = bf16_to_f32(f32_to_bf16(contribution(q, n, 99)[r * shard + i]));
      acc = q == 0 ? x : acc + x;
    }
    ASSERT_EQ(out[i].bits, f32_to_bf16(acc).bits) << "element " << i;
  }
}

TEST(Comm, AllGatherConcatenatesShardsInRankOrder) {
  const int N = comm().size(), r = comm().rank();
  const size_t shard = 13;
  std::vector<float> mine(shard), all(shard * N, -1.0f);
  for (size_t i = 0; i < shard; i++) mine[i] = float(r * 1000 + i);
  CommRequest req = comm().all_gather_start(mine.data(), all.data(), shard, DType::F32);
  comm().wait(req);
  for (int q = 0; q < N; q++)
    for (size_t i = 0; i < shard; i++) ASSERT_EQ(all[q * shard + i], float(q * 1000 + i));
}

TEST(Comm, LedgerCountsExactlyTheElementsEachCallSends) {
  const int N = comm().size();
  const size_t shard = 101;
  std::vector<float> buf(shard * N, 1.0f), out(shard);
  CommStats before = comm().stats();
  comm().reduce_scatter(buf.data(), out.data(), shard, DType::F32);
  comm().all_gather(out.data(), buf.data(), shard, DType::F32);
  comm().all_reduce(buf.data(), shard * N, DType::F32);
  CommStats d = comm().stats() - before;
  // ring-equivalent volumes: (N-1)/N of the buffer for RS and AG, twice that for all-reduce
  EXPECT_EQ(d.op[int(CommOp::ReduceScatter)].calls, 1u);
  EXPECT_EQ(d.op[int(CommOp::ReduceScatter)].elems_sent, uint64_t(N - 1) * shard);
  EXPECT_EQ(d.op[int(CommOp::AllGather)].elems_sent, uint64_t(N - 1) * shard);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].calls, 1u);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].elems_sent, uint64_t(2) * (N - 1) * shard);
  EXPECT_EQ(d.op[int(CommOp::AllReduce)].bytes_sent, uint64_t(2) * (N - 1) * shard * 4);
  EXPECT_EQ(d.model_elems_sent(), uint64_t(4) * (N - 1) * shard);
}

// Nodes are the machines the ranks run on (their host names): under one mpirun on one machine that
// is one node, and nothing crosses a node. set_node_size(G) simulates nodes of G consecutive ranks,
// and a rank then sends (N - G) of its N - 1 shards of a reduce-scatter across nodes. (Two real
// nodes: make two-nodes, scripts/two_nodes.sh.)
TEST(Comm, NodesAreTheMachinesUnlessSimulated) {
  const int N = comm().size(), r = comm().rank();
  EXPECT_EQ(comm().host_nodes(), 1);
  for (int q = 0; q < N; q++) EXPECT_EQ(comm().node_of(q), 0);
  EXPECT_EQ(comm().peers_across_nodes(), 0u);
  const size_t shard = 33;
  std::vector<float> buf(shard * N, 1.0f), out(shard);
  for (int G = 1; G <= N; G++) {
    if (N % G) continue;
    Comm g(comm(), 0, r);  // the same ranks, in a group whose nodes can be simulated
    g.set_node_size(G);
    for (int q = 0; q < N; q++) EXPECT_EQ(g.node_of(q), q / G) << "G = " << G;
    CommStats before = g.stats();
    g.reduce_scatter(buf.data(), out.data(), shard, DType::F32);
    CommStats d = g.stats() - before;
    EXPECT_EQ(d.op[int(CommOp::ReduceScatter)].bytes_across_sent, uint64_t(N - G) * shard * 4) << "G = " << G;
  }
}

TEST(Comm, SumScalarsAddsInRankOrder) {
  const int N = comm().size(), r = comm().rank();
  double v[2] = {1e16 * (r == 0) + 1.0, double(r)};
  comm().sum_scalars(v, 2);
  double want0 = 1e16 + 1.0, want1 = 0;
  for (int q = 1; q < N; q++) want0 += 1.0, want1 += q;
  EXPECT_EQ(v[0], want0);
  EXPECT_EQ(v[1], want1);
}

TEST(Ledger, CountsCurrentAndPeakPerCategoryAndLocation) {
  Ledger::get().reset();
  {
    Buffer a(Category::Params, Location::Device, 1000, "a");
    Buffer b(Category::Grads, Location::Host, 24, "b");
    {
      Buffer c(Category::Params, Location::Device, 500, "c");
      EXPECT_EQ(Ledger::get().current(Category::Params, Location::Device), 1500u);
    }
    EXPECT_EQ(Ledger::get().current(Category::Params, Location::Device), 1000u);
    EXPECT_EQ(Ledger::get().peak(Category::Params, Location::Device), 1500u);
    EXPECT_EQ(Ledger::get().current_total(Location::Host), 24u);
    EXPECT_EQ(Ledger::get().peak_total(Location::Device), 1500u);
  }
  EXPECT_EQ(Ledger::get().current_total(Location::Device), 0u);
  EXPECT_EQ(Ledger::get().timeline().size(), 6u);  // three allocations, three frees
}
