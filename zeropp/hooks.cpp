// hooks.cpp — what the Trainer asks of ZeRO++ besides training (hooks.h).
#include "zeropp/hooks.h"

#include <cstdio>   // printf
#include <string>
#include <utility>  // std::pair

#include "runtime/check.h"  // user_error
#include "runtime/json.h"   // JsonWriter
#include "trainer.h"        // Trainer: its args, comm, layout and hooks

namespace nz {

ZeroppConfig zeropp_config(const Args& a, const Comm& comm) {
  const int world = comm.size(), hosts = comm.host_nodes(), G = comm.ranks_per_host();
  int node_size = a.node_size > 0 ? a.node_size : a.hpz > 0 ? a.hpz : world;
  if (hosts > 1) {
    if (G == 0)
      user_error("zeropp: the %d ranks run on %d machines, but a machine's ranks are not consecutive or not as "
                 "many on each, expected ranks 0..G-1 on the first machine, G..2G-1 on the next; start them with "
                 "mpiexec -ppn G (or a host file of host:G lines)", world, hosts);
    for (auto [flag, g] : {std::pair{"--hpz", a.hpz}, std::pair{"--ranks-per-node", a.node_size}})
      if (g > 0 && g != G)
        user_error("%s %d: the ranks run on %d machines of %d ranks, and ZeRO++'s nodes are the machines, "
                   "expected %s %d (or none)", flag, g, hosts, G, flag, G);
    node_size = G;
  }
  return {a.qwz, a.hpz, a.qgz, node_size, size_t(a.qw_block), size_t(a.qg_block), a.qgz_flat};
}

void set_zeropp_hooks(Trainer& run) {
  const Args& args = run.args;
  const int world = run.world();
  // (--device cuda: refused by the Trainer, zeropp's line in stages.txt saying cpu-only)
  for (auto [flag, G] : {std::pair{"--hpz", args.hpz}, std::pair{"--ranks-per-node", args.node_size}})
    if (G > 0 && world % G != 0)
      user_error("%s %d: the %d ranks do not make whole nodes of %d, expected a G that divides %d; e.g. %s %d",
                 flag, G, world, G, world, flag, world % 2 == 0 ? world / 2 : world);
  const ZeroppConfig zpp = zeropp_config(args, run.comm);
  // the fits check, --batch auto, the memory table and the report: stage3's bytes and what ZeRO++ adds
  run.hooks.model_state_bytes = [zpp](const Layout& L, DType dt) { return zeropp_state_bytes(L, dt, zpp); };
  // the report: its switches, and its bytes per step (formulas.h) in the layout and accumulation of the run
  run.hooks.report_key = "zeropp";
  run.hooks.report_of = [&run, zpp] {
    const Layout& L = run.layout;
    const ZeroppComm c = zeropp_comm_per_step(L, run.dtype, zpp, run.args.accum);
    JsonWriter j;
    j.begin_object();
    j.kv("qwz", zpp.qwz);
    j.kv("hpz", zpp.hpz);
    j.kv("qgz", zpp.qgz);
    j.kv("qgz_two_hops", qgz_two_hops(zpp, run.world()));  // qgZ inside the node, then across (zeropp/formulas.h)
    j.kv("node_size", zpp.node_size);
    j.kv("qw_block", uint64_t(zpp.qw_block));
    j.kv("qg_block", uint64_t(zpp.qg_block));
    j.kv("pad_block", uint64_t(L.pad_block));  // units padded to N x this: whole blocks per slice
    j.kv("comm_elems_per_step", c.elems);
    j.kv("comm_bytes_per_step", c.bytes);
    j.kv("comm_bytes_across_nodes_per_step", c.bytes_across);
    j.end_object();
    return j.str();
  };
}

void print_zeropp_switches(Trainer& run, const ZeroppConfig& zpp) {
  const Layout& L = run.layout;
  const int G = zpp.hpz;
  const char* nodes_are = run.comm.host_nodes() > 1   ? " (the machines)"
                          : zpp.node_size < L.world ? " (simulated)" : "";
  const bool two_hops = qgz_two_hops(zpp, L.world);
  const std::string qgz_how = !zpp.qgz ? "off" : "int4, blocks of " + std::to_string(zpp.qg_block) +
                              (two_hops ? ", in two hops" : ", one all-to-all");
  if (run.rank() == 0 && !run.args.quiet)
    printf("zeropp: qwZ %s | hpZ %s | qgZ %s | nodes of %d ranks%s | units padded to %zu x %zu\n",
           zpp.qwz ? ("int8, blocks of " + std::to_string(zpp.qw_block)).c_str() : "off",
           G ? ("secondary shard over " + std::to_string(G) + " ranks").c_str() : "off",
           qgz_how.c_str(),
           zpp.node_size, nodes_are, size_t(L.world), L.pad_block);
}

}  // namespace nz
