// tensor — tensor parallelism (Megatron-LM): split every matrix instead of the batch.
//
// Idea:  the N ranks are D replicas x T tensor ranks, T fastest (tensor.h). Each tensor rank
//        holds 1/T of every matrix: its heads' rows of qkv and columns of attproj, its 4C/T rows
//        of fc and columns of fcproj, its V'/T rows of the tied wte; layer norms, wpe and the
//        biases after a row-parallel matrix are replicated. A block's forward ends each half
//        with an all-reduce of the partial products (g); its backward sums each half's input
//        gradient (f): 4 all-reduces of (b, s, C) per block and micro-batch (tensor/tp_model.h).
//        As in stage0_ddp each rank sums its gradient over the K micro-steps and all-reduces it
//        over its D replicas once per step; every rank then runs AdamW on its pieces.
//        3D (--pipeline P): tensor/pipe3d.cpp runs this step on one of P pipeline segments.
// Holds: 1/T of the matrices, all of the replicated parameters: params e P_t, grads e P_t + e U_t,
//        Adam m + v 8 P_t (+ master 4 P_t) (tensor/formulas.h); activations of width C/T inside
//        attention and the MLP, C at the layer norms and the residual stream.
// Sends: per block and micro-step 4 all-reduces of b s C over the T tensor ranks; per step one
//        all-reduce of my pieces over my D replicas, 2(D-1) P_t / D elements per rank.
// GPU:   --device cuda: the vocabulary's lookup and loss as device kernels (kernel_table.inc:
//        vocab_*), the groups' collectives on device memory; docs/gpu.md.
// Docs:  docs/tensor.md; README.md (the ladder); docs/stages.md.
#include <algorithm>  // std::max, std::min
#include <cmath>      // std::sqrt
#include <vector>

#include "kernels/ops.h"  // kernels on the run's backend
#include "tensor/tp_model.h"  // TensorGPT: my pieces' forward, backward, the conjugate operators
#include "tensor/tensor.h"  // TensorPlan, tensor_layout, for_each_run, set_tensor_hooks
#include "trainer.h"  // Trainer: args, data, logging, reports (all but the tensor idea)

using namespace nz;

int main(int argc, char** argv) {
  // my replica (the data); the Trainer's model only holds the batch: TensorGPT below computes
  Trainer run(argc, argv, Stage::Tensor, tensor_topology);
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = 0;
  Comm& comm = run.comm;

  // ---- the split: the matrices over T tensor ranks, the batch over D replicas (tensor.h) ----
  const TensorPlan plan = tensor_plan(run.args, comm.size(), comm.rank());
  if (plan.segments > 1) return train_3d(run, plan);  // 3D: P pipeline segments (pipe3d.cpp)
  const int TP = plan.tensor, t = plan.t, d = plan.d;
  Comm tp(comm, d, t, "tensor group");  // my replica's T tensor ranks: every layer's all-reduces
  Comm replicas(comm, t, d, "data-parallel group");  // tensor rank t of every replica
  const Layout L = tensor_layout(run.args.cfg, TP, plan.replicas);  // my pieces, padded for D
  TensorGPT model(L, TP, t, tp, dt, run.args.batch, run.args.seq, plan.sp);
  if (comm.rank() == 0 && !run.args.quiet) printf("%s\n", tensor_summary(plan, L.cfg).c_str());
  // end split

  // ---- model state: my pieces of every unit ----
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params (my pieces)");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e,
               "grads (summed over my micro-steps)");
  Buffer unit_grad(Category::Grads, Location::Device, L.max_unit_padded * e,
                   "grads (one unit, this micro-step)");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };  // unit u's parameters
  auto G = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };   // unit u's gradient
  auto numel = [&](int u) { return L.units[u].padded; };                    // elements of unit u
  // ---- ZeRO-1 over the replicas (--zero 1): tensor rank t's D replicas share the optimizer state
  // of its pieces, replica d keeping slice d of every unit, as stage1 on D ranks ----
  const bool zero1 = plan.zero == 1;
  auto owned = [&](int u) { return owned_part(L, plan, u); };  // the optimizer's part (tensor.h)
  auto my_P = [&](int u) { return elem_ptr(params, L.units[u].offset + owned(u).begin, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].offset + owned(u).begin, e); };
  // end ZeRO-1
  AdamW adam(L, owned_parts(L, plan, 0, L.num_units()), dt, run.adamw);  // m, v of my pieces
  init_my_pieces(run, L, plan, 0, L.num_units(), P, adam);  // initial values: my pieces copied out

  // validation, the model file and the memory table's formulas: over my pieces (hooks.cpp)
  set_tensor_hooks(run, plan, L, model, tp, P);

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    model.set_loss_scale(run.loss_scale());
    for (int k = 0; k < run.args.accum; k++) {
      const bool last_micro_step = k == run.args.accum - 1;
      run.load_micro_batch(step, k);  // my replica's micro-batch: the same on my T tensor ranks
      model.set_batch(run.batch_tokens(), run.batch_targets(), run.args.batch);
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) model.forward(u, P(u));
      model.head_forward(P(EMBED));  // adds the batch loss to the step total (every tensor rank)
      run.phase("backward");
      model.head_backward(P(EMBED));
      for (int u = L.num_units() - 1; u >= 0; u--) {
        model.backward(u, P(u), unit_grad.data());
        accumulate_grads(dt, G(u), unit_grad.data(), numel(u), 1.0f, k == 0);  // no communication
        if (last_micro_step) {  // my pieces' gradient over my D replicas, as stage0_ddp on D ranks
          // (ZeRO-1: a reduce-scatter, my slice's sum)
          if (zero1) replicas.reduce_scatter(G(u), my_G(u), owned(u).size(), dt);
          else replicas.all_reduce(G(u), numel(u), dt);
          average_grads(dt, my_G(u), owned(u).size(), run.grad_average_scale());
        }
      }
    }
    run.phase("optimizer");
    // the global gradient norm, every parameter once: each tensor rank adds its pieces of the
    // split tensors; the replicated ones (the same on every tensor rank) tensor rank 0 alone;
    // the replicas hold the same gradients, so replica 0's ranks alone give theirs (--zero 1:
    // replica d its slice d). One sum in rank order (fp16: stored scaled).
    double sq = 0;
    if (d == 0 || zero1)
      for (int u = 0; u < L.num_units(); u++)
        for (const TensorSpec& ts : L.units[u].tensors) {
          const size_t lo = std::max<size_t>(ts.offset, owned(u).begin);
          const size_t hi = std::min<size_t>(ts.offset + ts.numel, owned(u).end);
          if (lo < hi && (t == 0 || !replicated_tensor(ts.name.c_str())))
            NZ_DISPATCH_TRAIN_DTYPE(dt, sq += ops::sum_squares<T>((const T*)G(u) + lo, hi - lo));
        }
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();
    const double my_loss = model.take_loss_sum();  // the same on my T tensor ranks:
    const double loss_sum = t == 0 ? my_loss : 0.0;  // counted once per replica
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    // every rank updates its own pieces; the replicated parameters alike on every tensor rank
    for (int u = 0; u < L.num_units(); u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());
      if (zero1) replicas.all_gather(my_P(u), P(u), owned(u).size(), dt);  // every replica's slice
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
