// test_mpi_packed.cpp — ZeRO++'s pieces of the comm layer, under mpirun with 1..4 ranks: the packed
// all-gather and all-to-all move the bytes they say, and the comm ledger counts the elements they
// stand for, the bytes, and of them the bytes across simulated nodes; a group (a node) counts inside
// only. The truth is written out here: every rank can compute every rank's bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm.h"

using namespace nz;

namespace {

Comm& comm() {
  static Comm c(nullptr, nullptr);
  return c;
}

// byte i of what rank `from` sends to rank `to` (the all-gather: to = -1)
uint8_t byte_of(int from, int to, size_t i) { return uint8_t(31 * from + 7 * (to + 1) + i); }

// Nodes of 2 ranks when N is even, else one node: peers on another node than mine.
uint64_t across_peers(int N, int G, int rank) {
  uint64_t n = 0;
  for (int r = 0; r < N; r++) n += r / G != rank / G;
  return n;
}

}  // namespace

TEST(PackedCollectives, AllGatherAndAllToAllMoveTheBytesAndTheLedgerSplitsThemByNode) {
  Comm& c = comm();
  const int N = c.size(), me = c.rank(), G = N % 2 == 0 ? 2 : N;
  c.set_node_size(G);
  const size_t each = 37;        // bytes per rank (odd: nothing assumes alignment)
  const uint64_t elems = 50;     // the parameters they stand for
  Buffer mine(Category::Scratch, Location::Host, each, "mine");
  Buffer all(Category::Scratch, Location::Host, each * N, "all");
  for (size_t i = 0; i < each; i++) static_cast<uint8_t*>(mine.data())[i] = byte_of(me, -1, i);
  const CommStats before = c.stats();
  CommRequest r = c.all_gather_packed_start(mine.data(), all.data(), each, elems);
  c.wait(r);
  for (int from = 0; from < N; from++)
    for (size_t i = 0; i < each; i++)
      ASSERT_EQ(static_cast<uint8_t*>(all.data())[from * each + i], byte_of(from, -1, i)) << from << " " << i;
  // all-to-all in place: slot r for rank r before, slot r from rank r after
  for (int to = 0; to < N; to++)
    for (size_t i = 0; i < each; i++) static_cast<uint8_t*>(all.data())[to * each + i] = byte_of(me, to, i);
  c.all_to_all_packed(all.data(), each, elems);
  for (int from = 0; from < N; from++)
    for (size_t i = 0; i < each; i++)
      ASSERT_EQ(static_cast<uint8_t*>(all.data())[from * each + i], byte_of(from, me, i)) << from << " " << i;
  const CommStats d = c.stats() - before;
  const uint64_t peers = N - 1, across = across_peers(N, G, me);
  for (CommOp op : {CommOp::AllGather, CommOp::AllToAll}) {
    const CommCounts& k = d.op[int(op)];
    EXPECT_EQ(k.calls, 1u);
    EXPECT_EQ(k.elems_sent, peers * elems);
    EXPECT_EQ(k.bytes_sent, peers * each);
    EXPECT_EQ(k.bytes_recv, peers * each);
    EXPECT_EQ(k.bytes_across_sent, across * each) << "nodes of " << G;
  }
  EXPECT_EQ(d.model_bytes_across_nodes(), 2 * across * each);
  // my node as a group: its all-gather stays inside the node, counted in the parent's ledger
  Comm node(c, me / G, me);
  EXPECT_EQ(node.size(), G);
  std::vector<float> part(3, float(me)), full(3 * G);
  Buffer p(Category::Scratch, Location::Host, sizeof(float) * 3, "part");
  Buffer f(Category::Scratch, Location::Host, sizeof(float) * 3 * G, "full");
  memcpy(p.data(), part.data(), sizeof(float) * 3);
  const CommStats b2 = c.stats();
  node.all_gather(p.data(), f.data(), 3, DType::F32);
  const CommStats d2 = c.stats() - b2;
  for (int r = 0; r < G; r++) EXPECT_EQ(static_cast<float*>(f.data())[3 * r], float(me / G * G + r));
  EXPECT_EQ(d2.op[int(CommOp::AllGather)].bytes_sent, uint64_t(G - 1) * 12);
  EXPECT_EQ(d2.op[int(CommOp::AllGather)].bytes_across_sent, 0u) << "a node's gather never leaves it";
  c.set_node_size(N);  // one node again
}
