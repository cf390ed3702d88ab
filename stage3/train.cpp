// stage3 — ZeRO stage 3 (P_os+g+p): shard the parameters too.
//
// Idea:  my slice of the parameters only: a unit is all-gathered just before it runs, released
//        after, gathered again for its backward (the tied embedding also for the LM head); with
//        --prefetch 1 the next gather starts before this unit computes. Gathers per micro-step:
//        embed, blocks 1..L, lnf, embed (LM head), lnf, blocks L..1.
// Holds: params eS, grads eS + one bucket eU, Adam m + v 8S (+ master 4S), ≤ 2 gathered units.
// Sends: per micro-step 2P gathered + P reduce-scattered: 3K(N-1)S elements per rank per step.
// Docs:  README.md (the ladder); docs/stages.md (units, slices, the contract); docs/memory.md.
#include <cmath>      // std::sqrt

#include "kernels/ops.h"  // kernels on the run's backend
#include "muon.h"  // StageOptimizer: AdamW, or Muon for the blocks' matrices (--optimizer muon)
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Z3);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int LNF = L.lnf_unit();
  const int rank = run.rank();
  GPT& model = *run.model;
  Comm& comm = run.comm;

  // ---- model state: params (P_p), gradients and optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.shard_total * e, "params (my slices)");
  Buffer grads(Category::Grads, Location::Device, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  // my slice of unit u, packed in the sharded parameter and gradient buffers
  auto my_P = [&](int u) { return elem_ptr(params, L.units[u].shard_offset, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  StageOptimizer adam(run, owned_shards(L, rank));  // P_os: m, v for my slices only
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.shard(u, rank), my_P(u));  // P_p: only my slice is ever initialised
    adam.init_master(u, my_P(u));
  }

  // ---- gather and release: a unit's full parameters exist only while it is in use ----
  std::vector<Buffer> gathered(L.num_units());        // unit u's full params (ledger: gathered)
  std::vector<CommRequest> in_flight(L.num_units());  // unit u's all-gather, until waited for
  // begin exercise: stage3_gather_release
  // all-gather, started: every rank's slice of unit u, into a fresh buffer of the unit's size
  auto gather_start = [&](int u) {
    const Unit& unit = L.units[u];
    gathered[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e,
                         "gathered " + unit.name);
    in_flight[u] = comm.all_gather_start(my_P(u), gathered[u].data(), owned(u), dt);
  };
  // unit u's full parameters: gathered now, or the prefetch already started is waited for
  auto gather_unit = [&](int u) -> const void* {
    if (gathered[u].empty()) gather_start(u);
    comm.wait(in_flight[u]);
    return gathered[u].data();
  };
  // prefetch: start the next unit's all-gather before this unit computes, so the two overlap
  auto prefetch = [&](int u) { if (run.args.prefetch) gather_start(u); };
  auto release_unit = [&](int u) { gathered[u].release(); };  // release: only my slice stays
  // end exercise: stage3_gather_release
  // The prefetch order: the unit a micro-step needs after unit u (FSDP2 records it in its first
  // forward; here it is written down). Forward: embed, blocks, lnf, then the embedding again for
  // the LM head. Backward: lnf down to block 0; the embedding's backward needs no parameters.
  auto prefetch_after_forward = [&](int u) { prefetch(u < LNF ? u + 1 : EMBED); };
  auto prefetch_after_backward = [&](int u) { if (u - 1 > EMBED) prefetch(u - 1); };
  run.unit_access = UnitAccess{gather_unit, release_unit};  // validation, model file: unit by unit
  // checkpoints hold what this rank holds; --resume restores it here (checkpoint.h)
  run.checkpoint_state(params, ParamsHeld::OwnSlices, adam);

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) {
        const void* p = gather_unit(u);       // all-gather: unit u, just before it runs
        prefetch_after_forward(u);            // prefetch: the next unit (after lnf, the LM head's)
        model.forward(u, p);
        release_unit(u);                      // release: unit u, until it is needed again
      }
      const void* wte = gather_unit(EMBED);   // all-gather: the embedding again, for the LM head
      prefetch(LNF);                          // prefetch: the first unit of the backward
      model.head_forward(wte);  // adds the batch loss to the step total, on the device
      run.phase("backward");
      model.head_backward(wte);
      release_unit(EMBED);                    // release: the LM head is done with the embedding
      for (int u = L.num_units() - 1; u >= 0; u--) {
        // begin exercise: stage3_backward
        // all-gather: unit u again for its backward; the embedding's backward needs no parameters
        const void* p = u == EMBED ? nullptr : gather_unit(u);
        prefetch_after_backward(u);           // prefetch: the next unit of the backward
        model.backward(u, p, bucket.data());
        release_unit(u);                      // release: unit u, until the next forward
        // reduce-scatter, every micro-step: each rank receives only the summed gradient of the
        // slice it owns; the embedding's comes last, once: the LM head's part and the lookups'
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);
        // end exercise: stage3_backward
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
      // no all-gather here: the next forward gathers each unit just before it needs it (P_p)
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
