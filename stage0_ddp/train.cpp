// stage0_ddp — plain data parallelism, the baseline every ZeRO stage is diffed against.
//
// Idea:  a full replica per rank. The gradient is summed locally over the K micro-steps; the last
//        one's backward all-reduces each complete unit (rank order) and averages; every rank then
//        applies the same AdamW to the same numbers, so replicas stay equal (PyTorch's no_sync).
// Holds: params eP, grads eP + eU, Adam m + v 8P (+ master 4P): 16 B/param, N times over.
// Sends: per step, at any K: one all-reduce, 2(N-1)P/N elements per rank.
// Docs:  README.md (the ladder); docs/stages.md (units, slices, the contract); docs/memory.md.
#include <cmath>      // std::sqrt

#include "kernels/ops.h"  // kernels on the run's backend
#include "muon.h"  // StageOptimizer: AdamW, or Muon for the blocks' matrices (--optimizer muon)
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::DDP);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  GPT& model = *run.model;
  Comm& comm = run.comm;

  // ---- model state: everything full-size on every rank ----
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e,
               "grads (summed over my micro-steps)");
  Buffer unit_grad(Category::Grads, Location::Device, L.max_unit_padded * e,
                   "grads (one unit, this micro-step)");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };  // unit u's parameters
  auto G = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };   // unit u's gradient
  auto numel = [&](int u) { return L.units[u].padded; };                    // elements of unit u
  StageOptimizer adam(run, whole_units(L));  // m, v for every element
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, P(u));
  }
  run.unit_access = UnitAccess{[&](int u) -> const void* { return P(u); }};
  // checkpoints hold what this rank holds; --resume restores it here (checkpoint.h)
  run.checkpoint_state(params, ParamsHeld::AllUnits, adam);

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      const bool last_micro_step = k == run.args.accum - 1;
      run.load_micro_batch(step, k);
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) model.forward(u, P(u));
      model.head_forward(P(EMBED));  // adds the batch loss to the step total, on the device
      run.phase("backward");
      model.head_backward(P(EMBED));
      for (int u = L.num_units() - 1; u >= 0; u--) {
        model.backward(u, P(u), unit_grad.data());
        accumulate_grads(dt, G(u), unit_grad.data(), numel(u), 1.0f, k == 0);  // no communication
        if (last_micro_step) {  // unit u's gradient is complete on this rank: synchronise it once
          // all-reduce: every rank gets the sum of every rank's gradient for this unit
          comm.all_reduce(G(u), numel(u), dt);
          average_grads(dt, G(u), numel(u), run.grad_average_scale());
        }
      }
    }
    run.phase("optimizer");
    // global gradient norm, summed in the order the sharded stages sum it (fp16: stored scaled)
    const double norm = std::sqrt(sq_sum_in_rank_order(L, dt, grads.data())) / run.loss_scale();
    const double loss_sum = model.take_loss_sum();  // the micro-steps' summed token losses
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    // every rank updates every parameter, identically
    for (int u = 0; u < L.num_units(); u++) {
      adam.step(u, P(u), G(u), run.lr(), scale, run.adam_step());
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
