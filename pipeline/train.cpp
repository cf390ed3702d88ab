// pipeline — pipeline parallelism: split the layers instead of the batch.
//
// Idea:  the N ranks are P segments x D replicas (pipeline.h). Segment s holds a contiguous run of
//        units and nothing of the others'. Micro-batch k goes forward segment by segment (its
//        activations sent to the next segment) and comes back (their gradients sent to the
//        previous one), in the schedule's order: GPipe runs all K forwards first, 1F1B a backward
//        as soon as it can. While the pipeline fills and drains a segment waits: the bubble,
//        (P-1)/(K+P-1). As in stage0_ddp each segment sums its gradients over the K micro-batches
//        and all-reduces them over its D replicas once per step: stage0_ddp on D ranks with
//        --accum K, bit for bit. The tied embedding crosses the pipeline (a marked block).
// Holds: my units only: params eP_s, grads eP_s + eU_s, Adam m + v 8P_s (+ master 4P_s); the
//        activations of K (GPipe) or min(P-s, K) (1F1B) micro-batches (pipeline/formulas.h).
// Sends: per micro-batch BTC activations forward and BTC gradients back, point to point; per
//        step one all-reduce of my units over my D replicas, 2(D-1)P_s/D elements per rank.
// Docs:  docs/pipeline.md; README.md (the ladder); docs/stages.md.
#include <cmath>      // std::sqrt
#include <vector>

#include "kernels/ops.h"  // kernels on the run's backend
#include "pipeline/formulas.h"  // PipelinePlan, segment_ops, SegmentClock (pipeline.h); the bytes
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the pipeline idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Pipeline, pipeline_topology);  // my segment's units, my replica
  const Layout& L = run.layout;  // padded for the D replicas, as stage0_ddp on D ranks pads it
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  GPT& model = *run.model;  // my segment's units, with its activation slots
  Comm& comm = run.comm;

  // ---- the split: the layers over P segments, the batch over D replicas (pipeline.h) ----
  const PipelinePlan pipe = pipeline_plan(run.args, comm.size(), comm.rank());
  const int s = pipe.segment, d = pipe.replica, K = run.args.accum;
  const bool first = s == 0, last = s == pipe.segments - 1;
  const int u0 = pipe.first(), u1 = pipe.end();  // my units: [u0, u1)
  // my neighbours in my replica: the previous segment sends me activations, the next gradients
  const int prev = pipe.rank_of(s - 1, d), next = pipe.rank_of(s + 1, d);
  Comm replicas(comm, s, d);  // my segment in every replica: the data-parallel group
  const size_t act_elems = size_t(run.args.batch) * run.args.seq * L.cfg.dim;  // (B,T,C)
  // end split

  // ---- model state: my segment's units only ----
  const size_t base = L.units[u0].offset;  // where my units start in the full layout
  const size_t my_elems = (u1 == L.num_units() ? L.padded_total : L.units[u1].offset) - base;
  size_t my_max_unit = 0;
  for (int u = u0; u < u1; u++) my_max_unit = std::max(my_max_unit, L.units[u].padded);
  Buffer params(Category::Params, Location::Device, my_elems * e, "params (my segment's units)");
  Buffer grads(Category::Grads, Location::Device, my_elems * e,
               "grads (summed over my micro-batches)");
  Buffer unit_grad(Category::Grads, Location::Device, my_max_unit * e,
                   "grads (one unit, this micro-batch)");
  auto at = [&](int u) { return L.units[u].offset - base; };  // unit u, in my buffers
  auto P = [&](int u) { return elem_ptr(params, at(u), e); };  // unit u's parameters
  auto G = [&](int u) { return elem_ptr(grads, at(u), e); };   // unit u's gradient
  auto numel = [&](int u) { return L.units[u].padded; };  // elements of unit u
  // ---- ZeRO-1 inside the replicas (--zero 1): my segment's D replicas share its optimizer state,
  // each keeping slice d of every unit, as stage1 on D ranks (2, 3 do not fit: pipeline.cpp) ----
  const bool zero1 = pipe.zero == 1;
  auto owned = [&](int u) { return zero1 ? L.shard(u, d) : L.full(u); };  // the optimizer's part
  auto my_P = [&](int u) { return elem_ptr(params, at(u) + owned(u).begin, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, at(u) + owned(u).begin, e); };
  std::vector<Slice> mine(L.num_units(), Slice{0, 0});
  for (int u = u0; u < u1; u++) mine[u] = owned(u);
  // end ZeRO-1
  AdamW adam(L, mine, dt, run.adamw);  // m, v for my units' elements (--zero 1: my slice of them)
  for (int u = u0; u < u1; u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, my_P(u));
  }

  // ---- tied weights cross the pipeline: the first segment owns wte (the token lookup); the last
  // keeps a copy for the LM head and sends the head's d wte back each micro-batch ----
  const int first_rank = pipe.rank_of(0, d), last_rank = pipe.rank_of(pipe.segments - 1, d);
  const size_t wte_elems = size_t(L.cfg.vocab) * L.cfg.dim;  // (V,C)
  const bool tied_across = last && !first;
  Buffer head_wte, head_grad;
  if (tied_across) {
    head_wte = Buffer(Category::Params, Location::Device, wte_elems * e,
                      "wte (the LM head's copy: tied)");
    head_grad = Buffer(Category::Grads, Location::Device, wte_elems * e,
                       "the head's d wte (to the first segment)");
  }
  const void* head_weights = tied_across ? head_wte.data() : last ? P(EMBED) : nullptr;
  auto send_tied_weights = [&]() {  // the first segment's wte to the last segment's copy
    if (first && !last) {
      CommRequest sent = comm.send_start(P(EMBED), wte_elems, dt, last_rank, kTiedWeights);
      comm.wait(sent);
    }
    if (tied_across) comm.recv(head_wte.data(), wte_elems, dt, first_rank, kTiedWeights);
  };
  // end tied weights
  // checkpoints hold what this rank holds; --resume restores it here (checkpoint.h)
  run.checkpoint_state(params, ParamsHeld::SegmentUnits, adam);  // my segment's units
  send_tied_weights();  // the head's copy starts as the first segment's wte: initial, or resumed

  // validation, the model file and the memory table's formulas cross the segments (hooks.cpp)
  set_pipeline_hooks(run, pipe, P, head_weights);

  // ---- sends and the bubble: a send returns at once (two segments that both send first would
  // deadlock on blocking ones); a buffer is written again only once its last send is seen
  // through. The segment clock counts each wait, for a receive or a send: the bubble ----
  std::vector<CommRequest> output_sent(model.slots());  // each slot's output, to the next segment
  CommRequest grad_sent, head_grad_sent;
  SegmentClock clock;
  // end sends

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    clock.computing();
    // The schedule's order of forwards and backwards on my segment (pipeline.h). Both schedules
    // run the backwards in ascending micro-batch order: each unit's gradient then sums the
    // micro-batches in stage0_ddp's order, and the tied embedding adds head and lookup as it
    // does: bit for bit.
    for (const PipeOp& op : segment_ops(pipe.schedule, pipe.segments, s, K)) {
      const int k = clock.start(op);  // micro-batch k (the clock records the op's stretches)
      model.use_slot(k % model.slots());
      if (op.forward) {
        run.phase("forward");
        wait_waiting(comm, clock, output_sent[k % model.slots()]);  // the slot's output has left
        run.load_micro_batch(step, k);
        if (!first)  // my input: the previous segment's output for micro-batch k
          recv_waiting(comm, clock, model.segment_input(), act_elems, dt, prev, kActivation);
        for (int u = u0; u < u1; u++) model.forward(u, P(u));
        if (last) model.head_forward(head_weights);  // adds the batch loss to the step total
        else output_sent[k % model.slots()] =
                 comm.send_start(model.segment_output(), act_elems, dt, next, kActivation);
        continue;
      }
      run.phase("backward");
      const bool last_micro_batch = k == K - 1;
      wait_waiting(comm, clock, grad_sent);  // the activation gradient's buffer is free again
      if (last)
        model.head_backward(head_weights);
      else  // d loss / d (my output) for micro-batch k, from the next segment
        recv_waiting(comm, clock, model.activation_grad(), act_elems, dt, next, kActivationGrad);
      for (int u = u1 - 1; u >= u0; u--) {
        if (u == EMBED && !last) {
          // ---- tied weights cross the pipeline: the head's d wte of micro-batch k arrives
          // from the last segment; backward(EMBED) adds the lookup's as stage0_ddp adds them ----
          recv_waiting(comm, clock, unit_grad.data(), wte_elems, dt, last_rank, kHeadGrad);
          fill_zero(elem_ptr(unit_grad, wte_elems, e), (numel(EMBED) - wte_elems) * e,
                    Location::Device);
        }
        model.backward(u, P(u), unit_grad.data());
        accumulate_grads(dt, G(u), unit_grad.data(), numel(u), 1.0f, k == 0);  // no communication
        if (last_micro_batch) {  // unit u's gradient is complete on my segment: synchronise once
          // all-reduce over my replicas (ZeRO-1: a reduce-scatter, my slice's sum)
          if (zero1) replicas.reduce_scatter(G(u), my_G(u), owned(u).size(), dt);
          else replicas.all_reduce(G(u), numel(u), dt);
          average_grads(dt, my_G(u), owned(u).size(), run.grad_average_scale());
        }
      }
      // my input's gradient, to the previous segment
      if (!first) grad_sent = comm.send_start(model.activation_grad(), act_elems, dt, prev,
                                              kActivationGrad);
      if (tied_across) {  // the head's part of the tied gradient, to the first segment
        wait_waiting(comm, clock, head_grad_sent);
        model.head_weight_backward(head_grad.data());
        head_grad_sent = comm.send_start(head_grad.data(), wte_elems, dt, first_rank, kHeadGrad);
      }
    }
    for (CommRequest& r : output_sent) wait_waiting(comm, clock, r);
    wait_waiting(comm, clock, grad_sent);
    wait_waiting(comm, clock, head_grad_sent);
    clock.stop();
    run.phase("optimizer");
    // global gradient norm, summed in stage0_ddp's order: every segment its units' partials
    // (replica 0's: the replicas hold the same gradients; --zero 1: slice d's from replica d),
    // exact zeros for the rest, one rank-ordered sum (fp16: stored scaled)
    std::vector<double> sq = sq_sums_of_units(L, dt, grads.data(), u0, u1);
    const size_t U = L.num_units();
    for (int r = 0; r < L.world; r++)  // row r: slice r of every unit
      if (zero1 ? r != d : d != 0) std::fill(sq.begin() + r * U, sq.begin() + (r + 1) * U, 0.0);
    comm.sum_scalars(sq.data(), int(sq.size()));
    const double norm = std::sqrt(sq_sum_of_table(L, sq)) / run.loss_scale();
    const double loss_sum = model.take_loss_sum();  // the last segment's; 0 on the others
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    // every segment updates its own units
    for (int u = u0; u < u1; u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());
      if (zero1) replicas.all_gather(my_P(u), P(u), owned(u).size(), dt);  // every replica's slice
    }
    send_tied_weights();  // tied weights cross the pipeline: the updated wte back to the head
    run.end_step(step, loss_sum, norm);
  }

  // the bubble: each rank's share of the schedule spent waiting, beside the equal-segments formula
  run.hooks.report_key = "pipeline";
  run.hooks.report_json = report_bubble(comm, pipe, K, clock);
  run.finish();
  return 0;
}
