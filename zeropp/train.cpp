// zeropp — ZeRO++ (Wang et al. 2023): stage3, with less traffic on the links between nodes.
//
// Idea:  stage3, and three switches, each a marked block below. --qwz: a unit's all-gather moves
//        int8 blocks with one fp32 scale per block, dequantized after. --hpz G: nodes of G ranks
//        hold a secondary copy of the parameters sharded over the node, refreshed by each forward
//        gather, so the backward gathers never leave the node. --qgz: the gradient reduce-scatter
//        is an all-to-all of int4 blocks + scales; every block received (my own too) is
//        dequantized, then they are summed in rank order in fp32; with several nodes in two
//        hops, inside the node, then each node's sum quantized again across nodes (--qgz-flat:
//        one). Units are padded to N x block: every slice is whole blocks, counted from the
//        unit's start (kernels/quantize.h).
// Holds: stage3's; + hpZ's secondary shard eP/G; + the quantized buffers (zeropp_state_bytes).
// Sends: stage3's collectives, fewer bytes across nodes (zeropp/formulas.h, zeropp_comm_per_step).
// Docs:  docs/zeropp.md; README.md (the ladder); docs/stages.md.
#include <cmath>      // std::sqrt
#include <cstring>    // memcpy
#include <memory>     // std::unique_ptr

#include "kernels/ops.h"  // kernels on the run's backend
#include "kernels/quantize.h"  // BlockQuant: the block quantizer
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)
#include "zeropp/hooks.h"  // set_zeropp_hooks, zeropp_config

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::ZeroPP, nullptr, set_zeropp_hooks);  // + its flags, bytes, report
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int LNF = L.lnf_unit();
  const int rank = run.rank();
  GPT& model = *run.model;
  Comm& comm = run.comm;
  const ZeroppConfig zpp = zeropp_config(run.args, run.comm);
  comm.set_node_size(zpp.node_size);  // nodes of G: the machines' own, or simulated on one
  const BlockQuant qw{8, zpp.qw_block}, qg{4, zpp.qg_block};  // int8 weights, int4 gradients
  const size_t max_owned = L.max_unit_padded / L.world;

  // ---- model state: params (P_p), gradients and optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.shard_total * e, "params (my slices)");
  Buffer grads(Category::Grads, Location::Device, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  // my slice of unit u, packed in the sharded parameter and gradient buffers
  auto my_P = [&](int u) { return elem_ptr(params, L.units[u].shard_offset, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  AdamW adam(L, owned_shards(L, rank), dt, run.adamw);  // P_os: m, v for my slices only
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.shard(u, rank), my_P(u));  // P_p: only my slice is ever initialised
    adam.init_master(u, my_P(u));
  }

  // ==== begin qwZ: buffers for a unit's slices as int8 blocks + fp32 scales ====
  Buffer qw_mine, qw_all;
  if (zpp.qwz) {
    qw_mine = Buffer(Category::CommBuffers, Location::Device, qw.packed_bytes(max_owned),
                     "qwZ: my slice, int8");
    qw_all = Buffer(Category::CommBuffers, Location::Device, L.world * qw.packed_bytes(max_owned),
                    "qwZ: every rank's slice, int8");
  }
  // ==== end qwZ ====
  // ==== begin hpZ: my node's G ranks, and my 1/G of every unit (the secondary shard) ====
  const int G = zpp.hpz;
  std::unique_ptr<Comm> node;  // the ranks of my node: the backward's gathers stay among them
  Buffer secondary;
  if (G > 0) {
    node = std::make_unique<Comm>(comm, rank / G, rank);
    secondary = Buffer(Category::Params, Location::Device, L.padded_total / G * e,
                       "hpZ secondary shard");
  }
  // my part of unit u's secondary shard: elements [g p/G, (g+1) p/G), g = my rank in the node
  auto my_secondary = [&](int u) { return elem_ptr(secondary, L.units[u].offset / G, e); };
  auto refresh_secondary = [&](int u, const void* full) {  // from the unit just gathered
    if (G == 0) return;
    const size_t part = L.units[u].padded / G;
    memcpy(my_secondary(u), static_cast<const char*>(full) + (rank % G) * part * e, part * e);
  };
  bool in_backward = false;  // the gathers of the backward come from the secondary shard
  // ==== end hpZ ====

  // ---- gather and release: a unit's full parameters exist only while it is in use ----
  std::vector<Buffer> gathered(L.num_units());        // unit u's full params (ledger: gathered)
  std::vector<CommRequest> in_flight(L.num_units());  // unit u's all-gather, until waited for
  std::vector<char> as_int8(L.num_units(), 0);        // qwZ: unit u's gather in flight is int8
  // all-gather, started: every rank's slice of unit u, into a fresh buffer of the unit's size
  auto gather_start = [&](int u) {
    const Unit& unit = L.units[u];
    gathered[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e,
                         "gathered " + unit.name);
    as_int8[u] = 0;
    if (G > 0 && in_backward) {  // hpZ: the node's secondary shards, inside the node
      in_flight[u] = node->all_gather_start(my_secondary(u), gathered[u].data(), unit.padded / G,
                                            dt);
    } else if (zpp.qwz) {  // qwZ: my slice as int8 blocks + scales; every rank's arrives
      const size_t n = owned(u);
      const std::string what = "qwZ: " + unit.name + "'s parameters";  // named if one is NaN
      quantize_finite(qw, dt, my_P(u), n, qw_mine.data(), what.c_str());
      const size_t wire = qw.packed_bytes(n);
      in_flight[u] = comm.all_gather_packed_start(qw_mine.data(), qw_all.data(), wire, n);
      as_int8[u] = 1;
    } else {
      in_flight[u] = comm.all_gather_start(my_P(u), gathered[u].data(), owned(u), dt);
    }
  };
  // unit u's full parameters: gathered now, or the prefetch already started is waited for
  auto gather_unit = [&](int u) -> const void* {
    if (gathered[u].empty()) gather_start(u);
    comm.wait(in_flight[u]);
    if (as_int8[u]) {  // qwZ: dequantize every rank's blocks into the unit (before another gather)
      const size_t n = owned(u), wire = qw.packed_bytes(n);
      for (int r = 0; r < L.world; r++)
        dequantize_packed(qw, static_cast<char*>(qw_all.data()) + r * wire, n, dt,
                          elem_ptr(gathered[u], r * n, e));
      as_int8[u] = 0;
    }
    return gathered[u].data();
  };
  // prefetch: start the next unit's all-gather before this unit computes, so the two overlap
  auto prefetch = [&](int u) { if (run.args.prefetch) gather_start(u); };
  auto release_unit = [&](int u) { gathered[u].release(); };  // release: only my slice stays
  // The prefetch order: the unit a micro-step needs after unit u (FSDP2 records it in its first
  // forward; here it is written down). Forward: embed, blocks, lnf, then the embedding again for
  // the LM head. Backward: lnf down to block 0; the embedding's backward needs no parameters.
  auto prefetch_after_forward = [&](int u) { prefetch(u < LNF ? u + 1 : EMBED); };
  auto prefetch_after_backward = [&](int u) { if (u - 1 > EMBED) prefetch(u - 1); };
  // validation and the model file see the parameters themselves, not their int8 view
  auto gather_exact = [&](int u) -> const void* {
    gathered[u] = Buffer(Category::Gathered, Location::Device, L.units[u].padded * e,
                         "gathered " + L.units[u].name);
    comm.all_gather(my_P(u), gathered[u].data(), owned(u), dt);
    return gathered[u].data();
  };
  run.unit_access = UnitAccess{gather_exact, release_unit};
  // checkpoints hold what this rank holds; --resume restores it here (checkpoint.h)
  run.checkpoint_state(params, ParamsHeld::OwnSlices, adam);

  // ==== begin qgZ: the gradient reduce-scatter as all-to-alls of int4 blocks ====
  // With M = N/G nodes of G > 1 ranks (unless --qgz-flat), the paper's two hops. Rank k G + l is
  // local rank l of node k; slice j of a unit is rank j's.
  //   hop 1, in my node: quantize every slice of my gradient (my own too); local rank l gets the
  //     M slices k G + l; dequantize, add the G ranks' blocks in local order, in fp32.
  //   hop 2, among the M ranks of my local index: quantize those M node sums again (from fp32);
  //     node k's rank gets its own; dequantize, add the M nodes' blocks in node order, in fp32.
  // Mine: sum over k of dq(q( sum over l of dq(q(g[k G + l])) )), tests/zeropp/fake_quant_ddp.cpp.
  // Across nodes a rank sends M - 1 slices instead of N - G: G times fewer bytes (docs/zeropp.md).
  const bool two_hops = qgz_two_hops(zpp, L.world);
  const int GN = zpp.node_size, M = L.world / GN;  // ranks per node, nodes
  Buffer qg_all, qg_sum, qg_part, qg_node;
  std::unique_ptr<Comm> in_node, across;  // hop 1: my node; hop 2: my local index on every node
  if (zpp.qgz) {
    qg_all = Buffer(Category::CommBuffers, Location::Device, L.world * qg.packed_bytes(max_owned),
                    "qgZ: a slice per rank, int4");
    qg_sum = Buffer(Category::CommBuffers, Location::Device, 4 * max_owned,
                    "qgZ: my slice's sum (fp32)");
    qg_part = Buffer(Category::CommBuffers, Location::Device, 4 * max_owned,
                     "qgZ: one rank's blocks (fp32)");
  }
  if (two_hops) {
    qg_node = Buffer(Category::CommBuffers, Location::Device, 4 * size_t(M) * max_owned,
                     "qgZ: my node's sums of M slices (fp32)");
    in_node = std::make_unique<Comm>(comm, rank / GN, rank);  // ranked by local index
    across = std::make_unique<Comm>(comm, rank % GN, rank);   // ranked by node
  }
  auto reduce_scatter_int4_two_hops = [&](int u, void* mine) {
    const size_t n = owned(u), q = qg.packed_bytes(n);
    char* buf = static_cast<char*>(qg_all.data());
    float* node = static_cast<float*>(qg_node.data());  // node + k n: my node's sum, my k-th slice
    float* part = static_cast<float*>(qg_part.data());
    for (int l = 0; l < GN; l++)  // hop 1: part l M + k is slice k GN + l, for local rank l
      for (int k = 0; k < M; k++)
        quantize_packed(qg, dt, elem_ptr(bucket, (k * GN + l) * n, e), n, buf + (l * M + k) * q);
    in_node->all_to_all_packed(buf, M * q, M * n);  // part l M + k: local rank l's blocks
    for (int k = 0; k < M; k++)
      for (int l = 0; l < GN; l++) {
        dequantize_packed(qg, buf + (l * M + k) * q, n, DType::F32, l == 0 ? node + k * n : part);
        if (l > 0) for (size_t i = 0; i < n; i++) node[k * n + i] += part[i];
      }
    for (int k = 0; k < M; k++)  // hop 2: part k is my node's sum for node k, quantized again
      quantize_packed(qg, DType::F32, node + k * n, n, buf + k * q);
    across->all_to_all_packed(buf, q, n);  // part k: node k's sum of MY slice
    float* total = static_cast<float*>(qg_sum.data());
    for (int k = 0; k < M; k++) {  // hop 2's sum, in node order
      dequantize_packed(qg, buf + k * q, n, DType::F32, k == 0 ? total : part);
      if (k > 0) for (size_t i = 0; i < n; i++) total[i] += part[i];
    }
    from_f32(dt, total, n, mine);  // the sum, in the storage type
  };
  auto reduce_scatter_int4 = [&](int u, void* mine) {
    if (two_hops) return reduce_scatter_int4_two_hops(u, mine);  // nodes of more than one rank
    // begin exercise: zeropp_qgz_reduce
    const size_t n = owned(u), wire = qg.packed_bytes(n);
    char* slot = static_cast<char*>(qg_all.data());
    float* sum = static_cast<float*>(qg_sum.data());
    float* part = static_cast<float*>(qg_part.data());
    for (int r = 0; r < L.world; r++)  // quantize each rank's slice of my gradient, my own too
      quantize_packed(qg, dt, elem_ptr(bucket, r * n, e), n, slot + r * wire);
    comm.all_to_all_packed(slot, wire, n);  // all-to-all: slot r is now rank r's part of MY slice
    for (int r = 0; r < L.world; r++) {     // dequantize every block, add in rank order, in fp32
      dequantize_packed(qg, slot + r * wire, n, DType::F32, r == 0 ? sum : part);
      if (r > 0) for (size_t i = 0; i < n; i++) sum[i] += part[i];
    }
    from_f32(dt, sum, n, mine);  // the sum, in the storage type
    // end exercise: zeropp_qgz_reduce
  };
  // ==== end qgZ ====
  print_zeropp_switches(run, zpp);  // rank 0's one line: which switches, nodes of how many ranks

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) {
        const void* p = gather_unit(u);       // all-gather: unit u, just before it runs
        refresh_secondary(u, p);              // hpZ: my node's copy of this step's parameters
        prefetch_after_forward(u);            // prefetch: the next unit (after lnf, the LM head's)
        model.forward(u, p);
        release_unit(u);                      // release: unit u, until it is needed again
      }
      const void* wte = gather_unit(EMBED);   // all-gather: the embedding again, for the LM head
      in_backward = true;                     // hpZ: from here the gathers stay inside the node
      prefetch(LNF);                          // prefetch: the first unit of the backward
      model.head_forward(wte);  // adds the batch loss to the step total, on the device
      run.phase("backward");
      model.head_backward(wte);
      release_unit(EMBED);                    // release: the LM head is done with the embedding
      for (int u = L.num_units() - 1; u >= 0; u--) {
        // all-gather: unit u again for its backward; the embedding's backward needs no parameters
        const void* p = u == EMBED ? nullptr : gather_unit(u);
        prefetch_after_backward(u);           // prefetch: the next unit of the backward
        model.backward(u, p, bucket.data());
        release_unit(u);                      // release: unit u, until the next forward
        // reduce-scatter, every micro-step: each rank receives only the summed gradient of the
        // slice it owns; the embedding's comes last, once: the LM head's part and the lookups'
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        if (zpp.qgz) reduce_scatter_int4(u, mine);  // qgZ: int4 blocks, summed after dequantizing
        else comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);
      }
      in_backward = false;  // hpZ: the next forward (and validation) gathers the whole world's
    }
    run.phase("optimizer");
    // global gradient norm: each rank sums its slices, then one rank-ordered sum of the partials
    double sq = sq_sum_of_shard(L, dt, grads.data());
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();  // fp16: the gradients are stored scaled
    const double loss_sum = model.take_loss_sum();  // the micro-steps' summed token losses
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());  // P_os: my slice only
      // no all-gather here: the next forward gathers each unit (and refreshes hpZ's copy)
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
