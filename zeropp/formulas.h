// formulas.h — what ZeRO++ adds to stage3, per rank, to the byte: its state and its bytes sent.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "layout.h"
#include "zero_formulas.h"  // StateBytes, expected_state_bytes: stage3's

namespace nz {

// ---- ZeRO++ (zeropp/train.cpp, docs/zeropp.md): what it adds to stage3, for a layout padded to
// N x block (make_layout's pad_block), with s_u = p_u / N the slice of unit u (p_u padded) ----
struct ZeroppConfig {
  bool qwz = false;              // int8 parameter gathers
  int hpz = 0;                   // hpZ's node size G (0: off)
  bool qgz = false;              // int4 gradient reduce-scatter
  int node_size = 1;             // the node: the machines', or simulated (--hpz's G, --ranks-per-node, all N)
  size_t qw_block = 256, qg_block = 256;
  bool qgz_flat = false;         // qgZ as one all-to-all over all N ranks instead of the two hops
};
// qgZ's two hops (the paper's hierarchical all-to-all) run when there are two of each: more than one
// rank per node and more than one node. With one node (G = N) the second hop has no one to send to,
// with nodes of one rank (G = 1) the first: the one hop left is the flat all-to-all, bit for bit.
bool qgz_two_hops(const ZeroppConfig& z, int world);
// Model-state bytes per rank: stage3's, plus
//   params        + e P / G                  hpZ's secondary shard: my node's 1/G of every unit
//   comm_buffers  + (N + 1) q8(U/N)          qwZ: my slice and every rank's, as int8 + scales
//                 + N q4(U/N) + 8 U/N        qgZ: N slices as int4 + scales, two fp32 slices (the
//                                            sum and one rank's dequantized blocks)
//                 + 4 (N/G) U/N              qgZ's two hops: my node's sums of the N/G slices I
//                                            send across, fp32
// where qb(n) = b n / 8 + 4 n / block bytes (kernels/quantize.h, packed_bytes).
StateBytes zeropp_state_bytes(const Layout& L, DType dt, const ZeroppConfig& z);
// What one rank sends per optimizer step in the model-state collectives (K micro-steps), with G'
// the node size: every collective sends the same to each of the N - 1 others, G' - 1 of them
// inside my node and N - G' across. Per micro-step, per unit u, what goes to one peer:
//   forward gathers (every unit, the embedding twice)   q8(s_u) with qwZ, else e s_u
//   backward gathers (every unit but the embedding)     hpZ: e p_u / G to the G - 1 others of my
//                                                       node only; else as the forward's
//   gradient reduce-scatter (every unit)                q4(s_u) with qgZ (flat), else e s_u
//   qgZ in two hops (M = N/G nodes, qgz_comm_per_step): inside my node, M q4(s_u) to each of
//   the G - 1 others; across, q4(s_u) to each of the M - 1 ranks of my local index on the other
//   nodes. The same bytes in all as the flat all-to-all, (N - 1) q4(s_u), but (M - 1) q4(s_u)
//   across nodes instead of (N - G) q4(s_u): G times fewer.
// With none of the three this is stage3's 3K(N-1)S elements of e bytes.
struct ZeroppComm {
  uint64_t elems = 0;         // the parameters the bytes stand for (the ledger's elems_sent)
  uint64_t bytes = 0;         // all bytes sent
  uint64_t bytes_across = 0;  // of them, to ranks on other nodes
};
ZeroppComm zeropp_comm_per_step(const Layout& L, DType dt, const ZeroppConfig& z, int accum);
// qgZ's part of it alone (the ledger's all_to_all), flat or in two hops as z says; zero without qgZ.
ZeroppComm qgz_comm_per_step(const Layout& L, const ZeroppConfig& z, int accum);

}  // namespace nz
