// stage1 — ZeRO stage 1 (P_os): shard the optimizer states.
//
// Each unit is padded to a multiple of N and rank r owns slice r of every unit. Only the owned
// slices get Adam moments (and, in bf16, an fp32 master copy). As soon as a unit's backward is
// done its gradient is reduce-scattered from the bucket: rank r receives the sum over ranks of
// slice r only, and accumulates it into the owned slice of its gradient buffer. AdamW updates
// only the owned slice; an all-gather then brings every rank the others' updated slices.
//
// The gradient buffer is still full-size, as in stage0, but only the owned slice is ever read:
// that waste is what stage2 removes. Communication per step: reduce-scatter + all-gather move the
// same bytes as stage0's all-reduce. Per rank: params eP, grads eP, Adam 8S (+ master 4S).
#include <cmath>      // std::sqrt

#include "ops.h"      // kernels on the run's backend
#include "trainer.h"  // Trainer: args, model, data, logging, reports (everything but the ZeRO idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Z1);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int rank = run.rank();
  GPT& model = *run.model;
  Comm& comm = run.comm;

  // ---- model state: full params and grads; optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e, "grads");
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  params.zero();
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };  // unit u's parameters
  auto shard = [&](int u) { return L.units[u].padded / L.world; };         // elements I own of unit u
  // P_os: my slice of unit u, in the full buffers (slice `rank`)
  auto my_P = [&](int u) { return elem_ptr(params, L.units[u].offset + L.shard(u, rank).begin, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].offset + L.shard(u, rank).begin, e); };
  AdamW adam(L, owned_shards(L, rank), dt, Location::Device, run.args);  // P_os: m, v for my slices only
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, my_P(u));
  }
  run.params = UnitAccess{[&](int u) -> const void* { return P(u); }};

  for (int step = 0; step < run.args.steps; step++) {
    run.begin_step(step);
    double loss_sum = 0;
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) model.forward(u, P(u));
      loss_sum += model.head_forward(P(EMBED));
      run.phase("backward");
      model.head_backward(P(EMBED));
      for (int u = L.num_units() - 1; u >= 0; u--) {
        model.backward(u, P(u), bucket.data());
        // reduce-scatter: each rank receives only the summed gradient of the slice it owns
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, shard(u), dt);
        accumulate_grads(dt, my_G(u), mine, shard(u), run.grad_average_scale(), k == 0);
      }
    }
    run.phase("optimizer");
    // global gradient norm: each rank sums its slices, then one rank-ordered sum of the partials
    double sq = sq_sum_of_slice_in_full(L, dt, grads.data(), rank);
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq);
    const float scale = clip_scale(norm, run.args.clip);
    for (int u = 0; u < L.num_units(); u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(step), scale, step + 1);  // P_os: update my slice only
      // all-gather: every rank receives every rank's updated slice, so all hold the full model
      comm.all_gather(my_P(u), P(u), shard(u), dt);
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
