// stage0_ddp — plain data parallelism, the baseline every ZeRO stage is diffed against.
//
// Every rank holds the full parameters, the full gradients and the full optimizer state. Each
// rank runs forward and backward on its own micro-batch; as soon as a unit's backward is done,
// its gradient is all-reduced (summed over ranks, in rank order) from one reusable bucket, and
// averaged into the gradient buffer. Then every rank applies the same AdamW update to the same
// numbers, so the replicas stay identical without ever sending a parameter.
//
// Per rank, Ψ parameters (P with padding): params eP, grads eP, Adam m + v 8P (+ master 4P in
// bf16): 16 bytes per parameter, N times over. That redundancy is what ZeRO removes.
#include <cmath>      // std::sqrt

#include "ops.h"      // kernels on the run's backend
#include "trainer.h"  // Trainer: args, model, data, logging, reports (everything but the ZeRO idea)

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
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e, "grads");
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  params.zero();
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };  // unit u's parameters
  auto G = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };   // unit u's gradient
  AdamW adam(L, whole_units(L), dt, Location::Device, run.args);           // m, v for every element
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, P(u));
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
        // all-reduce: every rank gets the sum of every rank's gradient for this unit
        comm.all_reduce(bucket.data(), L.units[u].padded, dt);
        accumulate_grads(dt, G(u), bucket.data(), L.units[u].padded, run.grad_average_scale(), k == 0);
      }
    }
    run.phase("optimizer");
    // global gradient norm, summed slice by slice in the order the sharded stages sum it
    double sq = 0;
    for (int r = 0; r < run.world(); r++) sq += sq_sum_of_slice_in_full(L, dt, grads.data(), r);
    const double norm = std::sqrt(sq);
    const float scale = clip_scale(norm, run.args.clip);
    // every rank updates every parameter, identically
    for (int u = 0; u < L.num_units(); u++) adam.step(u, P(u), G(u), run.lr(step), scale, step + 1);
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
