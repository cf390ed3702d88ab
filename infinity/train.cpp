// infinity — ZeRO-Infinity: stage3 with the parameter slices off the device too (host or disk).
//
// Idea:  stage3, but my slices live off the device: before a unit's all-gather my slice of it
//        comes up from the host (ParamSlices: host memory, or a file read ahead), the reduced
//        gradient slice goes down after the reduce-scatter, and the host AdamW (offload's)
//        updates the master and writes the new parameter slice back. Device: gathered units only.
// Holds: device: ≤ 2 gathered units, the bucket eU; host (or disk, --offload-param disk):
//        params eS, grads eS (host), master 4S (in fp32 too), Adam m + v 8S.
// Sends: stage3's 3K(N-1)S, plus per step 2KS elements up (my slices) and KS down (grad slices).
// Docs:  README.md (the ladder); docs/infinity.md; docs/stages.md (units, slices, the contract).
#include <cmath>      // std::sqrt

#include "kernels/ops.h"  // kernels on the run's backend
#include "offload/host_adamw.h"  // HostAdamW: offload's (infinity = stage3 + offload)
#include "infinity/param_store.h"  // ParamSlices: my parameter slices in host memory or in a file
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Infinity);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int LNF = L.lnf_unit();
  const int rank = run.rank();
  GPT& model = *run.model;
  Comm& comm = run.comm;

  // ---- model state: my slices only, and none of them on the device ----
  // infinity: my parameter slices in host memory or in a file; the gradient slices on the host
  const Location state_at = run.args.offload_param == "disk" ? Location::Disk : Location::Host;
  ParamSlices params(L, rank, dt, state_at, run.args.offload_dir, comm, run.args.prefetch);
  Buffer grads(Category::Grads, Location::Host, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  Buffer landing(Category::Scratch, Location::Host, L.max_unit_padded / L.world * e,
                 "grad slice landing");  // infinity: a reduced slice lands here before it is added
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  // infinity: host<->device copies of my slices, counted in the comm ledger's link counters
  auto to_host = [&](void* dst, const void* src, size_t elems) {
    copy_bytes_async(dst, Location::Host, src, Location::Device, elems * e);
    copy_wait();
    comm.count_to_host(elems, elems * e);
  };
  auto to_device = [&](void* dst, const void* src, size_t elems) {
    copy_bytes_async(dst, Location::Device, src, Location::Host, elems * e);
    copy_wait();  // the slice's host memory may be read into again by the next fetch
    comm.count_to_device(elems, elems * e);
  };
  // infinity: the host AdamW writes my updated slice over my spent gradient slice, and from there
  // it is written back where the slices live (offload's outbox, with no device at the end)
  auto outbox = [&](int u) { return my_G(u); };
  // master, m, v for my slices on the host (or on disk, beside the parameter file); CPU AdamW
  HostAdamW adam(L, owned_shards(L, rank), dt, state_at, run.adamw,
                 offload_config(run.args, comm));
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.shard(u, rank), outbox(u), Location::Host);  // P_p: only my slice
    adam.init_master(u, outbox(u));
    params.write_back(u, outbox(u));
  }

  // ---- gather and release: a unit's full parameters exist only while it is in use ----
  std::vector<Buffer> gathered(L.num_units());        // unit u's full params (ledger: gathered)
  std::vector<CommRequest> in_flight(L.num_units());  // unit u's all-gather, until waited for
  // all-gather, started: my slice of unit u comes up from the host into its place in a fresh
  // buffer of the unit's size, and the all-gather brings every other rank's around it
  auto gather_start = [&](int u) {
    const Unit& unit = L.units[u];
    gathered[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e,
                         "gathered " + unit.name);
    void* mine = elem_ptr(gathered[u], L.shard(u, rank).begin, e);
    // begin exercise: infinity_fetch_write_back
    to_device(mine, params.fetch(u), owned(u));  // infinity: my slice up, just before the gather
    in_flight[u] = comm.all_gather_start(mine, gathered[u].data(), owned(u), dt);
    // end exercise: infinity_fetch_write_back
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
  // The prefetch order: the unit a micro-step needs after unit u (FSDP2 records it in its first
  // forward; here it is written down). Forward: embed, blocks, lnf, then the embedding again for
  // the LM head. Backward: lnf down to block 0; the embedding's backward needs no parameters.
  auto prefetch_after_forward = [&](int u) { prefetch(u < LNF ? u + 1 : EMBED); };
  auto prefetch_after_backward = [&](int u) { if (u - 1 > EMBED) prefetch(u - 1); };
  run.unit_access = UnitAccess{gather_unit, release_unit};  // validation, model file: unit by unit
  // checkpoints hold what this rank holds; --resume restores it here (checkpoint.h)
  run.checkpoint_state(params, adam);

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
        // all-gather: unit u again for its backward; the embedding's backward needs no parameters
        const void* p = u == EMBED ? nullptr : gather_unit(u);
        prefetch_after_backward(u);           // prefetch: the next unit of the backward
        model.backward(u, p, bucket.data());
        release_unit(u);                      // release: unit u, until the next forward
        // reduce-scatter, every micro-step: each rank receives only the summed gradient of the
        // slice it owns; the embedding's comes last, once: the LM head's part and the lookups'
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        // infinity: my reduced slice goes down to the host and is accumulated there
        to_host(landing.data(), mine, owned(u));
        accumulate_grads(dt, my_G(u), landing.data(), owned(u), run.grad_average_scale(), k == 0,
                         Location::Host);
      }
    }
    run.phase("optimizer");
    // global gradient norm: each rank sums its slices, then one rank-ordered sum of the partials
    double sq = sq_sum_of_shard(L, dt, grads.data(), Location::Host);  // (infinity: on the host)
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();  // fp16: the gradients are stored scaled
    const double loss_sum = model.take_loss_sum();  // the micro-steps' summed token losses
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) {
      // infinity: AdamW on the CPU for my slice, and the new slice written back where it lives
      // begin exercise: infinity_fetch_write_back
      adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());
      params.write_back(u, outbox(u));
      // end exercise: infinity_fetch_write_back
      // no all-gather here: the next forward gathers each unit just before it needs it (P_p)
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
