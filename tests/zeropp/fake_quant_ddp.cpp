// fake_quant_ddp.cpp — the reference ZeRO++ is held to, bit for bit: plain data parallelism
// (stage0_ddp's full replicas) with ZeRO++'s quantization done in place, "fake-quant":
//   --qwz  before each step's forward and backward, every unit's parameters are quantized to int8
//          and dequantized again, in blocks counted from the unit's start (kernels/quantize.h);
//          the optimizer updates the exact parameters;
//   --qgz  every rank's gradient of a unit is quantized to int4 and dequantized again, block by
//          block, and the N results are added in rank order in fp32 (--qgz-flat; and one node, or
//          nodes of one rank); with M = N/G nodes of G > 1 ranks, qgZ's two hops: node k's sum
//              node_k = sum over l = 0..G-1 of dq(q(g[k G + l]))     (fp32, left to right)
//          is quantized to int4 again (from fp32), and the M results are added in node order:
//              sum over k = 0..M-1 of dq(q(node_k))                  (fp32, left to right);
//   --hpz  moves no number: ignored here.
// It runs on the layout zeropp runs on (Stage::ZeroPP: units padded to N x block), reduces every
// micro-step as stage2 and stage3 do, and shares nothing with zeropp/train.cpp but common/.
// Built by tests/zeropp/zeropp.mk into $(BUILD)/mutants/bin/zeropp_reference (a test-only trainer).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "trainer.h"
#include "zeropp/hooks.h"  // set_zeropp_hooks, zeropp_config

using namespace nz;

// x (n values of dt) -> dequantize(quantize(x)) in fp32, in blocks of q counted from x[0]
static void fake_quant_f32(const BlockQuant& q, DType dt, const void* x, size_t n, float* out) {
  std::vector<uint8_t> packed(q.packed_bytes(n));
  quantize_packed(q, dt, x, n, packed.data());
  dequantize_packed(q, packed.data(), n, DType::F32, out);
}

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::ZeroPP, nullptr, set_zeropp_hooks);  // + its flags, bytes, report
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int N = run.world();
  GPT& model = *run.model;
  Comm& comm = run.comm;
  const ZeroppConfig z = zeropp_config(run.args, run.comm);
  const BlockQuant qw{8, z.qw_block}, qg{4, z.qg_block};

  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params");
  Buffer seen(Category::Scratch, Location::Device, L.padded_total * e, "params as the model sees them");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e, "grads");
  Buffer unit_grad(Category::Grads, Location::Device, L.max_unit_padded * e, "one unit's gradient");
  Buffer every_rank(Category::Scratch, Location::Device, N * L.max_unit_padded * e, "every rank's unit gradient");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };
  auto V = [&](int u) { return elem_ptr(seen, L.units[u].offset, e); };
  auto Gr = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };
  AdamW adam(L, whole_units(L), dt, run.adamw);
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, P(u));
  }
  run.unit_access = UnitAccess{[&](int u) -> const void* { return P(u); }};
  run.checkpoint_state(params, ParamsHeld::AllUnits, adam);
  std::vector<float> f32(L.max_unit_padded), sum(L.max_unit_padded), node(L.max_unit_padded);
  // qgZ's two hops: nodes of G consecutive ranks, when there are several nodes of several ranks
  const int G = z.node_size;
  const bool two_hops = !z.qgz_flat && G > 1 && G < N;

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int u = 0; u < L.num_units(); u++) {  // the parameters this step computes with
      const size_t n = L.units[u].padded;
      if (z.qwz) {
        fake_quant_f32(qw, dt, P(u), n, f32.data());
        from_f32(dt, f32.data(), n, V(u));
      } else {
        memcpy(V(u), P(u), n * e);
      }
    }
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);
      for (int u = 0; u < L.num_units(); u++) model.forward(u, V(u));
      model.head_forward(V(EMBED));
      model.head_backward(V(EMBED));
      for (int u = L.num_units() - 1; u >= 0; u--) {
        const size_t n = L.units[u].padded;
        model.backward(u, V(u), unit_grad.data());
        if (z.qgz && two_hops) {  // each node's sum of its ranks' int4 gradients, in int4 again, summed
          comm.all_gather(unit_grad.data(), every_rank.data(), n, dt);
          for (int k = 0; k < N / G; k++) {
            for (int l = 0; l < G; l++) {
              fake_quant_f32(qg, dt, elem_ptr(every_rank, (k * G + l) * n, e), n, f32.data());
              for (size_t i = 0; i < n; i++) node[i] = l == 0 ? f32[i] : node[i] + f32[i];
            }
            fake_quant_f32(qg, DType::F32, node.data(), n, f32.data());
            for (size_t i = 0; i < n; i++) sum[i] = k == 0 ? f32[i] : sum[i] + f32[i];
          }
          from_f32(dt, sum.data(), n, unit_grad.data());
        } else if (z.qgz) {  // every rank's gradient, quantized and dequantized, added in rank order in fp32
          comm.all_gather(unit_grad.data(), every_rank.data(), n, dt);
          for (int r = 0; r < N; r++) {
            fake_quant_f32(qg, dt, elem_ptr(every_rank, r * n, e), n, f32.data());
            for (size_t i = 0; i < n; i++) sum[i] = r == 0 ? f32[i] : sum[i] + f32[i];
          }
          from_f32(dt, sum.data(), n, unit_grad.data());
        } else {
          comm.all_reduce(unit_grad.data(), n, dt);  // the rank-ordered sum
        }
        accumulate_grads(dt, Gr(u), unit_grad.data(), n, run.grad_average_scale(), k == 0);
      }
    }
    const double norm = std::sqrt(sq_sum_in_rank_order(L, dt, grads.data())) / run.loss_scale();
    const double loss_sum = model.take_loss_sum();
    if (run.skip_step(step, loss_sum, norm)) continue;
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) adam.step(u, P(u), Gr(u), run.lr(), scale, run.adam_step());
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
