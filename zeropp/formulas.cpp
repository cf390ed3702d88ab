// formulas.cpp — ZeRO++'s bytes on top of stage3's (formulas.h).
#include "zeropp/formulas.h"

#include "kernels/quantize.h"  // BlockQuant: the packed sizes

namespace nz {

static uint64_t packed(int bits, size_t block, uint64_t n) { return BlockQuant{bits, block}.packed_bytes(n); }

StateBytes zeropp_state_bytes(const Layout& L, DType dt, const ZeroppConfig& z) {
  StateBytes b = expected_state_bytes(Stage::Z3, L, dt);
  const uint64_t e = dtype_bytes(dt), N = L.world, P = L.padded_total, s_max = L.max_unit_padded / N;
  if (z.hpz > 0) b.params += e * P / uint64_t(z.hpz);
  if (z.qwz) b.comm_buffers += (N + 1) * packed(8, z.qw_block, s_max);
  if (z.qgz) b.comm_buffers += N * packed(4, z.qg_block, s_max) + 8 * s_max;
  if (qgz_two_hops(z, L.world)) b.comm_buffers += 4 * (N / uint64_t(z.node_size)) * s_max;
  return b;
}

bool qgz_two_hops(const ZeroppConfig& z, int world) {
  return z.qgz && !z.qgz_flat && z.node_size > 1 && z.node_size < world;
}

ZeroppComm qgz_comm_per_step(const Layout& L, const ZeroppConfig& z, int accum) {
  ZeroppComm c;
  if (!z.qgz) return c;
  const uint64_t N = L.world, G = z.node_size, M = N / G, K = accum;
  auto add = [&](uint64_t elems, uint64_t bytes, uint64_t peers, uint64_t across) {
    c.elems += K * peers * elems;
    c.bytes += K * peers * bytes;
    c.bytes_across += K * across * bytes;
  };
  for (int u = 0; u < L.num_units(); u++) {
    const uint64_t s = L.units[u].padded / N, q = packed(4, z.qg_block, s);
    if (qgz_two_hops(z, L.world)) {
      add(M * s, M * q, G - 1, 0);  // hop 1: to each other rank of my node, the M slices it reduces
      add(s, q, M - 1, M - 1);      // hop 2: to my local index on each other node, its slice
    } else {
      add(s, q, N - 1, N - G);      // flat: to every other rank, its slice
    }
  }
  return c;
}

ZeroppComm zeropp_comm_per_step(const Layout& L, DType dt, const ZeroppConfig& z, int accum) {
  const uint64_t e = dtype_bytes(dt), N = L.world, Gn = z.node_size, K = accum;
  ZeroppComm c;
  // one collective that sends `bytes` (standing for `elems`) to each of `peers` ranks, `across` of them
  // on other nodes
  auto add = [&](uint64_t elems, uint64_t bytes, uint64_t peers, uint64_t across) {
    c.elems += K * peers * elems;
    c.bytes += K * peers * bytes;
    c.bytes_across += K * across * bytes;
  };
  for (int u = 0; u < L.num_units(); u++) {
    const uint64_t p = L.units[u].padded, s = p / N;
    const uint64_t gather = z.qwz ? packed(8, z.qw_block, s) : e * s;
    const int forward_gathers = u == L.embed_unit() ? 2 : 1;  // the embedding again for the LM head
    for (int i = 0; i < forward_gathers; i++) add(s, gather, N - 1, N - Gn);
    if (u != L.embed_unit()) {  // the embedding's backward needs no parameters
      if (z.hpz > 0) add(p / z.hpz, e * p / z.hpz, z.hpz - 1, 0);  // inside my node only
      else add(s, gather, N - 1, N - Gn);
    }
    if (!z.qgz) add(s, e * s, N - 1, N - Gn);  // the reduce-scatter
  }
  const ZeroppComm q = qgz_comm_per_step(L, z, accum);  // or qgZ's all-to-all, flat or in two hops
  c.elems += q.elems, c.bytes += q.bytes, c.bytes_across += q.bytes_across;
  return c;
}

}  // namespace nz
