// offload — ZeRO-Offload: stage2 on the device, the optimizer's memory and work on the host.
//
// Idea:  stage2, the optimizer on the host: per micro-step my reduced slice goes down and is
//        summed there; per step the CPU runs AdamW (HostAdamW, bitwise the device's) and my slice
//        goes up before the all-gather. --offload-to disk: master, m, v on disk (offload_store.h).
// Holds: device: params eP, bucket eU; host: grads eS, master 4S (in fp32 too), Adam m + v 8S.
// Sends: per step: stage2's collectives, plus K·S elements down and S up (2S at K = 1).
// Docs:  README.md (the ladder); docs/stages.md (units, slices, the contract); docs/memory.md.
#include <cmath>      // std::sqrt

#include "kernels/ops.h"  // kernels on the run's backend
#include "offload/host_adamw.h"  // HostAdamW: AdamW on the host, its state in memory or files
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Offload);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int rank = run.rank();
  GPT& model = *run.model;
  Comm& comm = run.comm;

  // ---- model state: full params; gradients and optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params");
  Buffer grads(Category::Grads, Location::Host, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  Buffer landing(Category::Scratch, Location::Host, L.max_unit_padded / L.world * e,
                 "grad slice landing");  // offload: where a reduced slice lands before it is added
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };  // unit u's parameters
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  // my slice of unit u: in the full parameter buffer, and packed in the sharded gradient buffer
  auto my_P = [&](int u) {
    return elem_ptr(params, L.units[u].offset + L.shard(u, rank).begin, e);
  };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  // offload: host<->device copies of my slices, counted in the comm ledger's link counters. The
  // host waits for what comes down (it reads it next); what goes up travels while the CPU works.
  auto to_host = [&](void* dst, const void* src, size_t elems) {
    copy_bytes_async(dst, Location::Host, src, Location::Device, elems * e);
    copy_wait();
    comm.count_to_host(elems, elems * e);
  };
  auto to_device = [&](void* dst, const void* src, size_t elems) {
    copy_bytes_async(dst, Location::Device, src, Location::Host, elems * e);
    comm.count_to_device(elems, elems * e);
  };
  // offload: the host AdamW writes my updated slice over my spent gradient slice (each element is
  // read before it is written): the gradient buffer is also the outbox copied up, no second eS
  auto outbox = [&](int u) { return my_G(u); };
  // offload: master, m, v for my slices on the host (or on disk); AdamW runs on the CPU
  const Location state_at = run.args.offload_to == "disk" ? Location::Disk : Location::Host;
  HostAdamW adam(L, owned_shards(L, rank), dt, state_at, run.adamw,
                 offload_config(run.args, comm));
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    to_host(outbox(u), my_P(u), owned(u));  // offload: the master starts as my slice, copied down
    adam.init_master(u, outbox(u));
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
        // reduce-scatter, every micro-step: each rank receives only the summed gradient of the
        // slice it owns; the rest of the unit's gradient dies with the bucket's next use (P_g)
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        // offload: my reduced slice goes down to the host and is accumulated there
        to_host(landing.data(), mine, owned(u));
        accumulate_grads(dt, my_G(u), landing.data(), owned(u), run.grad_average_scale(), k == 0,
                         Location::Host);
      }
    }
    run.phase("optimizer");
    // global gradient norm: each rank sums its slices, then one rank-ordered sum of the partials
    double sq = sq_sum_of_shard(L, dt, grads.data(), Location::Host);  // (offload: on the host)
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();  // fp16: the gradients are stored scaled
    const double loss_sum = model.take_loss_sum();  // the micro-steps' summed token losses
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) {
      // begin exercise: offload_optimizer
      // offload: AdamW on the CPU for my slice; its copy up overlaps the next unit's update
      adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());
      to_device(my_P(u), outbox(u), owned(u));
      // end exercise: offload_optimizer
    }
    copy_wait();  // offload: every updated slice is on the device
    for (int u = 0; u < L.num_units(); u++) {
      // all-gather: every rank receives every rank's updated slice, so all hold the full model
      comm.all_gather(my_P(u), P(u), owned(u), dt);
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
