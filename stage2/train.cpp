// stage2 — ZeRO stage 2 (P_os+g): shard the gradients too.
//
// Idea:  a unit's full gradient exists only in one reused bucket until its reduce-scatter; I keep
//        my slice, so every micro-step reduce-scatters each unit and adds the slice into mine
//        (a stage 2 that overwrote it would silently train on the last micro-batch only).
// Holds: params eP, grads eS + one bucket eU, Adam m + v 8S (+ master 4S).
// Sends: per step: K reduce-scatters + one all-gather, (K+1)(N-1)P/N elements per rank.
// Docs:  README.md (the ladder); docs/stages.md (units, slices, the contract); docs/memory.md.
#include <cmath>      // std::sqrt

#include "kernels/ops.h"  // kernels on the run's backend
#include "muon.h"  // StageOptimizer: AdamW, or Muon for the blocks' matrices (--optimizer muon)
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Z2);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int rank = run.rank();
  GPT& model = *run.model;
  Comm& comm = run.comm;

  // ---- model state: full params; gradients and optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params");
  Buffer grads(Category::Grads, Location::Device, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };  // unit u's parameters
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  // my slice of unit u: in the full parameter buffer, and packed in the sharded gradient buffer
  auto my_P = [&](int u) {
    return elem_ptr(params, L.units[u].offset + L.shard(u, rank).begin, e);
  };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  StageOptimizer adam(run, owned_shards(L, rank));  // P_os: m, v for my slices only
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, my_P(u));
  }
  run.unit_access = UnitAccess{[&](int u) -> const void* { return P(u); }};
  // checkpoints hold what this rank holds; --resume restores it here (checkpoint.h)
  run.checkpoint_state(params, ParamsHeld::AllUnits, adam);

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) model.forward(u, P(u));
      model.head_forward(P(EMBED));  // adds the batch loss to the step total, on the device
      run.phase("backward");
      model.head_backward(P(EMBED));
      for (int u = L.num_units() - 1; u >= 0; u--) {
        model.backward(u, P(u), bucket.data());
        // begin exercise: stage2_reduce_scatter
        // reduce-scatter, every micro-step: each rank receives only the summed gradient of the
        // slice it owns; the rest of the unit's gradient dies with the bucket's next use (P_g)
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);
        // end exercise: stage2_reduce_scatter
      }
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
      // all-gather: every rank receives every rank's updated slice, so all hold the full model
      comm.all_gather(my_P(u), P(u), owned(u), dt);
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
