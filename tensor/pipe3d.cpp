// pipe3d.cpp — 3D parallelism: the tensor rung's step on one pipeline segment (--pipeline P).
//
// N = P x D x T ranks, T fastest, then D, then P (Megatron's order, tensor.h): rank r is tensor rank
// t = r % T of replica d = r / T % D in segment p = r / (T D). The pipeline rung's plan decides the rest
// (pipeline/pipeline.h, reused): the segments' units (the partition, --partition), the order of
// forwards and backwards on a segment (segment_ops: GPipe or 1F1B, the backwards in ascending
// micro-batch order) and how many micro-batches' activations a segment keeps (activation_slots).
//   inside a segment   the T tensor ranks run TensorGPT on their pieces of the segment's units: the
//                      all-reduces of every layer stay inside the segment (tensor/tp_model.h)
//   between segments   the (b, s, C) activation and its gradient, point to point, tensor rank t to
//                      tensor rank t: each sends its own copy (--sequence-parallel: its b s/T rows)
//   over the replicas  once per step, each unit's gradient (tensor rank t of segment p in every
//                      replica), all-reduced or, with --zero 1, reduce-scattered (ZeRO-1)
// The tied wte crosses the pipeline as in pipeline/train.cpp: the first segment owns each tensor
// rank's vocabulary rows (the lookup); the last keeps a copy of the same rows for the LM head,
// sends the head's part of their gradient back after each micro-batch's backward (the first
// segment's backward(embed) then adds the lookup's part, as without a pipeline), and receives the
// updated rows after each step.
#include <algorithm>  // std::max, std::min
#include <cmath>      // std::sqrt
#include <cstring>    // memcpy
#include <memory>     // std::make_shared
#include <vector>

#include "kernels/ops.h"          // kernels on the run's backend
#include "pipeline/pipeline.h"    // PipelinePlan, segment_ops, activation_slots, PipeTag (the pipeline rung's plan)
#include "tensor/formulas.h"      // tensor3d_state_bytes, tensor_activation_bytes
#include "tensor/tensor.h"        // TensorPlan, tensor_layout, for_each_run
#include "tensor/tp_model.h"      // TensorGPT, TensorSegment
#include "trainer.h"              // Trainer

namespace nz {

namespace {

// The pipeline rung's plan over the N/T tensor groups: segment p of replica d is its "rank" p D + d,
// so its segment and replica are (p, d) and its partition and schedule are the pipeline rung's.
PipelinePlan segment_plan(const Args& a, const TensorPlan& plan, int world, int rank) {
  PipelinePlan pipe = make_pipeline_plan(a.cfg, world / plan.tensor, rank / plan.tensor, plan.segments, a.schedule,
                                         a.partition, a.zero);
  NZ_CHECK(pipe.segment == plan.p && pipe.replica == plan.d, "3D placement: segment %d replica %d vs %d %d", pipe.segment,
           pipe.replica, plan.p, plan.d);
  return pipe;
}

}  // namespace

int train_3d(Trainer& run, const TensorPlan& plan) {
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  Comm& comm = run.comm;
  const int TP = plan.tensor, t = plan.t, d = plan.d, p = plan.p, P = plan.segments, D = plan.replicas;
  const int K = run.args.accum, EMBED = 0;
  const PipelinePlan pipe = segment_plan(run.args, plan, comm.size(), comm.rank());
  const int u0 = pipe.first(), u1 = pipe.end();  // my segment's units: [u0, u1)
  const bool first = p == 0, last = p == P - 1;
  // my segment's T tensor ranks in my replica: every layer's all-reduces
  Comm tp(comm, p * D + d, t, "tensor group");
  // tensor rank t of segment p in every replica: the data-parallel group
  Comm replicas(comm, p * TP + t, d, "data-parallel group");
  const int peer_t = t;                 // the tensor rank I exchange activations with in the neighbour segments
  const int prev = plan.rank_of(peer_t, d, p - 1), next = plan.rank_of(peer_t, d, p + 1);
  const Layout L = tensor_layout(run.args.cfg, TP, D);  // my pieces of every unit (of mine: [u0, u1))
  const int slots = activation_slots(pipe.schedule, P, p, K);
  TensorGPT model(L, TP, t, tp, dt, run.args.batch, run.args.seq, plan.sp, TensorSegment{u0, u1, slots});
  if (comm.rank() == 0 && !run.args.quiet) printf("%s\n", tensor_summary(plan, L.cfg).c_str());

  // ---- model state: my pieces of my segment's units ----
  const size_t base = L.units[u0].offset;
  const size_t my_elems = (u1 == L.num_units() ? L.padded_total : L.units[u1].offset) - base;
  size_t my_max_unit = 0;
  for (int u = u0; u < u1; u++) my_max_unit = std::max(my_max_unit, L.units[u].padded);
  Buffer params(Category::Params, Location::Device, my_elems * e, "params (my pieces of my segment's units)");
  Buffer grads(Category::Grads, Location::Device, my_elems * e, "grads (summed over my micro-batches)");
  Buffer unit_grad(Category::Grads, Location::Device, my_max_unit * e, "grads (one unit, this micro-batch)");
  auto at = [&](int u) { return L.units[u].offset - base; };
  auto param = [&](int u) { return elem_ptr(params, at(u), e); };  // my pieces of unit u
  auto grad = [&](int u) { return elem_ptr(grads, at(u), e); };    // their gradient
  auto numel = [&](int u) { return L.units[u].padded; };
  // ZeRO-1 over the replicas, as tensor/train.cpp: replica d keeps slice d of each of my units
  const bool zero1 = plan.zero == 1;
  auto owned = [&](int u) { return owned_part(L, plan, u); };
  auto my_P = [&](int u) { return elem_ptr(params, at(u) + owned(u).begin, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, at(u) + owned(u).begin, e); };
  AdamW adam(L, owned_parts(L, plan, u0, u1), dt, run.adamw);
  init_my_pieces(run, L, plan, u0, u1, param, adam);  // the whole units' initial values, my pieces copied out

  // ---- the tied wte crosses the pipeline (as pipeline/train.cpp): my vocabulary rows, tensor rank
  // t of the first segment to tensor rank t of the last ----
  const size_t wte_elems = L.units[EMBED].tensors[0].numel;  // my V'/T rows of wte
  const int first_rank = plan.rank_of(t, d, 0), last_rank = plan.rank_of(t, d, P - 1);
  Buffer head_wte, head_grad;
  if (last) {
    head_wte = Buffer(Category::Params, Location::Device, wte_elems * e, "wte (my rows, the LM head's copy: tied)");
    head_grad = Buffer(Category::Grads, Location::Device, wte_elems * e, "the head's d wte (to the first segment)");
  }
  const void* head_weights = last ? head_wte.data() : nullptr;
  auto send_tied_weights = [&]() {
    if (first) {
      CommRequest sent = comm.send_start(param(EMBED), wte_elems, dt, last_rank, kTiedWeights);
      comm.wait(sent);
    }
    if (last) comm.recv(head_wte.data(), wte_elems, dt, first_rank, kTiedWeights);
  };
  send_tied_weights();
  set_3d_hooks(run, plan, pipe, L, model, tp, param, head_weights);  // validation, model file, formulas

  std::vector<CommRequest> output_sent(slots);  // each slot's output, to the next segment
  CommRequest grad_sent, head_grad_sent;
  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    model.set_loss_scale(run.loss_scale());
    // the pipeline rung's order of forwards and backwards on my segment: the backwards in ascending
    // micro-batch order, so each unit's gradient sums the micro-batches as tensor/train.cpp does
    for (const PipeOp& op : segment_ops(pipe.schedule, P, p, K)) {
      const int k = op.micro;
      model.use_slot(k % slots);
      if (op.forward) {
        run.phase("forward");
        comm.wait(output_sent[k % slots]);  // the slot's output has left
        run.load_micro_batch(step, k);      // my replica's micro-batch k (tokens: first segment; targets: last)
        model.set_batch(run.batch_tokens(), run.batch_targets(), run.args.batch);
        if (!first) comm.recv(model.segment_input(), model.boundary_elems(), dt, prev, kActivation);
        for (int u = u0; u < u1; u++) model.forward(u, param(u));
        if (last) model.head_forward(head_weights);  // adds the batch loss to the step total
        else output_sent[k % slots] = comm.send_start(model.segment_output(), model.boundary_elems(), dt, next,
                                                      kActivation);
        continue;
      }
      run.phase("backward");
      comm.wait(grad_sent);  // the activation gradient's buffer is free again
      if (last) model.head_backward(head_weights);
      else comm.recv(model.activation_grad(), model.boundary_elems(), dt, next, kActivationGrad);
      for (int u = u1 - 1; u >= u0; u--) {
        if (u == EMBED)  // the head's part of my wte rows' gradient, micro-batch k, from the last segment
          comm.recv(unit_grad.data(), wte_elems, dt, last_rank, kHeadGrad);
        model.backward(u, param(u), unit_grad.data());
        accumulate_grads(dt, grad(u), unit_grad.data(), numel(u), 1.0f, k == 0);
        if (k == K - 1) {  // complete on my segment: over my replicas once (ZeRO-1: my slice's sum)
          if (zero1) replicas.reduce_scatter(grad(u), my_G(u), owned(u).size(), dt);
          else replicas.all_reduce(grad(u), numel(u), dt);
          average_grads(dt, my_G(u), owned(u).size(), run.grad_average_scale());
        }
      }
      if (!first) grad_sent = comm.send_start(model.activation_grad(), model.boundary_elems(), dt, prev,
                                              kActivationGrad);
      if (last) {  // the head's part of the tied gradient, to the first segment
        comm.wait(head_grad_sent);
        model.head_weight_backward(head_grad.data());
        head_grad_sent = comm.send_start(head_grad.data(), wte_elems, dt, first_rank, kHeadGrad);
      }
    }
    for (CommRequest& r : output_sent) comm.wait(r);
    comm.wait(grad_sent);
    comm.wait(head_grad_sent);
    run.phase("optimizer");
    // the norm as tensor/train.cpp adds it, each rank over its segment's units; one sum in rank
    // order (segment 0's ranks first: the reference adds segment by segment, tp_reference.h)
    double sq = 0;
    if (d == 0 || zero1)
      for (int u = u0; u < u1; u++)
        for (const TensorSpec& ts : L.units[u].tensors) {
          const size_t lo = std::max<size_t>(ts.offset, owned(u).begin);
          const size_t hi = std::min<size_t>(ts.offset + ts.numel, owned(u).end);
          if (lo < hi && (t == 0 || !replicated_tensor(ts.name.c_str())))
            NZ_DISPATCH_TRAIN_DTYPE(dt, sq += ops::sum_squares<T>((const T*)grad(u) + lo, hi - lo));
        }
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();
    const double my_loss = model.take_loss_sum();           // the last segment's; 0 elsewhere
    const double loss_sum = last && t == 0 ? my_loss : 0.0;  // counted once per replica
    if (run.skip_step(step, loss_sum, norm)) continue;
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = u0; u < u1; u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());
      if (zero1) replicas.all_gather(my_P(u), param(u), owned(u).size(), dt);
    }
    send_tied_weights();  // the updated rows back to the head's copy
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}

void set_3d_hooks(Trainer& run, const TensorPlan& plan, const PipelinePlan& pipe, const Layout& L, TensorGPT& model,
                  Comm& tp, std::function<void*(int u)> P, const void* head_weights) {
  Comm& comm = run.comm;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int T = plan.tensor, t = plan.t, d = plan.d, p = plan.p;
  const bool first = p == 0, last = p == plan.segments - 1;
  const int prev = plan.rank_of(t, d, p - 1), next = plan.rank_of(t, d, p + 1);
  // validation: a forward through every segment, as in training (the loss on the last)
  run.hooks.forward_loss = [&run, &comm, &model, pipe, P, head_weights, dt, first, last, prev, next, t]() -> double {
    model.use_slot(0);
    model.set_batch(run.batch_tokens(), run.batch_targets(), run.model->rows());
    if (!first) comm.recv(model.segment_input(), model.boundary_elems(), dt, prev, kActivation);
    for (int u = pipe.first(); u < pipe.end(); u++) model.forward(u, P(u));
    if (last) {
      model.head_forward(head_weights);
      const double s = model.take_loss_sum();
      return t == 0 ? s : 0.0;
    }
    CommRequest sent = comm.send_start(model.segment_output(), model.boundary_elems(), dt, next, kActivation);
    comm.wait(sent);
    return 0.0;
  };
  // the model file: replica 0 of the segment that holds unit u gathers its pieces over its tensor
  // ranks; its tensor rank 0 sends the whole unit to rank 0, which writes
  const Layout& full = run.layout;
  auto gathered = std::make_shared<std::vector<char>>(L.max_unit_padded * T * e);
  auto whole = std::make_shared<std::vector<char>>(full.max_unit_padded * e);
  auto outgoing = std::make_shared<Buffer>();  // the GPU: a device copy of the unit to send (NCCL sends device
                                               // memory only)
  run.unit_access = UnitAccess{[&comm, &tp, &L, &full, plan, pipe, P, dt, e, gathered, whole,
                                outgoing](int u) -> const void* {
    const int owner = pipe.segment_of_unit(u), T = plan.tensor;
    const size_t n_full = full.units[u].padded;
    if (plan.p == owner && plan.d == 0) {
      const size_t n = L.units[u].padded;
      tp.all_gather(P(u), gathered->data(), n, dt);
      for (int r = 0; r < T; r++)
        for_each_run(full, L, u, T, r, [&](size_t at, size_t local, size_t count) {
          memcpy(whole->data() + at * e, gathered->data() + (r * n + local) * e, count * e);
        });
      if (plan.t == 0 && comm.rank() != 0) {
        const void* from = whole->data();
        if (current_device() == Device::CUDA) {
          if (outgoing->bytes() == 0)
            *outgoing = Buffer(Category::Scratch, Location::Device, whole->size(), "a model file unit, to rank 0");
          copy_bytes(outgoing->data(), Location::Device, whole->data(), Location::Host, n_full * e);
          from = outgoing->data();
        }
        CommRequest sent = comm.send_start(from, n_full, dt, 0, kModelFile);
        comm.wait(sent);
      }
      return whole->data();
    }
    if (comm.rank() != 0) return nullptr;  // only rank 0 writes
    comm.recv(whole->data(), n_full, dt, plan.rank_of(0, 0, owner), kModelFile);
    return whole->data();
  }};
  // the memory table's formulas: rank r's segment's (formulas.h)
  auto seg_of = [plan](int r) { return r / (plan.tensor * plan.replicas); };
  run.hooks.state_formula = [&L, dt, plan, pipe, seg_of](int r) {
    const int s = seg_of(r);
    return tensor3d_state_bytes(L, dt, plan.zero, pipe.first_unit[s], pipe.first_unit[s + 1], s == plan.segments - 1);
  };
  run.hooks.activation_formula = [&run, dt, plan, pipe, seg_of](int r) {
    const int s = seg_of(r);
    return tensor_activation_bytes(run.args.cfg, plan.tensor, dt, run.args.batch, run.args.seq, plan.sp,
                                   pipe.first_unit[s], pipe.first_unit[s + 1],
                                   activation_slots(pipe.schedule, plan.segments, s, run.args.accum));
  };
  run.hooks.report_key = "tensor";
  run.hooks.report_json = tensor3d_report_json(run.args.cfg, plan, pipe, L, dt, run.args.batch, run.args.seq,
                                               run.args.accum);
}

}  // namespace nz
